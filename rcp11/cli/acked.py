"""The command line's acknowledged consumer groups: `rcp11 consume --group G
--ack` (at least once), and their rows in `rcp11 groups KEY` (lag,
pending, expired leases, consumers: TGROUP INFO; each consumer's lag from
its oldest pending offset: TGROUP PENDING).

`consume --ack` reads with LEASE and acknowledges a batch only once it is
taken: written to stdout, and, when stdout is a pipe, read out of the pipe
by the program at its other end while that program is still there. Unix
pipes say no more than that, so:

- batch k is acknowledged once the reader has taken batch k+1 (it came
  back for more after batch k), in the read that fetches the next batch;
- the last batch, before waiting for more messages or exiting, once the
  reader has taken it and is still there a moment later (LAST_BATCH_GRACE_S);
- a reader that goes away (`| head -1`) leaves its batches unacknowledged:
  the group delivers them again when their lease runs out.

So a reader that exits after taking lines it did not use (head reads a
pipe-full at once) does not lose them. Output to a file or a terminal is
taken when written. A consumer killed or disconnected acknowledges nothing
after its last confirmed batch.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import select
import socket
import stat
import struct
import termios
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, BinaryIO

import redis

from rcp11.client import Client, ReadResult

# How long the reader of a pipe must stay after taking the last batch for
# that batch to count as used (`head -1` takes a batch and exits at once).
LAST_BATCH_GRACE_S = 0.2
# How often a pipe is looked at while its reader drains it.
_POLL_S = 0.002
_POLL_MAX_S = 0.05
# What a group key's TGROUP INFO answers when it belongs to another stream.
_OTHER_STREAM = "belongs to stream"


class ReaderGone(Exception):
    """The program reading stdout closed it: stop, acknowledging nothing more."""


class Output:
    """stdout as consume --ack sees it: how to tell that what was written
    was taken. A pipe (FIFO) is asked how many bytes it still holds
    (FIONREAD) and whether its reader is gone (POLLERR); anything else
    counts as taken when written."""

    def __init__(self, out: BinaryIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.clock = clock
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError, ValueError):
            fd = out.fileno()
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                self.fd = fd

    @property
    def is_pipe(self) -> bool:
        return self.fd is not None

    def write(self, data: bytes) -> None:
        try:
            self.out.write(data)
            self.out.flush()
        except BrokenPipeError:
            raise ReaderGone from None

    def reader_gone(self) -> bool:
        if self.fd is None:
            return False
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))

    def _unread(self) -> int:
        assert self.fd is not None
        buf = fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0")
        return int(struct.unpack("i", buf)[0])

    def wait_taken(self) -> None:
        """Until the pipe's reader took everything written (ReaderGone when
        it went away instead)."""
        if self.fd is None:
            return
        pause = _POLL_S
        while True:
            if self.reader_gone():
                raise ReaderGone
            if self._unread() == 0:
                return
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def confirm_last(self) -> None:
        """The last batch was taken: count it used if the reader is still
        there a moment later (ReaderGone otherwise)."""
        if self.fd is None:
            return
        self.wait_taken()
        deadline = self.clock() + LAST_BATCH_GRACE_S
        while self.clock() < deadline:
            if self.reader_gone():
                raise ReaderGone
            time.sleep(_POLL_S * 5)
        if self.reader_gone():
            raise ReaderGone


def default_consumer() -> str:
    """The consumer name a CLI consumer leases under: host and process."""
    return f"{socket.gethostname()}-{os.getpid()}"


def consume_acked(
    args: argparse.Namespace,
    client: Client,
    stdout: BinaryIO,
    format_batch: Callable[[ReadResult], tuple[bytes, int]],
    progress: Any,
) -> int:
    """consume --group/--groupnew --ack: lease, write, acknowledge what the
    reader took. Returns the exit status."""
    group = args.group or args.groupnew
    option = {"group": args.group} if args.group else {"groupnew": args.groupnew}
    consumer = args.consumer if args.consumer is not None else default_consumer()
    block: int | None = 0 if args.follow else args.block
    out = Output(stdout)
    remaining = args.count
    ack: ReadResult | None = None  # taken, to acknowledge with the next read
    unconfirmed: ReadResult | None = None  # written, not known to be taken
    try:
        while remaining is None or remaining > 0:
            want = args.batch if remaining is None else min(args.batch, remaining)
            result = client.tread(
                args.key, 0, want, lease=args.lease, consumer=consumer, ack=ack, **option
            )
            ack = None
            if result.count == 0 and unconfirmed is not None:
                # Caught up: before waiting (or leaving), the last batch.
                out.confirm_last()
                client.tack(group, unconfirmed.start, unconfirmed.count)
                unconfirmed = None
            if result.count == 0 and block is not None:
                result = client.tread(
                    args.key, 0, want, block=block, lease=args.lease, consumer=consumer, **option
                )
            if result is None or result.count == 0:
                break  # a --block wait ran out, or caught up without blocking
            data, written = format_batch(result)
            out.write(data)
            if out.is_pipe:
                out.wait_taken()  # the reader came back for more after `unconfirmed`
                ack, unconfirmed = unconfirmed, result
            else:
                ack = result
            progress.add(written)
            if remaining is not None:
                remaining -= written
        if ack is not None:  # no next read will carry it
            client.tack(group, ack.start, ack.count)
            ack = None
        if unconfirmed is not None:
            out.confirm_last()
            ack = unconfirmed
    except ReaderGone:
        ack = None  # nothing the reader may not have used is acknowledged
    finally:
        if ack is not None:
            client.tack(group, ack.start, ack.count)
    return 0


# ---------------------------------------------------------------------------
# rcp11 groups KEY: the rows of acknowledged groups
# ---------------------------------------------------------------------------

# TYPE's answer for an acknowledged group (docs/PROTOCOL.md section 3).
ACKED_GROUP_TYPE = "rcp11-grp"
# The extra columns of `rcp11 groups` when an acknowledged group is shown.
ACKED_COLUMNS = ("PENDING", "EXPIRED", "REDELIVERED", "CONSUMERS")
# How many pending ranges `rcp11 groups` looks through for the consumers'
# oldest offsets: a page per TGROUP PENDING, a bounded number of pages.
_PENDING_PAGE = 1000
_MAX_PENDING_PAGES = 100


def acked_row(client: Client, key: str, name: str, next_offset: int) -> dict[str, Any] | str:
    """The `rcp11 groups` row of acknowledged group `name` of stream `key`,
    or why it is none (it belongs to another stream)."""
    try:
        group = client.tgroup_info(key, name)
    except redis.exceptions.ResponseError as exc:
        if _OTHER_STREAM in str(exc):
            return str(exc)
        raise
    oldest = _oldest_pending(client, key, name, {c.name for c in group.consumers})
    return {
        "group": name,
        "stream": key,
        "current_offset": group.next_offset,
        "next_offset": next_offset,
        "lag": group.lag,
        "mode": group.mode,
        "pending": group.pending,
        "expired": group.expired,
        "redelivered": group.redelivered,
        "consumers": [
            {
                "name": c.name.decode("utf-8", "replace"),
                "pending": c.pending,
                "expired": c.expired,
                "lease_deadline": c.lease_deadline,
                **_member_lag(oldest.get(c.name), next_offset),
            }
            for c in group.consumers
        ],
    }


def _member_lag(oldest: int | None, next_offset: int) -> dict[str, int | None]:
    """A consumer's lag, as Kafka's for a member: from the first offset it
    has not finished (its oldest pending one) to the stream's end."""
    if oldest is None:  # past the ranges looked at (_MAX_PENDING_PAGES)
        return {"oldest_pending": None, "lag": None}
    return {"oldest_pending": oldest, "lag": max(next_offset - oldest, 0)}


