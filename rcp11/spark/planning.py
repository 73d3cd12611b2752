"""Planning reads: which streams a subscription covers (SCAN ... TYPE for
a pattern), their bounds, what the offsets options resolve to, and how
offset ranges become Spark partitions. Runs on the driver; reads the
server, changes nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
from pyspark.sql.datasource import InputPartition

from rcp11 import errors
from rcp11.spark.commit import PREFIX
from rcp11.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    ReadOptions,
    Subscription,
    TimeSpec,
)

if TYPE_CHECKING:
    from rcp11.client import Client
    from rcp11.spark.cluster import Fleet

log = logging.getLogger("rcp11.spark")

# The names TYPE gives our streams: "stream" today, "rcp11-log" (the name of
# the Redis module's data type) soon. SCAN ... TYPE asks for both.
STREAM_TYPE_NAMES = ("rcp11-log", "stream")
SCAN_COUNT = 1000
# The sink's staging streams and bookkeeping keys: never a pattern's match.
INTERNAL_PREFIX = PREFIX.encode()


@dataclass(frozen=True)
class Bounds:
    first: int  # oldest readable offset (== next when nothing is readable)
    next: int
    # The first readable offset at or after the offset planning asked from
    # (TREAD ... NONULLS: past a gap a crash left), or `next` when nothing
    # there is readable; None when planning asked from no offset.
    readable: int | None = None


@dataclass(frozen=True)
class ReadRange(InputPartition):
    """Offsets [start, end) of one stream. Offsets below ``floor`` are not
    needed (a range that starts at "earliest"), so their eviction is no loss."""

    stream: str
    start: int
    end: int
    floor: int
    node: str = ""  # "host:port" of the stream's primary on a cluster, else ""

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


# ---------------------------------------------------------------------------
# Which streams exist, and their bounds
# ---------------------------------------------------------------------------


def scan_streams(client: Client, pattern: str, type_names: Sequence[str]) -> list[str]:
    """Keys matching a glob whose TYPE is one of type_names (SCAN ... TYPE)."""
    found: dict[str, None] = {}
    for type_name in type_names:
        for key in client.scan_iter(match=pattern, count=SCAN_COUNT, _type=type_name):
            if key.startswith(INTERNAL_PREFIX):
                continue
            try:
                found[key.decode("utf-8")] = None
            except UnicodeDecodeError:
                log.warning("rcp11: skipping stream %r: its name is not UTF-8", key)
    return sorted(found)


def fetch_bounds(
    client: Client,
    streams: Sequence[str],
    strict: bool,
    starts: Mapping[str, int] | None = None,
) -> dict[str, Bounds]:
    """Bounds of each stream with one pipelined round trip. A missing stream
    is empty at 0. A key of another type is an error when the user named it
    (strict), else (found by a pattern) skipped. A stream with an offset in
    ``starts`` gets its next readable offset from there too (the same
    request, with NONULLS)."""
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        if starts is not None and stream in starts:
            pipe.execute_command("TREAD", stream, starts[stream], 0, "WITHINFO", "NONULLS")
        else:
            pipe.execute_command("TREAD", stream, 0, 0, "WITHINFO")
    replies = pipe.execute(raise_on_error=False)
    if starts is not None and any(
        isinstance(r, redis.ResponseError) and "NONULLS" in str(r) for r in replies
    ):
        # A server from before NONULLS: bounds alone (gaps read as nulls).
        return fetch_bounds(client, streams, strict)
    bounds = {}
    for stream, reply in zip(streams, replies, strict=True):
        if isinstance(reply, redis.ResponseError):
            if "WRONGTYPE" in str(reply) and not strict:
                continue
            if "WRONGTYPE" in str(reply):
                raise OptionError(errors.spark_not_a_stream(stream))
            raise reply
        readable = None
        if starts is not None and stream in starts:
            readable = min(reply.start, reply.next_offset)
        bounds[stream] = Bounds(reply.first_offset, reply.next_offset, readable)
    return bounds


class Catalog:
    """Resolves a subscription to streams and bounds. For a pattern it
    remembers which TYPE name the server uses once one has matched, so later
    micro-batches scan once instead of twice."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.type_names: tuple[str, ...] = STREAM_TYPE_NAMES

    def bounds(self, fleet: Fleet, starts: Mapping[str, int] | None = None) -> dict[str, Bounds]:
        """Bounds of every stream read, each asked of its own node (all
        primaries of a cluster are scanned for a pattern); with ``starts``,
        the next readable offset from each stream's start (Bounds.readable)."""
        pattern = self.subscription.pattern
        if pattern is None:
            found = {}
            for client, streams in fleet.by_owner(self.subscription.names):
                found.update(fetch_bounds(client, streams, True, starts))
            return {s: found[s] for s in self.subscription.names}
        for type_name in self.type_names:
            found = {}
            for client in fleet.primaries():
                streams = scan_streams(client, pattern, (type_name,))
                found.update(fetch_bounds(client, streams, False, starts))
            if found:
                self.type_names = (type_name,)
                return dict(sorted(found.items()))
        return {}


