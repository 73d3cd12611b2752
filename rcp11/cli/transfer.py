"""rcp11 produce and rcp11 consume: stdin lines into a stream, a stream's
messages onto stdout, with a progress line on stderr for long runs."""

from __future__ import annotations

import argparse
import select
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO, TextIO

import redis

from rcp11.cli.acked import consume_acked
from rcp11.client import Client, ReadResult

PROG = "rcp11"

# produce: stdin is read in chunks of at most this size; all complete lines of
# a chunk go out in one pipeline of TWRITEs. The chunk size, not the batch
# size, bounds how much one round trip carries, so large batches are safe.
MAX_CHUNK = 1 << 20
DEFAULT_PRODUCE_BATCH = 1000
DEFAULT_CONSUME_BATCH = 1000
PROGRESS_INTERVAL_S = 1.0


def plural(count: int, noun: str = "message") -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# ---------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------


class Progress:
    """Counts messages and reports the running rate at most once per interval.

    On a terminal the report rewrites one line (carriage return); when forced
    onto a pipe or file each report is its own line.
    """

    def __init__(
        self,
        verb: str,
        stream: TextIO,
        enabled: bool,
        interval: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.verb = verb
        self.stream = stream
        self.enabled = enabled
        self.interval = interval
        self.clock = clock
        self.total = 0
        self.started = clock()
        self._last_time = self.started
        self._last_total = 0
        self._reported = False
        self._rewrite = enabled and isatty(stream)

    def add(self, messages: int) -> None:
        self.total += messages
        if not self.enabled:
            return
        now = self.clock()
        elapsed = now - self._last_time
        if elapsed < self.interval:
            return
        rate = (self.total - self._last_total) / elapsed
        self._emit(f"{self.verb}: {self.total:,} messages, {rate:,.0f} msg/s")
        self._last_time = now
        self._last_total = self.total

    def finish(self) -> None:
        """Close the progress line with the average rate, if anything was shown."""
        if not self._reported:
            return
        elapsed = max(self.clock() - self.started, 1e-9)
        self._emit(
            f"{self.verb}: {self.total:,} messages in {elapsed:.1f} s, "
            f"{self.total / elapsed:,.0f} msg/s average"
        )
        if self._rewrite:
            self.stream.write("\n")
        self.stream.flush()

    def _emit(self, text: str) -> None:
        if self._rewrite:
            # \x1b[K clears what a longer previous report left on the line.
            self.stream.write(f"\r{text}\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._reported = True


def isatty(stream: object) -> bool:
    call = getattr(stream, "isatty", None)
    return bool(call and call())


# ---------------------------------------------------------------------------
# produce
# ---------------------------------------------------------------------------


def read_chunks(stream: BinaryIO, max_chunk: int = MAX_CHUNK) -> Iterator[bytes]:
    """Yield what stdin has, as soon as it has it, in chunks up to ``max_chunk``.

    A chunk ends when the input has nothing more ready, so a slow producer
    (``tail -f``) gets each line sent at once while a fast one (a file, a
    pipe from ``seq``) is sent in large pipelined batches.
    """
    read1 = getattr(stream, "read1", stream.read)
    try:
        fd: int | None = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None  # BytesIO and friends: always "ready"
    while True:
        data = read1(max_chunk)
        if not data:
            return
        parts = [data]
        size = len(data)
        while size < max_chunk and (fd is None or _ready(fd)):
            more = read1(max_chunk - size)
            if not more:
                break
            parts.append(more)
            size += len(more)
        yield b"".join(parts)


def _ready(fd: int) -> bool:
    try:
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def split_messages(chunks: Iterator[bytes], separator: bytes) -> Iterator[list[bytes]]:
    """Group chunks into lists of complete messages; a last unterminated line counts."""
    pending = b""
    for chunk in chunks:
        parts = (pending + chunk).split(separator)
        pending = parts.pop()
        if parts:
            yield parts
    if pending:
        yield [pending]


def produce(args: argparse.Namespace, client: Client, stdin: BinaryIO, stderr: TextIO) -> int:
    separator = b"\0" if args.null else b"\n"
    # Someone typing lines at a terminal does not want a rate report in between.
    progress = Progress("produce", stderr, args.progress or (isatty(stderr) and not isatty(stdin)))
    first: int | None = None
    last: int | None = None

    def written() -> str:
        return f"{plural(progress.total)} written to '{args.key}', offsets {first}..{last}"

    try:
        for messages in split_messages(read_chunks(stdin), separator):
            pipe = client.pipeline(transaction=False)
            batches = [messages[i : i + args.batch] for i in range(0, len(messages), args.batch)]
            for batch in batches:
                pipe.twrite(args.key, *batch, backlog=args.backlog)
            offsets = pipe.execute()
            if first is None:
                first = offsets[0]
            last = offsets[-1] + len(batches[-1]) - 1
            progress.add(len(messages))
    except redis.exceptions.RedisError:
        progress.finish()
        if first is not None:  # what did get in, before the error is explained
            stderr.write(f"{PROG} produce: {written()}, then:\n")
        raise
    progress.finish()
    if not args.quiet:
        if first is None:
            stderr.write(f"{PROG} produce: no input, nothing written to '{args.key}'\n")
        else:
            stderr.write(f"{PROG} produce: {written()}\n")
    return 0


# ---------------------------------------------------------------------------
# consume
# ---------------------------------------------------------------------------


def consume(args: argparse.Namespace, client: Client, stdout: BinaryIO, stderr: TextIO) -> int:
    separator = b"\0" if args.null else b"\n"
    block: int | None = 0 if args.follow else args.block
    group_option = {"group": args.group} if args.group else {"groupnew": args.groupnew}
    offset = _start_offset(args, client)
    remaining = args.count
    # Messages shown on the terminal itself would be garbled by a progress line.
    progress = Progress("consume", stderr, args.progress or (isatty(stderr) and not isatty(stdout)))
    if args.ack:
        try:
            return consume_acked(
                args,
                client,
                stdout,
                lambda result: _format_messages(result, separator, args.offsets),
                progress,
            )
        finally:
            progress.finish()
    try:
        while remaining is None or remaining > 0:
            want = args.batch if remaining is None else min(args.batch, remaining)
            # NONULLS: evicted offsets and the gap a crash may leave are
            # stepped over in one request, not read as pages of nulls.
            reading = {"withinfo": True, "nonulls": True, "withtimes": args.times}
            if args.group or args.groupnew:
                result = client.tread(args.key, 0, want, block=block, **reading, **group_option)
            else:
                result = client.tread(args.key, offset, want, block=block, **reading)
            if result is None or result.count == 0:
                break  # a --block wait ran out, or caught up without blocking
            data, shown = _format_messages(result, separator, args.offsets, args.times)
            stdout.write(data)
            stdout.flush()
            progress.add(shown)
            if remaining is not None:
                remaining -= shown
            offset = result.end
    finally:
        progress.finish()
    return 0


def _start_offset(args: argparse.Namespace, client: Client) -> int:
    """Where a read without a group starts: --from (a number, or the
    stream's beginning or end), --since, or 0."""
    if args.since is not None:
        # The first message appended at or after that time, exactly
        # (docs/PROTOCOL.md section 6).
        return int(client.execute_command("TSEEK", args.key, args.since.resolve()))
    if args.from_offset == "end":
        return client.tread(args.key, 0, 0, withinfo=True).next_offset
    if args.from_offset in (None, "beginning"):
        return 0  # evicted offsets are skipped: 0 is the oldest readable
    return int(args.from_offset)


def _format_messages(
    result: ReadResult, separator: bytes, offsets: bool, times: bool = False
) -> tuple[bytes, int]:
    """The messages of a read as written to stdout, and how many."""
    shown = 0
    chunks: list[bytes] = []
    items = result.timed_items() if times else ((o, 0, m) for o, m in result.items())
    for offset, stamp, message in items:
        if offsets:
            chunks.append(b"%d\t" % offset)
        if times:
            chunks.append(b"%d\t" % stamp)
        chunks.append(message)
        chunks.append(separator)
        shown += 1
    return b"".join(chunks), shown
