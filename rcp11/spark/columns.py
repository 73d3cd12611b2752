"""Rows in and out: the read schema and its Arrow batches, built in bulk
from TREAD replies, and the TWRITE requests a sink task sends.

A read produces Arrow record batches (Spark's Python data source then skips
its per-row conversion). Every column is built with one Arrow call per
reply: values from the reply's list of bytes (nulls for evicted offsets,
dropped with one filter), offsets from a numpy range, the stream name
repeated, and -- when the projection has the timestamp column -- append
times from the reply of TREAD ... WITHTIMES (message, time, message, time
... in RESP2: every other element), milliseconds made Spark's microseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rcp11 import errors

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

SCHEMA = "stream STRING, offset BIGINT, value BINARY, timestamp TIMESTAMP"
COLUMNS = ("stream", "offset", "value", "timestamp")
# Spark type names each column may have in a user schema.
ALLOWED_TYPES = {
    "stream": ("string",),
    "offset": ("long",),
    "value": ("binary", "string"),
    "timestamp": ("timestamp",),
}
# Spark's Arrow types (pyspark.sql.pandas.types.to_arrow_type; a Python
# source's batches must match them exactly): TIMESTAMP is microseconds, UTC.
_ARROW_TYPES = {
    "long": pa.int64(),
    "binary": pa.binary(),
    "string": pa.string(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
# TREAD ... PACKED's length of an evicted offset (docs/PROTOCOL.md).
PACKED_MISSING = 0xFFFFFFFF
# The latest append time Spark's TIMESTAMP holds: 9999-12-31 23:59:59.999.
MAX_TIMESTAMP_MS = 253_402_300_799_999


class InvalidUtf8Error(ValueError):
    """A message read as ``value STRING`` is not UTF-8."""


@dataclass(frozen=True)
class Projection:
    """The columns a read produces, in order, with their Spark types.

    A user schema (``spark.read.schema("value STRING, offset BIGINT")``) may
    pick and reorder columns and ask for ``value`` as UTF-8 text.
    """

    columns: tuple[str, ...] = COLUMNS
    types: tuple[str, ...] = ("string", "long", "binary", "timestamp")
    names: tuple[str, ...] = COLUMNS  # as spelled in the schema
    nullable: tuple[bool, ...] = (True, True, True, True)  # Spark compares Arrow schemas exactly

    @classmethod
    def from_schema(cls, schema: StructType | None) -> Projection:
        if schema is None:
            return cls()
        columns, types = [], []
        for spark_field in schema.fields:
            name = spark_field.name.lower()
            type_name = spark_field.dataType.typeName()
            if name not in ALLOWED_TYPES:
                raise ValueError(errors.spark_schema_column(spark_field.name, SCHEMA))
            if type_name not in ALLOWED_TYPES[name]:
                raise ValueError(
                    errors.spark_schema_type(name, type_name, list(ALLOWED_TYPES[name]))
                )
            columns.append(name)
            types.append(type_name)
        return cls(
            tuple(columns),
            tuple(types),
            tuple(schema.fieldNames()),
            tuple(f.nullable for f in schema.fields),
        )

    @property
    def times(self) -> bool:
        """Whether the read needs append times (TREAD ... WITHTIMES)."""
        return "timestamp" in self.columns

    def arrow_schema(self) -> pa.Schema:
        return pa.schema(
            [
                pa.field(name, _ARROW_TYPES[t], nullable)
                for name, t, nullable in zip(self.names, self.types, self.nullable, strict=True)
            ]
        )

    def builder(self, stream: str) -> BatchBuilder:
        return BatchBuilder(self, stream)


# Rows per record batch handed to Spark. Spark's cost per batch is high:
# with 10,000-row batches its ingest of a Python source ran at 0.83M rows/s,
# with 100,000-row batches at 1.07M (local[2], 100-byte values). The byte
# cap keeps a batch of large messages from holding gigabytes.
ARROW_BATCH_ROWS = 100_000
ARROW_BATCH_BYTES = 16 << 20


class BatchBuilder:
    """Collects TREAD replies of one stream into record batches of about
    ARROW_BATCH_ROWS rows: each reply becomes Arrow arrays at once (one C
    call per column), a full batch is one concatenation."""

    def __init__(self, projection: Projection, stream: str) -> None:
        self.projection = projection
        self.schema = projection.arrow_schema()
        self.stream = stream
        self.values: list[pa.Array] = []
        self.offsets: list[pa.Array] = []
        self.times: list[pa.Array] = []
        self.rows = 0
        self.bytes = 0

    def add(
        self, start: int, elements: list[Any], count: int, packed: bool = True
    ) -> pa.RecordBatch | None:
        """Add a TREAD reply's elements for ``count`` offsets from
        ``start``: PACKED's bulk strings (lengths, messages, and times with
        the projection's timestamp), or (``packed`` False: a server without
        PACKED) one element per offset (message, time, ... with times; None
        where evicted). Returns a record batch when one is full."""
        if packed:
            values, times = packed_columns(elements, count, self.projection.times)
        else:
            values, times = element_columns(elements, self.projection.times)
        offsets = pa.array(np.arange(start, start + count, dtype=np.int64))
        if values.null_count:
            present = values.is_valid()
            values = values.filter(present)
            offsets = offsets.filter(present)
            if times is not None:
                times = times.filter(present)
        if len(values):
            self.values.append(values)
            self.offsets.append(offsets)
            if times is not None:
                self.times.append(times)
            self.rows += len(values)
            self.bytes += values.nbytes
        if self.rows >= ARROW_BATCH_ROWS or self.bytes >= ARROW_BATCH_BYTES:
            return self.flush()
        return None

    def flush(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        values = _joined(self.values)
        offsets = _joined(self.offsets)
        times = _joined(self.times) if self.times else None
        rows = self.rows
        self.values, self.offsets, self.times, self.rows, self.bytes = [], [], [], 0, 0
        arrays = []
        for name, type_name in zip(self.projection.columns, self.projection.types, strict=True):
            if name == "offset":
                arrays.append(offsets)
            elif name == "timestamp":
                assert times is not None
                arrays.append(as_timestamps(times, self.stream, offsets))
            elif name == "stream":
                arrays.append(pa.repeat(self.stream, rows))
            elif type_name == "string":
                arrays.append(as_text(values, self.stream, offsets))
            else:
                arrays.append(values)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def packed_columns(parts: list[bytes], count: int, times: bool) -> tuple[pa.Array, pa.Array | None]:
    """The binary values (null where evicted) and the times (ms) of a TREAD
    ... PACKED reply, built from its buffers without a Python object per
    message: lengths are little-endian uint32 (0xFFFFFFFF: evicted)."""
    lengths = np.frombuffer(parts[0], dtype="<u4", count=count)
    missing = lengths == PACKED_MISSING
    sizes = np.where(missing, 0, lengths) if missing.any() else lengths
    ends = np.empty(count + 1, dtype=np.int64)
    ends[0] = 0
    np.cumsum(sizes, out=ends[1:])
    data = pa.py_buffer(parts[1])
    validity = pa.array(~missing).buffers()[1] if missing.any() else None
    if ends[-1] < 2**31:
        values = pa.Array.from_buffers(
            pa.binary(), count, [validity, pa.py_buffer(ends.astype(np.int32)), data]
        )
    else:  # a reply of 2 GB or more: Arrow's binary needs 64-bit offsets, then fails
        values = pa.Array.from_buffers(
            pa.large_binary(), count, [validity, pa.py_buffer(ends), data]
        ).cast(pa.binary())
    stamps = pa.array(np.frombuffer(parts[2], dtype="<i8", count=count)) if times else None
    return values, stamps


def element_columns(elements: list[Any], times: bool) -> tuple[pa.Array, pa.Array | None]:
    """The values and times (ms) of a reply with one element per offset
    (message, time, message, time ... with times)."""
    stamps = None
    if times:
        stamps = pa.array(elements[1::2], type=pa.int64())
        elements = elements[0::2]
    return pa.array(elements, type=pa.binary()), stamps


def _joined(arrays: list[pa.Array]) -> pa.Array:
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def as_timestamps(times_ms: pa.Array, stream: str, offsets: pa.Array) -> pa.Array:
    """Append times (unix ms) as Spark's TIMESTAMP (microseconds, UTC). A
    time past year 9999 (only an AOF written by hand can give one) is an
    error naming its offset, never a wrapped-around date."""
    millis = times_ms.to_numpy(zero_copy_only=False)
    late = np.flatnonzero(millis > MAX_TIMESTAMP_MS)
    if len(late):
        offset = offsets[int(late[0])].as_py()
        raise ValueError(errors.spark_time_out_of_range(stream, offset, int(millis[late[0]])))
    return pa.array(millis * 1000, type=_ARROW_TYPES["timestamp"])


def as_text(values: pa.Array, stream: str, offsets: pa.Array) -> pa.Array:
    """Binary to UTF-8 text; an invalid message is an error naming its
    offset, never replacement characters."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        for offset, message in zip(offsets.to_pylist(), values.to_pylist(), strict=True):
            try:
                message.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidUtf8Error(errors.spark_invalid_utf8(stream, offset)) from None
        raise


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteLayout:
    """Where a sink finds the value and the per-row target in its input."""

    value_index: int
    target_index: int | None  # the stream/topic column, when no option names the target
    target_column: str | None


