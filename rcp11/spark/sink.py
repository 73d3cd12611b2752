"""Writing, exactly once: the writers Spark calls, and the task side that
stages each task's rows in private streams (one per target), reconnecting
through short outages without writing anything twice. The commit that
moves staged rows into the target is rcp11.spark.commit.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import redis
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from rcp11 import errors
from rcp11.spark.cluster import REROUTE, Fleet, Router
from rcp11.spark.columns import (
    WriteLayout,
    binary_values,
    pack_twrite,
    row_batch,
    split_by_target,
    twrite_cuts,
    write_layout,
)
from rcp11.spark.commit import Staged, StagedWrite, abort, commit, count_readable, sink_key
from rcp11.spark.connection import RETRYABLE, Outage, raw_connection
from rcp11.spark.failures import SPARK_CALLS, guard_methods
from rcp11.spark.options import Endpoint, OptionError, WriteOptions

try:  # Spark >= 4.1 hands streaming writers Arrow batches too.
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - Spark 4.0 passes Rows
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


log = logging.getLogger("rcp11.spark")

# Spark's local properties that name a streaming query and its micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# TWRITEs a task keeps in flight on its connection.
WRITE_PIPELINE_DEPTH = 8
# A staging TWRITE carries at most batchSize messages and at most this many
# bytes of them. rcp11-server runs a request that fits the start of a read
# it may carry over (rcp11.limits.LANE_MAX_CARRY, 64 KB) in its C lane;
# larger ones go through its Python parser. Measured on this 2-core
# machine, server CPU per 100-byte message staged: 1,350 ns in TWRITEs of
# 10,000 messages, 525 ns in TWRITEs of 400 (~43 KB) -- CPU the server
# takes from Spark when both share the machine.
TWRITE_MAX_BYTES = 48 << 10


# ---------------------------------------------------------------------------
# Task side
# ---------------------------------------------------------------------------


class _Channel:
    """One connection of a task to one node, and the TWRITEs it has in
    flight (for a resend): ``(staging stream, rows, packed request)``."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.conn: redis.Connection | None = None
        self.in_flight: deque[tuple[_StagingStream, int, bytes]] = deque()
        self.outage: Outage | None = None

    def connection(self) -> redis.Connection:
        if self.conn is None:
            self.conn = raw_connection(self.endpoint)
        return self.conn

    def disconnect(self) -> None:
        if self.conn is not None:
            self.conn.disconnect()
            self.conn = None


class _StagingStream:
    """One target's staging stream in one task: rows sent, rows the server
    acknowledged and where its TWRITEs put them (runs of offsets: a server
    restart between two of them may leave a gap of null offsets, which is
    no loss), and the channel (node) it is written through."""

    def __init__(self, target: str, key: str, channel: _Channel) -> None:
        self.target = target
        self.key = key
        self.encoded = key.encode()
        self.acked = 0
        self.sent = 0
        self.runs: list[list[int]] = []  # [first offset, rows], in order
        self.channel = channel

    @property
    def end(self) -> int:
        """The offset after the last acknowledged row (0 before any)."""
        return self.runs[-1][0] + self.runs[-1][1] if self.runs else 0

    def landed(self, first: int, rows: int) -> None:
        """A TWRITE of `rows` rows was applied at offsets first.. ."""
        if self.runs and self.end == first:
            self.runs[-1][1] += rows
        else:
            self.runs.append([first, rows])
        self.acked += rows


