"""What a Kafka user of Structured Streaming expects of the rcp11 source and
sink (docs/SPARK.md): a batch read whose start is after its end refused,
option sets no query can take refused at load(), a streaming-only mistake
reported alone when the query starts, Kafka's `headers` and `partition`
columns refused by the sink, failOnDataLoss=false warnings that say what
was done, a commit that fails in a streaming query, and the real-time
trigger, which a Python data source cannot serve.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess
from helpers_spark import (
    fill,
    flushed_client,
    parquet_rows,
    reader,
    run_available_now,
    stream_reader,
    to_parquet,
)

from rcp11 import errors
from rcp11.client import Client

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


@pytest.fixture
def client(shared_server: ServerProcess) -> Iterator[Client]:
    yield from flushed_client(shared_server)


# ---------------------------------------------------------------------------
# Batch reads: the start after the end
# ---------------------------------------------------------------------------


def test_a_batch_read_whose_start_is_after_its_end_is_refused(spark, shared_server, client) -> None:
    fill(client, "a", 10)
    fill(client, "b", 10)
    # Numbers the options give: refused at load(), before any read.
    with pytest.raises(Exception, match="stream 'a' would be read from offset 7 to 3"):
        reader(
            spark,
            shared_server,
            subscribe="a,b",
            startingOffsets='{"a": 7, "b": 0}',
            endingOffsets='{"a": 3, "b": 5}',
        ).load()
    with pytest.raises(Exception, match="startingTimestamp 2000 ms is after endingTimestamp 1000"):
        reader(
            spark, shared_server, subscribe="a", startingTimestamp=2000, endingTimestamp=1000
        ).load()
    # Positions resolved when the query runs (an end by time): refused then.
    with pytest.raises(Exception, match="stream 'b' would be read from offset 5 to 0"):
        reader(
            spark,
            shared_server,
            subscribe="b",
            startingOffsets='{"b": 5}',
            endingTimestamp=1,  # before every message: the end is offset 0
        ).load().count()
    # A start equal to the end reads nothing, as in Kafka.
    df = reader(
        spark, shared_server, subscribe="a", startingOffsets='{"a": 4}', endingOffsets='{"a": 4}'
    )
    assert df.load().count() == 0


# ---------------------------------------------------------------------------
# Options checked at load()
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (
            {"endingOffsets": "latest", "maxOffsetsPerTrigger": "10"},
            "endingOffsets can only be given to a batch query .* maxOffsetsPerTrigger only to a "
            "streaming one",
        ),
        (
            {"endingTimestamp": "5", "evictOnCommit": "true"},
            "endingTimestamp can only be given to a batch query",
        ),
        (
            {"startingOffsets": "latest", "endingOffsets": "latest"},
            "startingOffsets=latest only to a streaming one",
        ),
        ({"endingOffsets": "earliest"}, "endingOffsets cannot be 'earliest'"),
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
def test_options_no_query_can_take_fail_at_load(
    spark, shared_server, options, problem, streaming
) -> None:
    read = stream_reader if streaming else reader
    with pytest.raises(Exception, match=problem):
        read(spark, shared_server, subscribe="a", **options).load()


@pytest.mark.parametrize(
    ("options", "schema", "problem"),
    [
        ({"endingOffsets": "latest"}, None, "endingOffsets applies to batch queries only"),
        ({}, "nope STRING", "unknown column 'nope' in the schema"),
    ],
)
def test_a_streaming_only_mistake_is_reported_alone_when_the_query_starts(
    spark, shared_server, client, tmp_path, options, schema, problem
) -> None:
    """PySpark gives a data source no way to know at load() that the read
    is a streaming one; the error comes when the query starts, without
    PySpark's UnboundLocalError beside it."""
    fill(client, "a", 3)
    read = stream_reader(spark, shared_server, subscribe="a", **options)
    if schema is not None:
        read = read.schema(schema)
    query = run_available_now(to_parquet(read.load(), tmp_path))
    text = str(query.exception())
    assert problem in text
    assert "UnboundLocalError" not in text