def write_layout(schema: StructType, target_option: str | None, option_name: str) -> WriteLayout:
    """Check a DataFrame to write (Kafka's sink rules, minus the key)."""
    names = [name.lower() for name in schema.fieldNames()]
    types = {f.name.lower(): f.dataType.typeName() for f in schema.fields}
    # Kafka's sink columns that rcp11 has no place for: refused, never
    # dropped silently (a Kafka-shaped frame would lose them unnoticed).
    for column, problem in (
        ("key", errors.SPARK_KEY_COLUMN),
        ("headers", errors.SPARK_HEADERS_COLUMN),
        ("partition", errors.SPARK_PARTITION_COLUMN),
    ):
        if column in names:
            raise ValueError(problem)
    if "value" not in names:
        raise ValueError(
            errors.spark_write_column("value", f"is missing; the DataFrame has {names}")
        )
    if types["value"] not in ("binary", "string"):
        raise ValueError(
            errors.spark_write_column(
                "value", f"must be binary or string, not {types['value']}; cast it first"
            )
        )
    target_columns = [name for name in ("stream", "topic") if name in names]
    if target_option is not None:
        if target_columns:
            raise ValueError(errors.spark_target_column_conflict(option_name, target_columns[0]))
        return WriteLayout(names.index("value"), None, None)
    if not target_columns:
        raise ValueError(errors.SPARK_NO_TARGET)
    if len(target_columns) > 1:
        raise ValueError(errors.spark_target_column_conflict("stream", "topic"))
    column = target_columns[0]
    if types[column] != "string":
        raise ValueError(
            errors.spark_write_column(column, f"must be a string, not {types[column]}")
        )
    return WriteLayout(names.index("value"), names.index(column), column)


