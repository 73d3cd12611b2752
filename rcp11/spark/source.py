"""The "rcp11" PySpark data source: batch and streaming reads and writes.

Rows have the schema ``offset LONG, value BINARY, key STRING``. Offsets that
were evicted (or lost in a crash) have no message, so they produce **no row**
rather than a row with a null value: a read returns exactly the messages
that are readable, in offset order within each partition, and ``offset``
tells where the gaps are.

Everything a Spark task needs travels in small picklable objects (options,
offset ranges); connections are opened inside ``read()`` / ``write()`` on the
executor, never in constructors, because Spark pickles readers and writers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

try:  # Spark >= 4.1 hands streaming writers Arrow batches too.
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - Spark 4.0 passes Rows
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]

try:  # Spark >= 4.2 has admission control and Trigger.AvailableNow for Python sources.
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older Spark 4.x
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Placeholder so the reader class can be declared on Spark < 4.2."""


if TYPE_CHECKING:
    from rcp11.client import Client

SCHEMA = "offset LONG, value BINARY, key STRING"
NAME = "rcp11"

# TREAD count per request inside a partition reader, and entries per TWRITE
# in writers; both can be changed with the "batchSize" option.
DEFAULT_READ_BATCH = 1000
DEFAULT_WRITE_BATCH = 100
# TWRITE commands sent in one pipeline round trip by a writer.
WRITE_PIPELINE_DEPTH = 16


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionOptions:
    """Where the server is and how to read/write; picklable, no socket inside."""

    host: str = "127.0.0.1"
    port: int = 6379
    password: str | None = None
    username: str | None = None
    key: str | None = None
    batch_size: int = DEFAULT_READ_BATCH

    def connect(self) -> Client:
        # Imported here so that unpickling options never needs redis-py on
        # the driver side of a plan that does not read or write.
        from rcp11.client import Client

        return Client(
            host=self.host, port=self.port, password=self.password, username=self.username
        )

    def require_key(self) -> str:
        if not self.key:
            raise ValueError(
                "rcp11 data source: option 'key' (the stream name) is required, "
                "e.g. .option('key', 'events') or .load('events')"
            )
        return self.key


