"""rcp11 command line: produce from stdin, consume to stdout, inspect, evict.

    seq 1 1000000 | rcp11 produce events          # one message per line
    rcp11 consume events --from -10               # the last ten, then exit
    rcp11 consume events --group events:g --follow | ./worker
    rcp11 consume events --since 10m              # appended in the last ten minutes
    rcp11 consume events --times --offsets        # OFFSET<TAB>UNIX-MS<TAB>MESSAGE
    rcp11 info events
    rcp11 evict events 499

Connection options are redis-cli's: -h HOST -p PORT -a PASSWORD, or -u URL.
Long runs report progress (messages and messages/s) on stderr about once a
second when stderr is a terminal and the data side (stdin for produce, stdout
for consume) is not, or always with --progress.

Exit status: 0 success, 1 an error (explained on stderr), 2 bad usage,
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO, TextIO

import redis

from rcp11 import __version__
from rcp11.client import Client, ReadResult
from rcp11.stdio import silence_stdout

PROG = "rcp11"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6379

# produce: stdin is read in chunks of at most this size; all complete lines of
# a chunk go out in one pipeline of TWRITEs. The chunk size, not the batch
# size, bounds how much one round trip carries, so large batches are safe.
MAX_CHUNK = 1 << 20
DEFAULT_PRODUCE_BATCH = 1000
DEFAULT_CONSUME_BATCH = 1000
PROGRESS_INTERVAL_S = 1.0


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
        self._rewrite = enabled and _isatty(stream)

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


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


# ---------------------------------------------------------------------------
# Connection
# ---------------------------------------------------------------------------


def _where(args: argparse.Namespace) -> str:
    if args.url:
        return args.url.split("@")[-1]
    return f"{args.host}:{args.port}"


def connect(args: argparse.Namespace) -> Client:
    """A Client for the connection options; fails early with advice when unreachable."""
    password = args.password if args.password is not None else os.environ.get("REDISCLI_AUTH")
    if args.url:
        kwargs: dict[str, object] = {}
        if password is not None:
            kwargs["password"] = password
        client = Client.from_url(args.url, **kwargs)
    else:
        client = Client(host=args.host, port=args.port, username=args.user, password=password)
    client.ping()
    return client


def _explain(
    exc: redis.exceptions.RedisError, args: argparse.Namespace, connected: bool = False
) -> str:
    where = _where(args)
    text = str(exc)
    if isinstance(exc, redis.exceptions.AuthenticationError) or text.startswith(
        ("NOAUTH", "WRONGPASS", "invalid password", "invalid username-password")
    ):
        if args.password is None and not os.environ.get("REDISCLI_AUTH"):
            return (
                f"the server at {where} requires a password ({text}); "
                "pass it with -a PASSWORD or set REDISCLI_AUTH"
            )
        return f"the server at {where} refused the password ({text}); check -a / REDISCLI_AUTH"
    if isinstance(exc, redis.exceptions.ConnectionError) and connected:
        return f"lost the connection to {where}: {text} (did the server stop or restart?)"
    if isinstance(exc, redis.exceptions.ConnectionError):
        port = args.port if not args.url else "PORT"
        return (
            f"cannot connect to {where}: {text}\n"
            f"Is rcp11-server running? Start it with: rcp11-server redis.conf "
            f"(or: python -m rcp11 server --port {port}), or point -h/-p/-u at it."
        )
    if isinstance(exc, redis.exceptions.TimeoutError):
        return f"the server at {where} did not answer in time: {text}"
    if "unknown command" in text and any(
        name in text.upper() for name in ("'TWRITE'", "'TREAD'", "'TEVICT'")
    ):
        return (
            f"the server at {where} does not know the RCP 11 stream commands ({text}); "
            "it is not an rcp11 server (a plain redis-server?). Check -h/-p/-u."
        )
    if text.startswith("WRONGTYPE"):
        return (
            f"key '{args.key}' holds a string, not a stream ({text}); "
            "consumer group keys are strings: use another key name"
        )
    return f"server error: {text}"


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
    progress = Progress(
        "produce", stderr, args.progress or (_isatty(stderr) and not _isatty(stdin))
    )
    first: int | None = None
    last: int | None = None
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
    finally:
        progress.finish()
        if not args.quiet:
            if first is None:
                stderr.write(f"{PROG} produce: no input, nothing written to '{args.key}'\n")
            else:
                stderr.write(
                    f"{PROG} produce: {progress.total} messages written to '{args.key}', "
                    f"offsets {first}..{last}\n"
                )
    return 0


# ---------------------------------------------------------------------------
# consume
# ---------------------------------------------------------------------------


def consume(args: argparse.Namespace, client: Client, stdout: BinaryIO, stderr: TextIO) -> int:
    separator = b"\0" if args.null else b"\n"
    block: int | None = 0 if args.follow else args.block
    group_option = {"group": args.group} if args.group else {"groupnew": args.groupnew}
    offset = args.from_offset if args.from_offset is not None else 0
    if args.since is not None:
        # The first message appended at or after that time (docs/PROTOCOL.md
        # section 6).
        offset = int(client.execute_command("TSEEK", args.key, args.since.resolve()))
    reading = {"withinfo": True, "withtimes": args.times}
    remaining = args.count
    # Messages shown on the terminal itself would be garbled by a progress line.
    progress = Progress(
        "consume", stderr, args.progress or (_isatty(stderr) and not _isatty(stdout))
    )
    try:
        while remaining is None or remaining > 0:
            want = args.batch if remaining is None else min(args.batch, remaining)
            if args.group or args.groupnew:
                result = client.tread(args.key, 0, want, block=block, **reading, **group_option)
            else:
                result = client.tread(args.key, offset, want, block=block, **reading)
            if result is None or result.count == 0:
                break  # a --block wait ran out, or caught up without blocking
            written = _write_messages(result, stdout, separator, args.offsets, args.times)
            stdout.flush()
            progress.add(written)
            if remaining is not None:
                remaining -= written
            # Jump over an evicted stretch instead of reading it as nulls.
            offset = max(result.end, result.first_offset)
    finally:
        progress.finish()
    return 0


def _write_messages(
    result: ReadResult, out: BinaryIO, separator: bytes, offsets: bool, times: bool
) -> int:
    written = 0
    chunks: list[bytes] = []
    for index, message in enumerate(result.messages):
        if message is None:
            continue  # evicted
        if offsets:
            chunks.append(b"%d\t" % (result.start + index))
        if times:
            chunks.append(b"%d\t" % result.times[index])  # type: ignore[index]
        chunks.append(message)
        chunks.append(separator)
        written += 1
    out.write(b"".join(chunks))
    return written


# ---------------------------------------------------------------------------
# info / evict
# ---------------------------------------------------------------------------


def stream_info(client: Client, key: str) -> dict[str, int | str]:
    info = client.tread(key, 0, 0, withinfo=True)
    return {
        "key": key,
        "first_offset": info.first_offset,
        "last_offset": info.last_offset,
        "next_offset": info.next_offset,
        "length": info.length,
    }


def info(args: argparse.Namespace, client: Client, stdout: TextIO) -> int:
    fields = stream_info(client, args.key)
    if args.json:
        stdout.write(json.dumps(fields) + "\n")
        return 0
    for name, value in fields.items():
        stdout.write(f"{name}: {value}\n")
    if fields["last_offset"] == -1:
        stdout.write("(never written: reads as an empty stream)\n")
    return 0


def _plural(count: int) -> str:
    return f"{count} message" if count == 1 else f"{count} messages"


def evict(args: argparse.Namespace, client: Client, stdout: TextIO) -> int:
    evicted = client.tevict(args.key, args.offset)
    after = client.tread(args.key, 0, 0, withinfo=True)
    stdout.write(
        f"evicted {_plural(evicted)} from '{args.key}'; "
        f"readable now: {after.first_offset}..{after.last_offset} ({_plural(after.length)})\n"
    )
    return 0


# ---------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_UNITS_MS["w"] = 7 * _DURATION_UNITS_MS["d"]
_DURATION = re.compile(r"(?:(\d+)(ms|s|m|h|d|w))+")
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")


@dataclass(frozen=True)
class Since:
    """--since: a moment (unix ms), or a duration before the moment the
    command runs (resolved then, not when the arguments were parsed)."""

    unix_ms: int | None = None
    ago_ms: int = 0

    def resolve(self, now_ms: int | None = None) -> int:
        if self.unix_ms is not None:
            return self.unix_ms
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return now - self.ago_ms


def parse_since(text: str) -> Since:
    """--since's WHEN: '10m', '1h30m', '500ms' (ago), '2026-11-23T21:00[:SS][Z|+HH:MM]'
    (local time without a zone), or unix milliseconds."""
    value = text.strip()
    if value.isdigit():
        return Since(unix_ms=int(value))
    if _DURATION.fullmatch(value):
        ago = sum(int(n) * _DURATION_UNITS_MS[unit] for n, unit in _DURATION_PART.findall(value))
        return Since(ago_ms=ago)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (10m, 2h, 1h30m), a date and time "
            "(2026-11-23T21:00) or unix milliseconds"
        ) from None
    return Since(unix_ms=round(moment.timestamp() * 1000))


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _add_connection_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    # The same options are accepted before and after the subcommand. After it
    # they default to SUPPRESS so they never overwrite what was given before.
    def default(value: object) -> object:
        return value if top_level else argparse.SUPPRESS

    group = parser.add_argument_group("connection (as redis-cli)")
    group.add_argument(
        "-h", "--host", default=default(DEFAULT_HOST), help=f"server host (default {DEFAULT_HOST})"
    )
    group.add_argument(
        "-p",
        "--port",
        type=int,
        default=default(DEFAULT_PORT),
        help=f"server port (default {DEFAULT_PORT})",
    )
    group.add_argument(
        "-a",
        "--password",
        default=default(None),
        help="password (AUTH); the REDISCLI_AUTH environment variable also works",
    )
    group.add_argument("--user", default=default(None), help="ACL user name for AUTH")
    group.add_argument(
        "-u",
        "--url",
        default=default(None),
        help="server URL redis://[user:password@]host[:port], instead of -h/-p/-a",
    )
    group.add_argument(
        "--progress",
        action="store_true",
        default=default(False),
        help="report progress on stderr even when it is not a terminal",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        add_help=False,
        description="Produce to and consume from rcp11 streams (RCP 11 logs over RESP).",
        epilog=(
            "Start a server with: rcp11 server [redis.conf] [--port N ...] (or rcp11-server). "
            "See '%(prog)s COMMAND --help' for each command."
        ),
    )
    parser.add_argument("--help", action="help", help="show this help and exit")
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__}", help="show the version"
    )
    _add_connection_options(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, add_help=False, help=help_text, description=description)
        sub.add_argument("--help", action="help", help="show this help and exit")
        _add_connection_options(sub, top_level=False)
        return sub

    p = add(
        "produce",
        "append stdin lines to a stream",
        "Append each line of stdin as one message to the stream KEY (TWRITE). Lines are "
        "sent as soon as they arrive; fast input goes in batches of --batch entries per "
        "TWRITE, pipelined. The offsets written are printed to stderr at the end.",
    )
    p.add_argument("key", metavar="KEY", help="stream key")
    p.add_argument(
        "--batch",
        type=_positive,
        default=DEFAULT_PRODUCE_BATCH,
        help=f"entries per TWRITE (default {DEFAULT_PRODUCE_BATCH})",
    )
    p.add_argument(
        "--backlog",
        type=_non_negative,
        default=None,
        help="keep only the newest N messages readable (TWRITE BACKLOG N)",
    )
    p.add_argument(
        "--null", action="store_true", help="messages end with NUL bytes instead of newlines"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the offsets written")

    c = add(
        "consume",
        "write a stream's messages to stdout",
        "Write the messages of stream KEY to stdout, one per line, starting at --from "
        "(or where consumer group --group left off, or the first message appended since "
        "--since), until caught up; --follow keeps "
        "waiting for new messages. Evicted offsets are skipped.",
    )
    c.add_argument("key", metavar="KEY", help="stream key")
    c.add_argument(
        "--from",
        dest="from_offset",
        type=int,
        default=None,
        metavar="OFFSET",
        help="first offset to read (default 0); negative -N starts N messages before the end",
    )
    c.add_argument(
        "--since",
        type=parse_since,
        default=None,
        metavar="WHEN",
        help="start at the first message appended at or after WHEN: a duration ago (90s, "
        "10m, 2h, 7d, 1h30m, 500ms), a date and time (2026-11-23T21:00, local time unless it "
        "ends in Z or +HH:MM) or unix milliseconds (1763931600000)",
    )
    groups = c.add_mutually_exclusive_group()
    groups.add_argument(
        "--group",
        metavar="GROUPKEY",
        help="consume as a member of the consumer group whose offset is in GROUPKEY "
        "(a new group starts at the oldest message)",
    )
    groups.add_argument(
        "--groupnew",
        metavar="GROUPKEY",
        help="like --group, but a new group starts with the next message written",
    )
    waits = c.add_mutually_exclusive_group()
    waits.add_argument(
        "-f", "--follow", action="store_true", help="when caught up, wait forever for more"
    )
    waits.add_argument(
        "--block",
        type=_non_negative,
        metavar="MS",
        default=None,
        help="when caught up, wait up to MS milliseconds for more, then exit",
    )
    c.add_argument("-n", "--count", type=_non_negative, default=None, help="stop after N messages")
    c.add_argument(
        "--batch",
        type=_positive,
        default=DEFAULT_CONSUME_BATCH,
        help=f"messages per TREAD (default {DEFAULT_CONSUME_BATCH})",
    )
    c.add_argument("--offsets", action="store_true", help="prefix each message with OFFSET<TAB>")
    c.add_argument(
        "--times",
        action="store_true",
        help="prefix each message with its append time in unix milliseconds and a TAB (after "
        "the offset with --offsets), as kcat's %%T or Kafka's print.timestamp",
    )
    c.add_argument(
        "--null", action="store_true", help="end messages with NUL bytes instead of newlines"
    )

    i = add(
        "info",
        "show a stream's offsets",
        "Show the first readable, last and next offsets of stream KEY and how many "
        "offsets lie between (TREAD KEY 0 0 WITHINFO).",
    )
    i.add_argument("key", metavar="KEY", help="stream key")
    i.add_argument("--json", action="store_true", help="print one JSON object")

    e = add(
        "evict",
        "drop old messages",
        "Make every message of KEY at or before OFFSET unreadable (TEVICT). A negative "
        "OFFSET -N keeps the newest N messages.",
    )
    e.add_argument("key", metavar="KEY", help="stream key")
    e.add_argument("offset", metavar="OFFSET", type=int, help="last offset to evict, or -N")
    return parser


def main(
    argv: list[str] | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "consume" and args.from_offset is not None and (args.group or args.groupnew):
        parser.error(
            "--from cannot be combined with --group/--groupnew: the group key holds the offset"
        )
    if args.command == "consume" and args.since is not None:
        if args.group or args.groupnew:
            parser.error(
                "--since cannot be combined with --group/--groupnew: the group key holds the offset"
            )
        if args.from_offset is not None:
            parser.error("--since and --from both say where to start: give one")
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout.buffer
    stderr = stderr if stderr is not None else sys.stderr
    client: Client | None = None
    try:
        client = connect(args)
        if args.command == "produce":
            return produce(args, client, stdin, stderr)
        if args.command == "consume":
            return consume(args, client, stdout, stderr)
        text_out = _text(stdout)
        if args.command == "info":
            return info(args, client, text_out)
        return evict(args, client, text_out)
    except redis.exceptions.RedisError as exc:
        stderr.write(f"{PROG} {args.command}: {_explain(exc, args, client is not None)}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`rcp11 consume k | head`): not an error.
        silence_stdout()
        return 0
    finally:
        if client is not None:
            client.close()


class _TextOut:
    """str writes onto a binary stream (stdout may be a BytesIO in tests)."""

    def __init__(self, binary: BinaryIO) -> None:
        self.binary = binary

    def write(self, text: str) -> int:
        return self.binary.write(text.encode())

    def flush(self) -> None:
        self.binary.flush()


def _text(binary: BinaryIO) -> TextIO:
    return _TextOut(binary)  # type: ignore[return-value]