def _oldest_pending(client: Client, key: str, name: str, wanted: set[bytes]) -> dict[bytes, int]:
    """Each consumer's lowest pending offset, from the group's pending
    ranges in offset order (TGROUP PENDING, a page at a time), until every
    consumer of `wanted` was seen."""
    oldest: dict[bytes, int] = {}
    offset = 0
    for _ in range(_MAX_PENDING_PAGES):
        ranges = client.tgroup_pending(key, name, offset, _PENDING_PAGE)
        for r in ranges:
            oldest.setdefault(r.consumer, r.start)
        if len(ranges) < _PENDING_PAGE or wanted <= oldest.keys():
            break
        offset = ranges[-1].start + ranges[-1].count
    return oldest


def acked_cells(row: dict[str, Any]) -> list[Any]:
    """The extra columns' cells of a row ("-" for a plain group)."""
    if "pending" not in row:
        return ["-"] * len(ACKED_COLUMNS)
    return [row["pending"], row["expired"], row["redelivered"], len(row["consumers"])]


def consumer_lines(row: dict[str, Any]) -> list[str]:
    """The lines under an acknowledged group's row: its consumers' leases."""
    return [
        f"  consumer {c['name']}: {c['pending']} pending, {c['expired']} expired, "
        f"lag {_lag(c)}, lease until {_when(c['lease_deadline'])}\n"
        for c in row.get("consumers", ())
    ]


def _lag(consumer: dict[str, Any]) -> str:
    if consumer["lag"] is None:
        return "?"
    return f"{consumer['lag']} (from offset {consumer['oldest_pending']})"


def _when(ms: int) -> str:
    if not ms:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


__all__ = [
    "ACKED_COLUMNS",
    "ACKED_GROUP_TYPE",
    "LAST_BATCH_GRACE_S",
    "Output",
    "ReaderGone",
    "acked_cells",
    "acked_row",
    "consume_acked",
    "consumer_lines",
    "default_consumer",
]