class TaskWriter:
    """Stages one task's rows (one staging stream per target it meets), each
    on the node that owns its target (one server, or a cluster's primary)."""

    def __init__(
        self,
        options: WriteOptions,
        layout: WriteLayout,
        job: str,
        streaming: bool = False,
        router: Router | None = None,
    ) -> None:
        from pyspark import TaskContext

        context = TaskContext.get()
        query = batch = None
        # Only a streaming sink takes the query and micro-batch from Spark: a
        # batch write inside foreachBatch sees them too, but commits as the
        # one-off job it is.
        if streaming and context is not None:
            query = context.getLocalProperty(QUERY_ID_PROPERTY)
            batch = context.getLocalProperty(BATCH_ID_PROPERTY)
            if query is None:
                log.warning("rcp11 sink: Spark names no streaming query; replays are not detected")
        self.options = options
        self.layout = layout
        # The writers pass the router the driver resolved; without one (a
        # task writer made directly) it is the one server of the options.
        self.router = router or Router(options.endpoint, resolved=True)
        self.retry = REROUTE if self.router.clustered else RETRYABLE
        self.query = query or job
        self.batch = int(batch) if batch is not None else 0
        self.partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        # The nonce keeps a task of a restarted driver (same batch, partition
        # and attempt number) away from a dead driver's staging stream.
        self.suffix = f"{self.batch}:{self.partition}:{attempt}:{secrets.token_hex(4)}"
        self.streams: dict[str, _StagingStream] = {}
        self.channels: dict[str, _Channel] = {}
        self.rows = 0

    @property
    def in_flight(self) -> list[tuple[_StagingStream, int, bytes]]:
        """Every TWRITE whose reply has not been read, on any node."""
        return [item for channel in self.channels.values() for item in channel.in_flight]

    # -- input ----------------------------------------------------------

    def add(self, item: Any) -> None:
        """One Arrow record batch (or a Spark Row on Spark 4.0)."""
        batch = item if hasattr(item, "num_rows") else row_batch(item, self.layout)
        values = binary_values(batch.column(self.layout.value_index), self.rows)
        if self.layout.target_index is None:
            assert self.options.stream is not None
            self._stage(self.options.stream, values)
        else:
            column = batch.column(self.layout.target_index)
            for target, part in split_by_target(column, values, self.layout.target_column):
                self._stage(target, part)
        self.rows += batch.num_rows

    def _channel(self, endpoint: Endpoint) -> _Channel:
        if endpoint.address not in self.channels:
            self.channels[endpoint.address] = _Channel(endpoint)
        return self.channels[endpoint.address]

    def _stage(self, target: str, values: pa.Array) -> None:
        stream = self.streams.get(target)
        if stream is None:
            key = sink_key(target, self.query, self.suffix)
            channel = self._channel(self.router.endpoint_for(target))
            stream = self.streams[target] = _StagingStream(target, key, channel)
            registry = sink_key(target, self.query, "staged")
            self._run_now(stream, ("TWRITE", registry, f"{self.batch} {key}"))
        for begin, end in twrite_cuts(values, self.options.batch_size, TWRITE_MAX_BYTES):
            chunk = values.slice(begin, end - begin).to_pylist()
            self._send(stream, len(chunk), pack_twrite(stream.encoded, chunk))

    # -- the connections ------------------------------------------------
    #
    # TWRITEs are pipelined (WRITE_PIPELINE_DEPTH in flight per node). When
    # a connection breaks (or, on a cluster, a node answers that the slot
    # moved), a TWRITE in flight may or may not have been applied; it is
    # atomic, and the staging stream is this task's alone, so its next
    # offset (asked of its owner now) says exactly which ones were: those
    # are counted, the others sent again.

    def _run_now(self, stream: _StagingStream, command: tuple[Any, ...]) -> Any:
        """A command that may safely run twice (registering a staging key),
        on the node of ``stream`` (which a recovery may change)."""
        while True:
            channel = stream.channel
            self._drain(channel, 0)
            try:
                conn = channel.connection()
                conn.send_command(*command)
                reply = conn.read_response()  # raises an error reply (MOVED...)
                channel.outage = None
                return reply
            except self.retry as exc:
                self._recover(channel, exc, [stream])

    def _send(self, stream: _StagingStream, rows: int, packed: bytes) -> None:
        channel = stream.channel
        self._drain(channel, WRITE_PIPELINE_DEPTH - 1)
        channel = stream.channel  # a recovery may have moved it
        channel.in_flight.append((stream, rows, packed))
        stream.sent += rows
        try:
            channel.connection().send_packed_command([packed])
        except self.retry as exc:
            self._recover(channel, exc)

    def _drain(self, channel: _Channel, keep: int) -> None:
        """Read replies until at most ``keep`` requests are in flight."""
        while len(channel.in_flight) > keep:
            try:
                if channel.conn is None:  # lost while requests were in flight
                    raise redis.ConnectionError("connection lost with requests in flight")
                reply = channel.conn.read_response()
            except self.retry as exc:
                self._recover(channel, exc)
                continue
            channel.outage = None
            stream, rows, _ = channel.in_flight.popleft()
            if isinstance(reply, redis.ResponseError):
                raise reply
            stream.landed(int(reply), rows)

    def _recover(
        self, channel: _Channel, exc: BaseException, extra: list[_StagingStream] | None = None
    ) -> None:
        """Reconnect, count the in-flight TWRITEs the server applied, resend
        the rest (on a cluster, to each stream's owner now); raise when the
        outage outlasts retryTimeoutMs or a staging stream is not what this
        task wrote (then Spark retries the task)."""
        if channel.outage is None:
            channel.outage = Outage(channel.endpoint, "writing staging streams")
        outage = channel.outage
        while True:
            channel.disconnect()
            outage.wait(exc)
            try:
                self._resend(channel, exc, extra or [])
                return
            except self.retry as again:
                exc = again

    def _resend(self, channel: _Channel, exc: BaseException, extra: list[_StagingStream]) -> None:
        pending = list(channel.in_flight)
        streams = list({id(s): s for s, _, _ in pending}.values())
        streams += [s for s in extra if s not in streams]
        # Where each stream lives now: the same node, unless a cluster moved it.
        owners = {id(s): channel for s in streams}
        if self.router.clustered:
            for stream in streams:
                owners[id(stream)] = self._channel(self.router.after(exc, stream.target))
        for owner in {id(o): o for o in owners.values()}.values():
            if owner is not channel:  # its replies first, then our questions
                self._drain(owner, 0)
        applied = {}
        for stream in streams:
            chunks = [rows for owner, rows, _ in pending if owner is stream]
            conn = owners[id(stream)].connection()
            applied[id(stream)] = _applied_chunks(conn, stream, chunks)
        # Nothing changes above this line: a failure there starts over.
        channel.in_flight.clear()
        resend = []
        for stream in streams:
            count = applied[id(stream)]
            mine = [item for item in pending if item[0] is stream]
            for _, rows, _ in mine[:count]:
                stream.landed(stream.end, rows)
            resend += mine[count:]
            stream.channel = owners[id(stream)]
        for item in resend:
            item[0].channel.in_flight.append(item)
        for item in resend:
            item[0].channel.connection().send_packed_command([item[2]])

    def finish(self) -> StagedWrite:
        try:
            for channel in list(self.channels.values()):
                self._drain(channel, 0)
            # A drain may move streams to a channel already drained.
            for channel in list(self.channels.values()):
                self._drain(channel, 0)
        finally:
            self.close()
        staged = [
            Staged(s.target, s.key, s.acked, tuple((f, n) for f, n in s.runs))
            for s in self.streams.values()
        ]
        return StagedWrite(self.query, self.batch, self.partition, staged)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.disconnect()