# ---------------------------------------------------------------------------
# Offsets options -> positions
# ---------------------------------------------------------------------------


def resolve_positions(
    name: str, spec: OffsetSpec, bounds: Mapping[str, Bounds], pattern: bool
) -> dict[str, int]:
    """Per-stream offsets for startingOffsets / endingOffsets. A JSON object
    must name exactly the streams read (Kafka's rule); with a pattern,
    matching streams it does not name start at earliest."""
    if spec.word is not None:
        word = EARLIEST if spec.word == "earliest" else LATEST
        given = dict.fromkeys(bounds, word)
    else:
        given = spec.as_dict()
        missing = sorted(set(bounds) - set(given))
        extra = sorted(set(given) - set(bounds))
        if pattern:
            missing = []
            for stream in set(bounds) - set(given):
                given[stream] = EARLIEST
        if missing or extra:
            raise OptionError(errors.spark_offsets_streams(name, missing, extra))
    positions = {}
    for stream, offset in given.items():
        if offset == EARLIEST:
            positions[stream] = bounds[stream].first
        elif offset == LATEST:
            positions[stream] = bounds[stream].next
        elif name == "startingOffsets" and offset > bounds[stream].next:
            # Not data loss (nothing was read yet): a mistake in the option.
            raise OptionError(errors.spark_offset_beyond(stream, offset, bounds[stream].next))
        else:
            positions[stream] = offset
    return positions


# ---------------------------------------------------------------------------
# Timestamp options -> positions (TSEEK)
# ---------------------------------------------------------------------------


def _address(client: Client) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


@dataclass(frozen=True)
class Seek:
    """What TSEEK found for a time, with the stream's bounds right after."""

    found: int  # == bounds.next: no readable message appended at or after the time
    bounds: Bounds


def seek_times(client: Client, times: Mapping[str, int], option: str) -> dict[str, Seek]:
    """``TSEEK stream ms`` for each stream, each followed by the stream's
    bounds, in one pipelined round trip. TSEEK answers the stream's next
    offset when no readable message was appended at or after the time (0
    for a missing key). ``option`` names the option in errors."""
    pipe = client.pipeline(transaction=False)
    for stream, ms in times.items():
        pipe.execute_command("TSEEK", stream, ms)
        pipe.execute_command("TREAD", stream, 0, 0, "WITHINFO")
    replies = pipe.execute(raise_on_error=False)
    found = {}
    for index, stream in enumerate(times):
        offset, info = replies[2 * index], replies[2 * index + 1]
        for reply in (offset, info):
            if isinstance(reply, redis.ResponseError):
                text = str(reply)
                if "unknown command" in text.lower():
                    raise OptionError(errors.spark_no_tseek(_address(client), option, text))
                if "WRONGTYPE" in text:
                    raise OptionError(errors.spark_not_a_stream(stream))
                raise reply
        # The bounds are read after TSEEK: a write in between only moves the
        # next offset up, past an offset TSEEK found for a time before it.
        limits = Bounds(info.first_offset, info.next_offset)
        found[stream] = Seek(min(int(offset), limits.next), limits)
    return found