def binary_values(column: pa.Array, row_base: int) -> pa.BinaryArray:
    """A value column as binary; a null is an error (streams hold messages)."""
    if column.null_count:
        first_null = column.is_null().to_pylist().index(True)
        raise ValueError(
            errors.spark_write_column(
                "value", f"is null in row {row_base + first_null} of this task; filter nulls out"
            )
        )
    if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary()).cast(pa.binary())
    elif not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())
    return column


# "\r\n$<length>\r\n" by length: the framing between two entries of a
# TWRITE. Joining cached heads with the values costs half of formatting
# each entry (140 vs 270 ns per 100-byte entry).
_HEADS: dict[int, bytes] = {}


def _head(length: int) -> bytes:
    head = _HEADS.get(length)
    if head is None:
        head = _HEADS[length] = b"\r\n$%d\r\n" % length
    return head


def twrite_cuts(values: pa.BinaryArray, max_rows: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """[begin, end) row ranges of ``values`` for one TWRITE each: at most
    ``max_rows`` rows and ``max_bytes`` bytes of messages (a larger message
    goes alone)."""
    count = len(values)
    if count == 0:
        return
    ends = np.frombuffer(
        values.buffers()[1], dtype=np.int32, count=count + 1, offset=4 * values.offset
    )
    begin = 0
    while begin < count:
        end = min(count, begin + max_rows)
        fit = int(np.searchsorted(ends, int(ends[begin]) + max_bytes, side="right")) - 1
        end = max(begin + 1, min(end, fit))
        yield begin, end
        begin = end


def pack_twrite(key: bytes, values: list[bytes]) -> bytes:
    """``TWRITE key ENTRIES v1 v2 ...`` as RESP, built in one join."""
    heads = [_HEADS.get(length) or _head(length) for length in map(len, values)]
    parts: list[bytes] = [b""] * (2 * len(values))
    parts[0::2] = heads
    parts[1::2] = values
    command = b"*%d\r\n$6\r\nTWRITE\r\n$%d\r\n%b\r\n$7\r\nENTRIES" % (
        len(values) + 3,
        len(key),
        key,
    )
    return command + b"".join(parts) + b"\r\n"


def split_by_target(
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


def row_batch(row: Any, layout: WriteLayout) -> pa.RecordBatch:
    """A Spark Row as a one-row batch (Spark 4.0 hands writers Rows)."""
    columns = [pa.array([row[layout.value_index]])]
    names = ["value"]
    if layout.target_index is not None:
        columns.append(pa.array([row[layout.target_index]], type=pa.string()))
        names.append("target")
    batch = pa.RecordBatch.from_arrays(columns, names=names)
    return batch
