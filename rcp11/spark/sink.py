"""Writing, exactly once: the writers Spark calls, and the task side that
stages each task's rows in private streams (one per target), reconnecting
through short outages without writing anything twice. The commit that
moves staged rows into the target is rcp11.spark.commit.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from rcp11 import errors
from rcp11.spark.columns import WriteLayout, binary_values, pack_twrite, write_layout
from rcp11.spark.commit import Staged, StagedWrite, abort, commit, sink_key
from rcp11.spark.connection import RETRYABLE, Outage, raw_connection
from rcp11.spark.options import OptionError, WriteOptions

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


# ---------------------------------------------------------------------------
# Task side
# ---------------------------------------------------------------------------


class _StagingStream:
    """One target's staging stream in one task: rows sent, rows the server
    acknowledged, and the requests still in flight (for a resend)."""

    def __init__(self, target: str, key: str) -> None:
        self.target = target
        self.key = key
        self.encoded = key.encode()
        self.acked = 0
        self.sent = 0


class TaskWriter:
    """Stages one task's rows (one staging stream per target it meets)."""

    def __init__(
        self, options: WriteOptions, layout: WriteLayout, job: str, streaming: bool = False
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
        self.query = query or job
        self.batch = int(batch) if batch is not None else 0
        self.partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        # The nonce keeps a task of a restarted driver (same batch, partition
        # and attempt number) away from a dead driver's staging stream.
        self.suffix = f"{self.batch}:{self.partition}:{attempt}:{secrets.token_hex(4)}"
        self.streams: dict[str, _StagingStream] = {}
        self.rows = 0
        self.conn: redis.Connection | None = None
        self.in_flight: deque[tuple[_StagingStream, int, bytes]] = deque()
        self.outage: Outage | None = None

    # -- input ----------------------------------------------------------

    def add(self, item: Any) -> None:
        """One Arrow record batch (or a Spark Row on Spark 4.0)."""
        batch = item if hasattr(item, "num_rows") else _row_batch(item, self.layout)
        values = binary_values(batch.column(self.layout.value_index), self.rows)
        if self.layout.target_index is None:
            assert self.options.stream is not None
            self._stage(self.options.stream, values)
        else:
            column = batch.column(self.layout.target_index)
            for target, part in _split_by_target(column, values, self.layout.target_column):
                self._stage(target, part)
        self.rows += batch.num_rows

    def _stage(self, target: str, values: pa.Array) -> None:
        stream = self.streams.get(target)
        if stream is None:
            key = sink_key(target, self.query, self.suffix)
            stream = self.streams[target] = _StagingStream(target, key)
            registry = sink_key(target, self.query, "staged")
            self._run_now(("TWRITE", registry, f"{self.batch} {key}"))
        step = self.options.batch_size
        for begin in range(0, len(values), step):
            chunk = values.slice(begin, step).to_pylist()
            self._send(stream, len(chunk), pack_twrite(stream.encoded, chunk))

    # -- the connection -------------------------------------------------
    #
    # TWRITEs are pipelined (WRITE_PIPELINE_DEPTH in flight). When the
    # connection breaks, a TWRITE in flight may or may not have been applied;
    # it is atomic, and the staging stream is this task's alone, so its next
    # offset says exactly which ones were: those are counted, the others
    # sent again on a new connection.

    def _connection(self) -> redis.Connection:
        if self.conn is None:
            self.conn = raw_connection(self.options.endpoint)
        return self.conn

    def _run_now(self, command: tuple[Any, ...]) -> Any:
        """A command that may safely run twice (registering a staging key)."""
        self._drain(0)
        while True:
            try:
                conn = self._connection()
                conn.send_command(*command)
                reply = conn.read_response()
                self.outage = None
                return reply
            except RETRYABLE as exc:
                self._recover(exc)

    def _send(self, stream: _StagingStream, rows: int, packed: bytes) -> None:
        self._drain(WRITE_PIPELINE_DEPTH - 1)
        self.in_flight.append((stream, rows, packed))
        stream.sent += rows
        try:
            self._connection().send_packed_command([packed])
        except RETRYABLE as exc:
            self._recover(exc)

    def _drain(self, keep: int) -> None:
        """Read replies until at most ``keep`` requests are in flight."""
        while len(self.in_flight) > keep:
            try:
                reply = self._connection().read_response()
            except RETRYABLE as exc:
                self._recover(exc)
                continue
            self.outage = None
            stream, rows, _ = self.in_flight.popleft()
            if isinstance(reply, redis.ResponseError):
                raise reply
            stream.acked += rows

    def _recover(self, exc: BaseException) -> None:
        """Reconnect, count the in-flight TWRITEs the server applied, resend
        the rest; raise when the outage outlasts retryTimeoutMs or a staging
        stream is not what this task wrote (then Spark retries the task)."""
        if self.outage is None:
            self.outage = Outage(self.options.endpoint, "writing staging streams")
        while True:
            if self.conn is not None:
                self.conn.disconnect()
                self.conn = None
            self.outage.wait(exc)
            try:
                self._resend()
                return
            except RETRYABLE as again:
                exc = again

    def _resend(self) -> None:
        conn = self._connection()
        pending = list(self.in_flight)
        streams = list({id(s): s for s, _, _ in pending}.values())
        for stream in streams:
            conn.send_command("TREAD", stream.key, 0, 0, "WITHINFO")
        server = {}
        for stream in streams:
            info = conn.read_response()[0]
            server[id(stream)] = (int(info[0]), int(info[1]) + 1)
        resend = []
        for stream in streams:
            first, have = server[id(stream)]
            applied = stream.acked
            for owner, rows, packed in pending:
                if owner is not stream:
                    continue
                if applied + rows <= have:
                    applied += rows
                else:
                    resend.append((owner, rows, packed))
            if applied != have or (have and first != 0):
                raise RuntimeError(errors.spark_staging_lost(stream.key, applied, have))
            stream.acked = applied
        self.in_flight = deque(resend)
        for _, _, packed in resend:
            conn.send_packed_command([packed])

    def finish(self) -> StagedWrite:
        try:
            self._drain(0)
        finally:
            if self.conn is not None:
                self.conn.disconnect()
                self.conn = None
        staged = [Staged(s.target, s.key, s.acked) for s in self.streams.values()]
        return StagedWrite(self.query, self.batch, self.partition, staged)


def _split_by_target(
    targets: pa.Array, values: pa.Array, column: str | None
) -> Iterator[tuple[str, pa.Array]]:
    """(target, its values in row order) for a batch with a target column."""
    if targets.null_count:
        raise ValueError(
            errors.spark_write_column(column or "stream", "is null in a row; every row needs one")
        )
    encoded = pc.dictionary_encode(targets)
    names = encoded.dictionary.to_pylist()
    if len(names) == 1:
        yield names[0], values
        return
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    ordered = values.take(pa.array(order))
    sorted_codes = codes[order]
    cuts = [0, *(np.flatnonzero(np.diff(sorted_codes)) + 1).tolist(), len(order)]
    for begin, end in zip(cuts, cuts[1:], strict=False):
        yield names[sorted_codes[begin]], ordered.slice(begin, end - begin)


def _row_batch(row: Any, layout: WriteLayout) -> pa.RecordBatch:
    """A Spark Row as a one-row batch (Spark 4.0 hands writers Rows)."""
    columns = [pa.array([row[layout.value_index]])]
    names = ["value"]
    if layout.target_index is not None:
        columns.append(pa.array([row[layout.target_index]], type=pa.string()))
        names.append("target")
    batch = pa.RecordBatch.from_arrays(columns, names=names)
    return batch


# ---------------------------------------------------------------------------
# The writers Spark calls
# ---------------------------------------------------------------------------


def _layout(options: WriteOptions, schema: StructType, overwrite: bool) -> WriteLayout:
    if overwrite:
        raise OptionError(errors.SPARK_OVERWRITE)
    return write_layout(schema, options.stream, "stream")


def _write(
    options: WriteOptions, layout: WriteLayout, job: str, items: Iterator[Any], streaming: bool
) -> StagedWrite:
    writer = TaskWriter(options, layout, job, streaming)
    try:
        for item in items:
            writer.add(item)
    except BaseException:
        if writer.conn is not None:
            writer.conn.disconnect()
        raise
    return writer.finish()


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("rcp11").mode("append")``: all rows or none."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.layout = _layout(options, schema, overwrite)
        # One id for the whole job: this object travels to every task and
        # back to the driver's commit.
        self.job = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write(self.options, self.layout, self.job, iterator, streaming=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit(self.options, messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort(self.options, messages, 0)


class StreamWriter(_StreamWriterBase):
    """``writeStream.format("rcp11")``: each micro-batch exactly once."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.layout = _layout(options, schema, overwrite)
        self.job = uuid.uuid4().hex  # used only if Spark names no query

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write(self.options, self.layout, self.job, iterator, streaming=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort(self.options, messages, batchId)
