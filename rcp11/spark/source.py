"""Reading: batch and streaming readers over one or more streams.

One DataFrame covers every subscribed stream; each Spark partition reads a
range of offsets of one stream (``ReadRange``). Offsets that were evicted,
or lost in a crash, have no message and so produce no row.

Streaming offsets in the checkpoint are ``{"stream": next_offset_to_read}``
with the keys sorted (Spark compares offsets as JSON text). Data loss:

* offsets a range still needs that are below the stream's first readable
  offset when the task reads them were evicted;
* a stream whose next offset is below the checkpoint was deleted and
  recreated; a stream that vanished was deleted.

With failOnDataLoss (the default) each is an error naming the stream and
the offsets; with failOnDataLoss=false the gap is skipped and logged, and a
recreated stream is read again from its earliest message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from rcp11 import errors
from rcp11.spark.cluster import Fleet, Router
from rcp11.spark.columns import Projection
from rcp11.spark.connection import pipelined_treads
from rcp11.spark.failures import SPARK_CALLS, guard_methods
from rcp11.spark.options import (
    Endpoint,
    OptionError,
    ReadOptions,
    check_batch_read,
    check_streaming_read,
)
from rcp11.spark.planning import (
    Bounds,
    Catalog,
    ReadRange,
    ending_positions,
    share,
    split_ranges,
    starting_positions,
)

try:  # Spark >= 4.2: read limits and Trigger.AvailableNow for Python sources.
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the reader class can be declared on older Spark."""


if TYPE_CHECKING:
    from pyspark.sql.types import StructType


log = logging.getLogger("rcp11.spark")


class DataLossError(RuntimeError):
    """Offsets a query needs are gone and failOnDataLoss is true."""


# ---------------------------------------------------------------------------
# Reading one range (on an executor)
# ---------------------------------------------------------------------------


class LossReport:
    """Raises, or logs once per run of lost offsets, as failOnDataLoss says."""

    def __init__(self, stream: str, fail: bool) -> None:
        self.stream = stream
        self.fail = fail

    def lost(self, start: int, end: int | None, why: str) -> None:
        """Offsets [start, end) (end None: from start on) are gone."""
        if end is not None and end <= start:
            return
        message = errors.spark_data_loss(self.stream, start, end, why, self.fail)
        if self.fail:
            raise DataLossError(message)
        log.warning("%s", message)


def read_range(read: ReadOptions, projection: Projection, part: ReadRange) -> Iterator[Any]:
    """Arrow record batches with the readable messages of one range."""
    if part.size == 0:
        return
    builder = projection.builder(part.stream)
    report = LossReport(part.stream, read.fail_on_data_loss)
    cursor = part.start  # every offset before it has been accounted for
    endpoint, relocate = read.endpoint, None
    if part.node:  # a cluster: the stream's primary, and where to go when it moves
        router = Router(read.endpoint)
        host, _, port = part.node.rpartition(":")
        endpoint = router.node(host, int(port))

        def relocate(exc: BaseException) -> Endpoint:
            return router.after(exc, part.stream)

    replies = pipelined_treads(
        endpoint,
        part.stream,
        part.start,
        part.end,
        read.batch_size,
        f"reading stream {part.stream!r}",
        relocate,
        projection.times,
    )
    try:
        for offset, reply, packed in replies:
            info = reply[0]
            first, count = int(info[0]), int(info[3])
            report.lost(max(cursor, part.floor), min(max(offset, first), offset + count), "evicted")
            batch = builder.add(offset, reply[1:], count, packed)
            if batch is not None:
                yield batch
            cursor = offset + count
            if cursor < part.end and count < min(read.batch_size, part.end - offset):
                report.lost(
                    max(cursor, part.floor),
                    part.end,
                    f"the stream's next offset is now {cursor}: deleted or recreated",
                )
                break
        batch = builder.flush()
        if batch is not None:
            yield batch
    except redis.ResponseError as exc:
        if "WRONGTYPE" in str(exc):
            raise OptionError(errors.spark_not_a_stream(part.stream)) from None
        raise


def _how(read: ReadOptions) -> str:
    """Which options set a batch query's start and end (for errors)."""
    start = read.starting_time.option if read.starting_time else "startingOffsets"
    end = read.ending_time.option if read.ending_time else "endingOffsets"
    return f"{start} and {end}, resolved now"


def node_of(router: Router, stream: str) -> str:
    """The "host:port" of a stream's primary on a cluster ("" for one server):
    the task reads there first."""
    return router.endpoint_for(stream).address if router.clustered else ""


# ---------------------------------------------------------------------------
# Batch
# ---------------------------------------------------------------------------


