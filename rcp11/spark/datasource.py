"""The "rcp11" data source class that Spark instantiates.

Spark builds it when a DataFrame is defined (``load()``, ``save()``,
``start()``) and pickles it to its Python workers. Its constructor checks
every option (names and values, and sets no query of any kind can take),
so a typo fails at ``load()`` with the list of known options instead of at
the first action. What depends on the side (read or write) or on the kind
of query is checked when Spark asks for a reader or writer: PySpark tells
a Python data source neither at ``load()`` (it only builds it and asks
for its schema), so a streaming-only mistake (``endingOffsets`` on a
streaming query) surfaces when the query starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn

from pyspark.sql.datasource import DataSource

from rcp11 import errors
from rcp11.spark.columns import SCHEMA
from rcp11.spark.failures import SPARK_CALLS, guard_methods
from rcp11.spark.options import (
    OPTIONS,
    OptionError,
    check_all,
    parse_read_options,
    parse_write_options,
)
from rcp11.spark.sink import BatchWriter, StreamWriter
from rcp11.spark.source import BatchReader, StreamReader

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

NAME = "rcp11"


def _check_side(options: Mapping[str, str], side: str) -> None:
    """Options of the other side are an error, not silently ignored (a
    writer's 'subscribe' or a reader's 'stream' is always a mistake)."""
    for name in options:
        for doc in OPTIONS:
            if doc.name.lower() != name.lower():
                continue
            if side == "write" and doc.applies in ("read", "batch read", "streaming read"):
                raise OptionError(errors.spark_option_scope(doc.name, "writes", "reads"))
            if side == "read" and doc.applies == "write":
                raise OptionError(errors.spark_option_scope(doc.name, "reads", "writes"))


class RCP11DataSource(DataSource):
    """``spark.read.format("rcp11")`` / ``readStream`` / ``write`` /
    ``writeStream``. Options, schema and guarantees: docs/SPARK.md."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        check_all(self.options)

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> BatchReader:
        _check_side(self.options, "read")
        return BatchReader(parse_read_options(self.options), schema)

    def streamReader(self, schema: StructType) -> StreamReader:
        try:
            _check_side(self.options, "read")
            return StreamReader(parse_read_options(self.options), schema)
        except Exception as exc:
            # PySpark's streaming runner stops the reader in a `finally`
            # around this call, so a failure here turns into its own
            # UnboundLocalError ('reader'), and our message is lost under
            # it. A reader that fails at Spark's first call keeps it.
            return _FailedStreamReader(exc)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        _check_side(self.options, "write")
        return BatchWriter(parse_write_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        _check_side(self.options, "write")
        return StreamWriter(parse_write_options(self.options), schema, overwrite)


class _FailedStreamReader(StreamReader):
    """A streaming read whose options were refused: every call Spark makes
    raises that error; stop() has nothing to stop."""

    def __init__(self, error: Exception) -> None:  # no super(): nothing to set up
        self.error = error

    def _fail(self, *args: object, **kwargs: object) -> NoReturn:
        raise self.error

    initialOffset = latestOffset = partitions = read = commit = _fail
    prepareForTriggerAvailableNow = getDefaultReadLimit = reportLatestOffset = _fail

    def stop(self) -> None:
        pass


# Every method Spark calls on the data source, so that each of our errors
# shows its message first (failures.py). The readers and writers guard
# themselves in their own modules: a task or a commit unpickles them
# without ever loading this one.
for _cls in (RCP11DataSource, _FailedStreamReader):
    guard_methods(_cls, SPARK_CALLS)