# ---------------------------------------------------------------------------
# The sink: Kafka's columns rcp11 has no place for
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "problem"),
    [
        ("headers", "'headers' column, but rcp11 messages have no headers"),
        ("partition", "'partition' column, but an rcp11 stream is one ordered log"),
    ],
)
def test_the_sink_refuses_headers_and_partition_columns(
    spark, shared_server, client, tmp_path, column, problem
) -> None:
    types = {"headers": "array<struct<key:string,value:binary>>", "partition": "int"}
    values = {"headers": [], "partition": 0}
    frame = spark.createDataFrame(
        [("v", values[column])], f"value string, {column} {types[column]}"
    )
    with pytest.raises(Exception, match=problem):
        frame.write.format("rcp11").mode("append").option("port", shared_server.port).option(
            "stream", "out"
        ).save()
    fill(client, "src", 2)
    streaming = stream_reader(spark, shared_server, subscribe="src", startingOffsets="earliest")
    shaped = streaming.load().selectExpr("value", f"CAST(0 AS INT) AS {column}")
    if column == "headers":
        shaped = streaming.load().selectExpr(
            "value", "array(named_struct('key', 'k', 'value', value)) AS headers"
        )
    with pytest.raises(Exception, match=problem):
        query = run_available_now(
            shaped.writeStream.format("rcp11")
            .option("port", shared_server.port)
            .option("stream", "out")
            .option("checkpointLocation", str(tmp_path / "c"))
        )
        raise AssertionError(query.exception())
    assert client.exists("out") == 0


# ---------------------------------------------------------------------------
# failOnDataLoss=false: the warning says what was done
# ---------------------------------------------------------------------------


def test_data_loss_texts_say_what_to_do_or_what_was_done(caplog) -> None:
    from rcp11.spark.source import DataLossError, LossReport

    failing = errors.spark_data_loss("s", 3, 7, "evicted", True)
    assert failing.endswith("(evicted). Set failOnDataLoss=false to skip them")
    with pytest.raises(DataLossError, match="Set failOnDataLoss=false to skip them"):
        LossReport("s", True).lost(3, 7, "evicted")
    with caplog.at_level(logging.WARNING, logger="rcp11.spark"):
        LossReport("s", False).lost(3, 7, "evicted")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.endswith("(evicted); skipped them (failOnDataLoss=false)")
    assert "Set failOnDataLoss" not in warning
    for fail in (True, False):
        for text in (
            errors.spark_stream_deleted("s", 5, fail),
            errors.spark_stream_recreated("s", 2, 5, fail),
        ):
            assert ("Set failOnDataLoss=false" in text) == fail
            assert ("(failOnDataLoss=false)" in text) != fail


# ---------------------------------------------------------------------------
# A commit that fails in a streaming query
# ---------------------------------------------------------------------------


def test_a_failed_streaming_commit_stops_the_query_and_a_restart_commits_once(
    spark, shared_server, client, tmp_path
) -> None:
    """Spark runs a failed batch write again, a failed streaming commit it
    does not: the query stops with the error. Restarted from its
    checkpoint, it commits the same micro-batch, once (docs/SPARK.md)."""
    fill(client, "src", 5)
    client.set("out", "a string where the stream should be")

    def run() -> Any:
        frame = stream_reader(spark, shared_server, subscribe="src", startingOffsets="earliest")
        return run_available_now(
            frame.load()
            .select("value")
            .writeStream.format("rcp11")
            .option("port", shared_server.port)
            .option("stream", "out")
            .option("checkpointLocation", str(tmp_path / "c"))
        )

    query = run()
    assert "cannot write to 'out': the key holds a string" in str(query.exception())
    client.delete("out")
    assert run().exception() is None
    assert client.tread("out", 0, 100) == [b"src%d" % i for i in range(5)]
    assert run().exception() is None  # nothing new: nothing written again
    assert client.tread("out", 0, 100) == [b"src%d" % i for i in range(5)]


# ---------------------------------------------------------------------------
# The real-time trigger
# ---------------------------------------------------------------------------


def test_the_real_time_trigger_is_not_served_by_a_python_data_source(
    spark, shared_server, client, tmp_path
) -> None:
    """Spark 4.1+'s trigger(realTime=...) needs a source whose stream
    implements SupportsRealTimeMode (a JVM interface) and a sink on its
    allowlist; PySpark's Python data sources offer neither (docs/SPARK.md).
    The day this fails, PySpark has added it: support it then."""
    fill(client, "src", 3)
    frame = stream_reader(spark, shared_server, subscribe="src", startingOffsets="earliest")
    query = (
        frame.load()
        .writeStream.format("console")
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "c"))
        .trigger(realTime="5 seconds")
        .start()
    )
    try:
        query.awaitTermination(120)
    except Exception:  # noqa: BLE001 - the error is read from the query below
        pass
    assert "STREAMING_REAL_TIME_MODE.INPUT_STREAM_NOT_SUPPORTED" in str(query.exception())
    assert "PythonMicroBatchStream" in str(query.exception())
    assert parquet_rows(spark, Path(tmp_path)) == []