class BatchReader(DataSourceReader):
    """``spark.read.format("rcp11")``: the offsets between startingOffsets
    (default earliest) and endingOffsets (default latest) of every stream."""

    def __init__(self, read: ReadOptions, schema: StructType | None) -> None:
        check_batch_read(read)
        self.read_options = read
        self.projection = Projection.from_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        read = self.read_options
        catalog = Catalog(read.require_subscription())

        def plan(fleet: Fleet) -> tuple[dict[str, Bounds], dict[str, int], dict[str, int]]:
            bounds = catalog.bounds(fleet)
            starting = starting_positions(fleet, read, bounds, "earliest")
            return bounds, starting, ending_positions(fleet, read, bounds)

        router = Router(read.endpoint)
        with Fleet(router) as fleet:
            bounds, starting, ending = fleet.call("planning a batch read", plan)
        ranges = []
        for stream, limits in sorted(bounds.items()):
            start = starting[stream]
            if start > ending[stream]:  # Kafka refuses it too: never 0 rows silently
                raise OptionError(
                    errors.spark_start_after_end(stream, start, ending[stream], _how(read))
                )
            if start < limits.first:
                LossReport(stream, read.fail_on_data_loss).lost(
                    start, limits.first, "evicted before the query started"
                )
                start = limits.first
            end = min(ending[stream], limits.next)
            ranges.append(ReadRange(stream, start, end, start, node_of(router, stream)))
        planned = split_ranges(ranges, read.min_partitions, read.max_records_per_partition)
        # Spark wants at least one partition; an empty range reads nothing.
        return planned or [ReadRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ReadRange)
        return read_range(self.read_options, self.projection, partition)