def resolve_times(
    fleet: Fleet,
    spec: TimeSpec,
    bounds: Mapping[str, Bounds],
    pattern: bool,
    starting: bool,
    no_match_latest: bool = False,
) -> dict[str, int]:
    """Per-stream offsets for a timestamp option (Kafka's meaning): the
    first message appended at or after the time. When a stream has
    messages but none that late, a start is an error (or its next offset,
    with startingOffsetsByTimestampStrategy=latest) and an end is the
    stream's next offset; a stream with nothing readable starts and ends
    at its next offset (nothing is skipped). A JSON object names exactly
    the streams read; with a pattern, others start at earliest and end at
    latest, as with the offsets options."""
    if spec.at is not None:
        times = dict.fromkeys(bounds, spec.at)
    else:
        times = {s: ms for s, ms in spec.per_stream if s in bounds}
        missing = sorted(set(bounds) - set(times))
        extra = sorted(set(spec.as_dict()) - set(bounds))
        if missing and not pattern or extra:
            raise OptionError(errors.spark_offsets_streams(spec.option, missing, extra, hint=""))
    found: dict[str, Seek] = {}
    for client, streams in fleet.by_owner(times):
        found.update(seek_times(client, {s: times[s] for s in streams}, spec.option))
    positions = {s: (b.first if starting else b.next) for s, b in bounds.items()}
    for stream, seek in found.items():
        limits = seek.bounds
        if seek.found < limits.next:
            positions[stream] = seek.found
        elif not starting or no_match_latest or limits.first >= limits.next:
            positions[stream] = limits.next
        else:
            raise OptionError(
                errors.spark_no_time_match(spec.option, stream, times[stream], limits.next)
            )
    return positions


def starting_positions(
    fleet: Fleet, read: ReadOptions, bounds: Mapping[str, Bounds], default: str
) -> dict[str, int]:
    """Where a query starts: startingTimestamp, else startingOffsetsByTimestamp,
    else startingOffsets, else ``default`` (Kafka's precedence)."""
    pattern = read.require_subscription().pattern is not None
    if read.starting_time is not None:
        return resolve_times(
            fleet, read.starting_time, bounds, pattern, True, read.no_time_match_latest
        )
    return resolve_positions(
        "startingOffsets", read.starting or OffsetSpec(default), bounds, pattern
    )


def ending_positions(
    fleet: Fleet, read: ReadOptions, bounds: Mapping[str, Bounds]
) -> dict[str, int]:
    """Where a batch query ends: endingTimestamp, else endingOffsetsByTimestamp,
    else endingOffsets, else latest."""
    pattern = read.require_subscription().pattern is not None
    if read.ending_time is not None:
        return resolve_times(fleet, read.ending_time, bounds, pattern, False)
    return resolve_positions("endingOffsets", read.ending or OffsetSpec("latest"), bounds, pattern)


# ---------------------------------------------------------------------------
# Planning partitions
# ---------------------------------------------------------------------------


def share(limit: int, backlog: Mapping[str, int]) -> dict[str, int]:
    """Split ``limit`` offsets across streams in proportion to their backlog
    (largest remainder, ties by name), never more than a stream has."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    quotas = {stream: limit * size / total for stream, size in backlog.items()}
    taken = {stream: min(backlog[stream], math.floor(q)) for stream, q in quotas.items()}
    left = limit - sum(taken.values())
    by_remainder = sorted(quotas, key=lambda s: (-(quotas[s] - math.floor(quotas[s])), s))
    for stream in by_remainder:
        if left <= 0:
            break
        if taken[stream] < backlog[stream]:
            taken[stream] += 1
            left -= 1
    return taken


def split_ranges(
    ranges: Sequence[ReadRange], min_partitions: int | None, max_records: int | None
) -> list[ReadRange]:
    """One Spark partition per stream range (Kafka's default), split so no
    piece has more than max_records offsets and, with min_partitions, so
    there are at least that many pieces (bigger ranges get more)."""
    ranges = [r for r in ranges if r.size > 0]
    pieces = [1] * len(ranges)
    if max_records:
        pieces = [max(1, math.ceil(r.size / max_records)) for r in ranges]
    if min_partitions and sum(pieces) < min_partitions and ranges:
        wanted = share(min_partitions, {str(i): r.size for i, r in enumerate(ranges)})
        scaled = {int(i): n for i, n in wanted.items()}
        pieces = [max(p, scaled.get(i, 0), 1) for i, p in enumerate(pieces)]
    out = []
    for r, count in zip(ranges, pieces, strict=True):
        count = min(count, r.size)
        base, extra = divmod(r.size, count)
        position = r.start
        for index in range(count):
            size = base + (1 if index < extra else 0)
            out.append(ReadRange(r.stream, position, position + size, r.floor, r.node))
            position += size
    return out