def _int_option(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(
            f"rcp11 data source: option '{name}' must be an integer, got {text!r}"
        ) from None
    if value < minimum:
        raise ValueError(f"rcp11 data source: option '{name}' must be >= {minimum}, got {value}")
    return value


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    lowered = str(text).strip().lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    raise ValueError(f"rcp11 data source: option '{name}' must be true or false, got {text!r}")


def parse_connection(options: Mapping[str, str], default_batch: int) -> ConnectionOptions:
    # load("events") arrives as option "path"; an explicit "key" wins.
    key = options.get("key") or options.get("path")
    return ConnectionOptions(
        host=options.get("host", "127.0.0.1"),
        port=_int_option(options, "port", 6379, 1),
        password=options.get("password"),
        username=options.get("username"),
        key=key,
        batch_size=_int_option(options, "batchSize", default_batch, 1),
    )


@dataclass(frozen=True)
class StreamPosition:
    """A position option: 'earliest', 'latest', an offset, or -N (N before the end)."""

    kind: str  # "earliest" | "latest" | "absolute" | "fromEnd"
    value: int = 0

    @classmethod
    def parse(cls, name: str, text: str | None, default: str) -> StreamPosition:
        raw = (text if text is not None else default).strip()
        lowered = raw.lower()
        if lowered in ("earliest", "latest"):
            return cls(lowered)
        try:
            number = int(raw)
        except ValueError:
            raise ValueError(
                f"rcp11 data source: option '{name}' must be 'earliest', 'latest' or an "
                f"offset (negative -N: N messages before the end), got {text!r}"
            ) from None
        return cls("absolute", number) if number >= 0 else cls("fromEnd", -number)

    def resolve(self, first_offset: int, next_offset: int) -> int:
        if self.kind == "earliest":
            return first_offset
        if self.kind == "latest":
            return next_offset
        if self.kind == "fromEnd":
            return max(next_offset - self.value, 0)
        return self.value


def stream_bounds(client: Client, key: str) -> tuple[int, int]:
    """(first readable offset, next offset) of a stream."""
    info = client.tread(key, 0, 0, withinfo=True)
    return info.first_offset, info.next_offset


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of one stream."""

    start: int
    end: int


def split_range(start: int, end: int, partitions: int) -> list[OffsetRange]:
    """Cut [start, end) into at most ``partitions`` contiguous, near-equal ranges."""
    total = end - start
    if total <= 0:
        return []
    parts = max(1, min(partitions, total))
    base, extra = divmod(total, parts)
    ranges = []
    position = start
    for index in range(parts):
        size = base + (1 if index < extra else 0)
        ranges.append(OffsetRange(position, position + size))
        position += size
    return ranges


COLUMNS = ("offset", "value", "key")
# Spark type names each column may be declared with in a user schema.
ALLOWED_TYPES = {"offset": ("long",), "value": ("binary", "string"), "key": ("string",)}


@dataclass(frozen=True)
class Projection:
    """The columns a reader produces, in order, with their Spark types.

    A user schema (``spark.read.schema("value STRING, offset LONG")``) may
    pick and reorder columns and read ``value`` as UTF-8 text; the default
    is SCHEMA.
    """

    columns: tuple[str, ...] = COLUMNS
    types: tuple[str, ...] = ("long", "binary", "string")
    # As spelled in the schema, with nullability: Spark compares Arrow
    # schemas exactly.
    names: tuple[str, ...] = COLUMNS
    nullable: tuple[bool, ...] = (True, True, True)

    @classmethod
    def from_schema(cls, schema: StructType | None) -> Projection:
        if schema is None:
            return cls()
        columns = []
        types = []
        for schema_field in schema.fields:
            name = schema_field.name.lower()
            type_name = schema_field.dataType.typeName()
            if name not in ALLOWED_TYPES:
                raise ValueError(
                    f"rcp11 data source: unknown column {schema_field.name!r} in the schema; "
                    f"the columns are {', '.join(COLUMNS)} ({SCHEMA})"
                )
            if type_name not in ALLOWED_TYPES[name]:
                raise ValueError(
                    f"rcp11 data source: column {name!r} cannot be {type_name}; "
                    f"use {' or '.join(ALLOWED_TYPES[name])}"
                )
            columns.append(name)
            types.append(type_name)
        return cls(
            tuple(columns),
            tuple(types),
            tuple(schema.fieldNames()),
            tuple(f.nullable for f in schema.fields),
        )

    def arrow_schema(self) -> Any:
        import pyarrow as pa

        arrow_types = {"long": pa.int64(), "binary": pa.binary(), "string": pa.string()}
        return pa.schema(
            [
                pa.field(name, arrow_types[t], nullable)
                for name, t, nullable in zip(self.names, self.types, self.nullable, strict=True)
            ]
        )

    def record_batch(self, arrow_schema: Any, key: str, offsets: list[int], messages: list) -> Any:
        """One Arrow batch for these messages; Arrow avoids Spark's per-row conversion."""
        import pyarrow as pa

        arrays = []
        for name, type_name, arrow_field in zip(
            self.columns, self.types, arrow_schema, strict=True
        ):
            if name == "offset":
                values: list = offsets
            elif name == "key":
                values = [key] * len(offsets)
            elif type_name == "string":
                values = [bytes(m).decode(errors="replace") for m in messages]
            else:
                values = messages
            arrays.append(pa.array(values, type=arrow_field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def read_range(
    options: ConnectionOptions, partition: OffsetRange, projection: Projection | None = None
) -> Iterator[Any]:
    """Arrow record batches with the readable messages of one range."""
    key = options.require_key()
    projection = projection or Projection()
    arrow_schema = projection.arrow_schema()
    client = options.connect()
    try:
        offset = partition.start
        while offset < partition.end:
            want = min(options.batch_size, partition.end - offset)
            result = client.tread(key, offset, want, withinfo=True)
            if result.count == 0:
                # The stream ends before the range does: it was deleted and
                # recreated since planning. Nothing more to read here.
                return
            offsets: list[int] = []
            messages: list = []
            for message_offset, message in result.items():
                offsets.append(message_offset)
                messages.append(message)
            if offsets:
                yield projection.record_batch(arrow_schema, key, offsets, messages)
            # An evicted stretch would read as nulls: jump over it.
            offset = max(result.end, result.first_offset)
    finally:
        client.close()


class RCP11Reader(DataSourceReader):
    """Batch read of one stream between startingOffset and endingOffset."""

    def __init__(self, options: Mapping[str, str], schema: StructType | None = None) -> None:
        self.projection = Projection.from_schema(schema)
        self.connection = parse_connection(options, DEFAULT_READ_BATCH)
        self.connection.require_key()
        self.starting = StreamPosition.parse(
            "startingOffset", options.get("startingOffset"), "earliest"
        )
        self.ending = StreamPosition.parse("endingOffset", options.get("endingOffset"), "latest")
        self.partition_count = _int_option(options, "partitions", 1, 1)

    def partitions(self) -> Sequence[InputPartition]:
        client = self.connection.connect()
        try:
            first, next_offset = stream_bounds(client, self.connection.require_key())
        finally:
            client.close()
        start = max(self.starting.resolve(first, next_offset), first)
        end = min(self.ending.resolve(first, next_offset), next_offset)
        ranges = split_range(start, end, self.partition_count)
        # Spark wants at least one partition; an empty range reads nothing.
        return ranges or [OffsetRange(start, start)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.connection, partition, self.projection)


class RCP11StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch read; Spark checkpoints offsets as ``{"offset": next_to_read}``."""

    def __init__(self, options: Mapping[str, str], schema: StructType | None = None) -> None:
        self.projection = Projection.from_schema(schema)
        self.connection = parse_connection(options, DEFAULT_READ_BATCH)
        self.connection.require_key()
        self.starting = StreamPosition.parse(
            "startingOffset", options.get("startingOffset"), "latest"
        )
        self.partition_count = _int_option(options, "partitions", 1, 1)
        self.max_per_trigger = _int_option(options, "maxOffsetsPerTrigger", 0, 1) or None
        self.evict_on_commit = _bool_option(options, "evictOnCommit", False)
        self.available_now_target: int | None = None

    def _next_offset(self) -> int:
        client = self.connection.connect()
        try:
            return stream_bounds(client, self.connection.require_key())[1]
        finally:
            client.close()

    def initialOffset(self) -> dict:
        client = self.connection.connect()
        try:
            first, next_offset = stream_bounds(client, self.connection.require_key())
        finally:
            client.close()
        return {"offset": self.starting.resolve(first, next_offset)}

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_target = self._next_offset()

    def getDefaultReadLimit(self) -> Any:
        if self.max_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        # Reads the server only: planning a batch must not change anything.
        end = self._next_offset()
        if self.available_now_target is not None:
            end = min(end, self.available_now_target)
        if start is not None:
            begin = int(start["offset"])
            if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
                end = min(end, begin + limit.max_rows)
            end = max(end, begin)
        return {"offset": end}

    def reportLatestOffset(self) -> dict | None:
        return {"offset": self._next_offset()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return split_range(int(start["offset"]), int(end["offset"]), self.partition_count)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.connection, partition, self.projection)

    def commit(self, end: dict) -> None:
        """Spark is done with everything before ``end``; evict it if asked to."""
        last_done = int(end["offset"]) - 1
        if not self.evict_on_commit or last_done < 0:
            return
        client = self.connection.connect()
        try:
            client.tevict(self.connection.require_key(), last_done)
        finally:
            client.close()


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


@dataclass
class WriteSummary(WriterCommitMessage):
    """What one task wrote: rows, and per key the first and last offsets."""

    rows: int = 0
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(
        f"rcp11 data source: column 'value' must be binary or string, got "
        f"{type(value).__name__}; cast it first, e.g. df.selectExpr('CAST(x AS STRING) AS value')"
    )


class _StreamAppender:
    """Buffers rows into TWRITE batches per key and pipelines them."""

    def __init__(self, options: ConnectionOptions, schema: StructType) -> None:
        names = [name.lower() for name in schema.fieldNames()]
        self.options = options
        self.value_index = names.index("value")
        self.key_index = names.index("key") if "key" in names else None
        self.summary = WriteSummary()
        self.pending: dict[str, list[bytes]] = {}
        self.client: Client | None = None
        self.pipe: Any = None
        self.pipe_keys: list[tuple[str, int]] = []

    def add(self, key: str | None, value: Any) -> None:
        if key is None:
            key = self.options.require_key()
        if value is None:
            raise ValueError(
                f"rcp11 data source: row {self.summary.rows} has a null 'value'; "
                "streams hold messages, filter nulls out first"
            )
        entries = self.pending.setdefault(key, [])
        entries.append(_as_bytes(value))
        self.summary.rows += 1
        if len(entries) >= self.options.batch_size:
            self._queue(key)

    def add_all(self, items: Iterator[Any]) -> None:
        """Add Arrow record batches (Spark's Arrow writers) or Rows (older Spark)."""
        for item in items:
            if hasattr(item, "num_rows"):
                values = item.column(self.value_index).to_pylist()
                if self.key_index is None:
                    for value in values:
                        self.add(None, value)
                else:
                    keys = item.column(self.key_index).to_pylist()
                    for key, value in zip(keys, values, strict=True):
                        self.add(key, value)
            else:
                key = item[self.key_index] if self.key_index is not None else None
                self.add(key, item[self.value_index])

    def _queue(self, key: str) -> None:
        entries = self.pending.pop(key)
        if self.pipe is None:
            if self.client is None:
                self.client = self.options.connect()
            self.pipe = self.client.pipeline(transaction=False)
        self.pipe.twrite(key, *entries)
        self.pipe_keys.append((key, len(entries)))
        if len(self.pipe_keys) >= WRITE_PIPELINE_DEPTH:
            self._execute()

    def _execute(self) -> None:
        if self.pipe is None:
            return
        for (key, count), first in zip(self.pipe_keys, self.pipe.execute(), strict=True):
            previous = self.summary.offsets.get(key)
            start = previous[0] if previous else first
            self.summary.offsets[key] = (start, first + count - 1)
        self.pipe = None
        self.pipe_keys = []

    def finish(self) -> WriteSummary:
        try:
            for key in list(self.pending):
                self._queue(key)
            self._execute()
        finally:
            if self.client is not None:
                self.client.close()
        return self.summary


def _check_write_schema(schema: StructType, options: ConnectionOptions, overwrite: bool) -> None:
    names = [name.lower() for name in schema.fieldNames()]
    if "value" not in names:
        raise ValueError(
            "rcp11 data source: the DataFrame to write needs a 'value' column "
            f"(binary or string); it has {schema.fieldNames()}"
        )
    if "key" not in names:
        options.require_key()
    if overwrite:
        raise ValueError(
            "rcp11 data source: streams are append-only logs; write with mode('append')"
        )


class RCP11Writer(DataSourceArrowWriter):
    """Batch write: every row's value is appended with TWRITE (at least once)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.connection = parse_connection(options, DEFAULT_WRITE_BATCH)
        self.schema = schema
        _check_write_schema(schema, self.connection, overwrite)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        appender = _StreamAppender(self.connection, self.schema)
        appender.add_all(iterator)
        return appender.finish()


class RCP11StreamWriter(_StreamWriterBase):
    """Streaming write: each micro-batch is appended like a batch write.

    Appends are visible as soon as a task sends them, so a micro-batch that
    Spark retries may be written twice (at-least-once delivery).
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.connection = parse_connection(options, DEFAULT_WRITE_BATCH)
        self.schema = schema
        _check_write_schema(schema, self.connection, overwrite)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        appender = _StreamAppender(self.connection, self.schema)
        appender.add_all(iterator)
        return appender.finish()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: the messages were appended by the tasks already."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Appends cannot be taken back; readers may already have seen them."""


# ---------------------------------------------------------------------------
# The data source
# ---------------------------------------------------------------------------


class RCP11DataSource(DataSource):
    """``spark.read.format("rcp11")`` and friends.

    Options: ``host`` (127.0.0.1), ``port`` (6379), ``password``, ``username``,
    ``key`` (the stream; or ``.load(key)``), ``batchSize`` (messages per TREAD,
    default 1000; entries per TWRITE, default 100), ``partitions`` (input
    partitions per read or micro-batch, default 1).

    Batch read: ``startingOffset`` (``earliest`` default, ``latest``, an
    offset, or ``-N`` for the last N) and ``endingOffset`` (exclusive;
    ``latest`` default = everything written so far).

    Streaming read: ``startingOffset`` (``latest`` default, as Kafka's),
    ``maxOffsetsPerTrigger`` (honoured from Spark 4.2, which passes read
    limits to Python sources), ``evictOnCommit`` (``false`` default; ``true``
    TEVICTs everything Spark has committed to the source; Spark commits a
    micro-batch when it plans the next one, so the newest batch of a stopped
    query stays until the query runs again). Trigger.AvailableNow reads what
    existed when the query started and stops.

    Schema: ``offset LONG, value BINARY, key STRING``; a schema given with
    ``.schema(...)`` may choose a subset of these columns in any order, and
    ``value STRING`` decodes messages as UTF-8.

    Write (batch or streaming, mode append): column ``value`` (binary or
    string) is appended to ``key``; a string column ``key`` in the rows, when
    present and not null, chooses the stream per row.
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RCP11Reader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RCP11StreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return RCP11Writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return RCP11StreamWriter(self.options, schema, overwrite)