# ---------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("rcp11")``: micro-batches of new offsets."""

    def __init__(self, read: ReadOptions, schema: StructType | None) -> None:
        check_streaming_read(read)
        self.read_options = read
        self.projection = Projection.from_schema(schema)
        self.catalog = Catalog(read.require_subscription())
        self.available_now: dict[str, int] | None = None
        self.last_trigger = time.monotonic()
        self.router = Router(read.endpoint)
        self._fleet: Fleet | None = None
        # The streams' next offsets latestOffset() just read: Spark asks
        # reportLatestOffset() right after it in the same trigger, and
        # reading them again would cost the planning a round trip.
        self._latest: dict | None = None
        # stream -> (its start in the last latestOffset(), the first
        # readable offset at or after it): partitions() reads from there,
        # not through a gap of nulls a crash left.
        self._readable: dict[str, tuple[int, int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to executors for read(): never with a socket inside.
        state = dict(self.__dict__)
        state["_fleet"] = None
        return state

    @property
    def fleet(self) -> Fleet:
        if self._fleet is None:
            self._fleet = Fleet(self.router)
        return self._fleet

    def _bounds(self, starts: dict[str, int] | None = None) -> dict[str, Bounds]:
        return self.fleet.call(
            "planning a micro-batch", lambda fleet: self.catalog.bounds(fleet, starts)
        )

    def initialOffset(self) -> dict:
        read = self.read_options

        def plan(fleet: Fleet) -> dict[str, int]:
            return starting_positions(fleet, read, self.catalog.bounds(fleet), "latest")

        return dict(sorted(self.fleet.call("planning a micro-batch", plan).items()))

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = {s: b.next for s, b in self._bounds().items()}

    def getDefaultReadLimit(self) -> Any:
        read = self.read_options
        if read.max_offsets_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(read.max_offsets_per_trigger)
        if read.min_offsets_per_trigger is not None and ReadMinRows is not None:
            return ReadMinRows(read.min_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """The end of the next micro-batch; reads the server, changes nothing.

        A stream whose end is below its start in the result was recreated:
        partitions() then reads it from its earliest message."""
        read = self.read_options
        bounds = self._bounds(start)
        self._latest = {s: b.next for s, b in sorted(bounds.items())}
        self._readable = {}
        if start is None:  # Spark < 4.2 asks without a start: everything there is
            return {s: b.next for s, b in sorted(bounds.items())}
        begins: dict[str, int] = {}
        ends: dict[str, int] = {}
        for stream, begin in start.items():
            limits = bounds.get(stream)
            if limits is None or limits.next < begin:
                self._stream_reset(stream, begin, limits)  # raises with failOnDataLoss
                if limits is None:
                    continue  # deleted: dropped from the offsets
                begin = limits.first
            elif limits.readable is not None and limits.first <= begin < limits.readable:
                # A gap a crash left (never an evicted prefix: begin is
                # past first, and evicted offsets a range needs are data
                # loss for the reader to report). Its offsets count toward
                # no limit, and a gap with nothing readable after it yet
                # makes no micro-batch: Spark would run one of no rows per
                # maxOffsetsPerTrigger offsets of it.
                if limits.readable >= limits.next:
                    begins[stream] = ends[stream] = begin
                    continue
                self._readable[stream] = (begin, limits.readable)
                begin = limits.readable
            begins[stream], ends[stream] = begin, limits.next
        for stream, limits in bounds.items():
            if stream not in start:  # a new stream (pattern): from its earliest
                begins[stream], ends[stream] = limits.first, limits.next
        if self.available_now is not None:
            self._cap_to_available_now(start, begins, ends)
        backlog = {s: max(0, ends[s] - begins[s]) for s in ends}
        if not (ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable)):
            maximum = read.max_offsets_per_trigger
            if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
                maximum = limit.max_rows
            if maximum is not None and sum(backlog.values()) > maximum:
                backlog = share(maximum, backlog)
                ends = {s: begins[s] + backlog[s] if s in backlog else e for s, e in ends.items()}
            minimum = read.min_offsets_per_trigger
            if ReadMinRows is not None and isinstance(limit, ReadMinRows):
                minimum = limit.min_rows
            waited_ms = (time.monotonic() - self.last_trigger) * 1000
            if (
                minimum is not None
                and self.available_now is None
                and sum(backlog.values()) < minimum
                and waited_ms < read.max_trigger_delay_ms
            ):
                return dict(sorted(start.items()))
        end = dict(sorted(ends.items()))
        if end != dict(sorted(start.items())):
            self.last_trigger = time.monotonic()
        return end

    def _cap_to_available_now(
        self, start: dict, begins: dict[str, int], ends: dict[str, int]
    ) -> None:
        """Trigger.AvailableNow: nothing past what existed when it started."""
        assert self.available_now is not None
        for stream in list(ends):
            target = self.available_now.get(stream)
            if target is None:
                if stream in start:  # not there when the run started: no progress
                    begins[stream] = ends[stream] = start[stream]
                else:  # appeared after the run started
                    del begins[stream], ends[stream]
            elif stream in start and start[stream] <= target <= begins[stream]:
                # Nothing readable from the start up to the target (a gap
                # a crash left runs past it): no progress, no empty batch.
                begins[stream] = ends[stream] = start[stream]
            else:
                ends[stream] = min(ends[stream], max(target, begins[stream]))

    def _stream_reset(self, stream: str, begin: int, limits: Bounds | None) -> None:
        """A stream in the checkpoint is gone, or its next offset went below it."""
        fail = self.read_options.fail_on_data_loss
        if limits is None:
            message = errors.spark_stream_deleted(stream, begin, fail)
        else:
            message = errors.spark_stream_recreated(stream, limits.next, begin, fail)
        if fail:
            raise DataLossError(message)
        log.warning("%s", message)

    def reportLatestOffset(self) -> dict | None:
        latest, self._latest = self._latest, None
        if latest is None:
            latest = {s: b.next for s, b in sorted(self._bounds().items())}
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        read = self.read_options
        fresh = [s for s, e in end.items() if s not in start or e < start[s]]
        bounds = self._bounds() if fresh else {}
        ranges = []
        for stream, stop in end.items():
            if stream in start and stop >= start[stream]:
                begin = start[stream]
                asked, readable = self._readable.get(stream, (-1, -1))
                if asked == begin:  # past a gap latestOffset() saw: nothing to read in it
                    begin = min(readable, stop)
                ranges.append(ReadRange(stream, begin, stop, begin, node_of(self.router, stream)))
            else:  # new or recreated: from the earliest message there is now
                first = bounds[stream].first if stream in bounds else 0
                node = node_of(self.router, stream)
                ranges.append(ReadRange(stream, min(first, stop), stop, first, node))
        return split_ranges(ranges, read.min_partitions, read.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ReadRange)
        return read_range(self.read_options, self.projection, partition)

    def commit(self, end: dict) -> None:
        """Spark is done with everything before ``end``: evict it if asked to."""
        if not self.read_options.evict_on_commit:
            return

        def evict(fleet: Fleet) -> None:
            for client, streams in fleet.by_owner(s for s, offset in end.items() if offset > 0):
                pipe = client.pipeline(transaction=False)
                for stream in streams:
                    pipe.tevict(stream, end[stream] - 1)
                pipe.execute()

        self.fleet.call("evicting committed offsets", evict)

    def stop(self) -> None:
        if self._fleet is not None:
            self._fleet.close()


# Our errors first in what Spark shows, in every worker (failures.py).
for _cls in (BatchReader, StreamReader):
    guard_methods(_cls, SPARK_CALLS)