def _applied_chunks(conn: redis.Connection, stream: _StagingStream, chunks: list[int]) -> int:
    """How many of the TWRITEs in flight (`chunks`: their rows, in order)
    the server applied, asked after a broken connection. Applied ones sit
    right after the acknowledged rows, in order (a TWRITE is atomic); a
    server restart may then have added a gap of nulls. Raises RuntimeError
    when the stream is not what this task wrote: an acknowledged row gone,
    or rows nobody accounts for (Spark then runs the task again)."""
    ends = list(itertools.accumulate(chunks, initial=stream.end))
    probes: list[tuple[Any, ...]] = [("TREAD", stream.key, 0, 0, "NONULLS", "WITHINFO")]
    probes += [("TREAD", stream.key, first + rows - 1, 1) for first, rows in stream.runs]
    probes += [("TREAD", stream.key, end - 1, 1) for end in ends[1:]]
    probes += [("TREAD", stream.key, end, 0, "NONULLS", "WITHINFO") for end in ends]
    for probe in probes:
        conn.send_command(*probe)
    replies = [conn.read_response() for _ in probes]
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise reply
    head, replies = replies[0], replies[1:]
    runs, replies = replies[: len(stream.runs)], replies[len(stream.runs) :]
    landed, afters = replies[: len(chunks)], replies[len(chunks) :]
    readable = [bool(r) and r[0] is not None for r in landed]
    count = readable.index(False) if False in readable else len(chunks)
    after = afters[count][0]  # nothing readable after what is accounted for
    first_expected = stream.runs[0][0] if stream.runs else 0 if count else None
    intact = (
        all(bool(r) and r[0] is not None for r in runs)
        and not any(readable[count:])
        and int(after[2]) >= int(after[1]) + 1
        and (first_expected is None or int(head[0][2]) == first_expected)
    )
    if not intact:
        expected = stream.acked + sum(chunks[:count])
        found = count_readable(lambda at, n: _run(conn, stream.key, at, n))
        raise RuntimeError(errors.spark_staging_lost(stream.key, expected, found))
    return count


