"""What the Spark data source's test files share: readers of a server,
rows as tuples, filling streams, running a streaming query to the end of
what exists, and a task that fails once (test_spark.py,
test_spark_timestamps.py, test_spark_redis_cluster.py; a test file never
imports another test file). The SparkSession itself is conftest's `spark`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import ServerProcess

from rcp11.client import Client


def flushed_client(server: ServerProcess) -> Iterator[Client]:
    """A fixture's body: an rcp11 client of server, the database flushed
    first, closed after the test."""
    c = Client(host="127.0.0.1", port=server.port)
    c.flushall()
    yield c
    c.close()


def reader(spark: Any, server: ServerProcess, **options: object) -> Any:
    read = spark.read.format("rcp11").option("port", server.port)
    for name, value in options.items():
        read = read.option(name, str(value))
    return read


def stream_reader(spark: Any, server: ServerProcess, **options: object) -> Any:
    read = spark.readStream.format("rcp11").option("port", server.port)
    for name, value in options.items():
        read = read.option(name, str(value))
    return read


def rows(df: Any) -> list[tuple[str, int, bytes]]:
    return [(row.stream, row.offset, bytes(row.value)) for row in df.collect()]


def fill(client: Client, key: str, count: int, prefix: str | None = None) -> None:
    prefix = prefix if prefix is not None else key
    client.twrite(key, *[f"{prefix}{i}".encode() for i in range(count)])


def run_available_now(df_writer: Any, timeout: float = 120) -> Any:
    """Start with Trigger.AvailableNow and wait; a failure is left in
    query.exception() for the test to look at."""
    from pyspark.errors import StreamingQueryException

    query = df_writer.trigger(availableNow=True).start()
    try:
        query.awaitTermination(timeout)
    except StreamingQueryException:
        pass
    return query


def to_parquet(df: Any, tmp: Path, name: str = "out") -> Any:
    return (
        df.writeStream.format("parquet")
        .option("path", str(tmp / name))
        .option("checkpointLocation", str(tmp / f"{name}-checkpoint"))
    )


def parquet_rows(spark: Any, tmp: Path, name: str = "out") -> list[tuple[str, int, bytes]]:
    if not (tmp / name).exists():
        return []
    return sorted(rows(spark.read.parquet(str(tmp / name))))


def failing_once() -> Any:
    """A mapInArrow function: partition 0's first attempt dies after passing
    on two batches. A closure made per call, so it travels by value
    (executors cannot import the test modules)."""

    def fail_first_attempt(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        for index, batch in enumerate(batches):
            yield batch
            if index == 1 and context.partitionId() == 0 and context.attemptNumber() == 0:
                raise RuntimeError("failing on purpose, once")

    return fail_first_attempt