def _run(conn: redis.Connection, key: str, offset: int, count: int) -> tuple[int, int]:
    conn.send_command("TREAD", key, offset, count, "NONULLS", "WITHINFO")
    info = conn.read_response()[0]
    return int(info[2]), int(info[3])


# ---------------------------------------------------------------------------
# The writers Spark calls
# ---------------------------------------------------------------------------


def _layout(options: WriteOptions, schema: StructType, overwrite: bool) -> WriteLayout:
    if overwrite:
        raise OptionError(errors.SPARK_OVERWRITE)
    return write_layout(schema, options.stream, "stream")


def _write(
    options: WriteOptions,
    layout: WriteLayout,
    job: str,
    items: Iterator[Any],
    streaming: bool,
    router: Router,
) -> StagedWrite:
    writer = TaskWriter(options, layout, job, streaming, router)
    try:
        for item in items:
            writer.add(item)
    except BaseException:
        writer.close()
        raise
    return writer.finish()


# Routers resolved in this process, by endpoint, and when. Spark builds a
# streaming writer again for every micro-batch's commit, in a Python worker
# it keeps for the next one: asking the server whether it is a cluster (a
# connection and CLUSTER SLOTS) at most every ROUTER_TTL_S seconds, not per
# commit, takes that off micro-batches' latency. A router that meets a
# moved slot or a lost node reads the slot map again by itself
# (cluster.Router.after); the TTL bounds how long a server that became (or
# stopped being) a cluster node at the same address goes unnoticed.
ROUTER_TTL_S = 30.0
_ROUTERS: dict[Endpoint, tuple[Router, float]] = {}


def _router(options: WriteOptions) -> Router:
    """Resolved on the driver (is the server a cluster, and its slot map),
    then shipped to every task with the writer."""
    cached = _ROUTERS.get(options.endpoint)
    now = time.monotonic()
    if cached is not None and cached[0].resolved and now - cached[1] < ROUTER_TTL_S:
        return cached[0]
    router = Router(options.endpoint)
    with Fleet(router) as fleet:
        fleet.call("finding the server's nodes", lambda f: f.router.resolve())
    _ROUTERS[options.endpoint] = (router, now)
    return router


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("rcp11").mode("append")``: all rows or none."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.layout = _layout(options, schema, overwrite)
        # One id for the whole job: this object travels to every task and
        # back to the driver's commit.
        self.job = uuid.uuid4().hex
        self.router = _router(options)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write(self.options, self.layout, self.job, iterator, False, self.router)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit(self.options, messages, None, self.router)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort(self.options, messages, 0, self.router)


class StreamWriter(_StreamWriterBase):
    """``writeStream.format("rcp11")``: each micro-batch exactly once."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.layout = _layout(options, schema, overwrite)
        self.job = uuid.uuid4().hex  # used only if Spark names no query
        self.router = _router(options)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write(self.options, self.layout, self.job, iterator, True, self.router)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit(self.options, messages, batchId, self.router)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort(self.options, messages, batchId, self.router)


# Our errors first in what Spark shows, in every worker (failures.py).
for _cls in (BatchWriter, StreamWriter):
    guard_methods(_cls, SPARK_CALLS)
