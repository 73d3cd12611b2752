"""The "rcp11" PySpark data source against a real server, in a local Spark.

Evicted offsets produce no row (the reader skips them); these tests pin that
choice down along with offsets in the streaming checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, ServerProcess

from rcp11.client import Client

# pyspark warns about the installed pandas major version; the source does not use pandas.
pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    from rcp11.spark import register

    # Spark's Python workers must import rcp11 even from a checkout that was
    # not pip-installed; they inherit PYTHONPATH from this process.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), saved) if p)
    session = (
        SparkSession.builder.master("local[1]")
        .appName("rcp11-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "512m")
        .config("spark.default.parallelism", "1")
        # No empty trailing micro-batches: each costs a planning round.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture
def client(shared_server: ServerProcess) -> Iterator[Client]:
    c = Client(host="127.0.0.1", port=shared_server.port)
    c.flushall()
    yield c
    c.close()


def reader(spark, srv: ServerProcess, **options: object):
    read = spark.read.format("rcp11").option("host", "127.0.0.1").option("port", srv.port)
    for name, value in options.items():
        read = read.option(name, str(value))
    return read


def rows(df) -> list[tuple[int, bytes, str]]:
    return [(row.offset, bytes(row.value), row.key) for row in df.collect()]


# ---------------------------------------------------------------------------
# Batch read
# ---------------------------------------------------------------------------


def test_batch_read_skips_evicted_offsets_across_partitions(spark, shared_server, client) -> None:
    client.twrite("events", *[b"m%d" % i for i in range(20)])
    client.tevict("events", 4)
    df = reader(spark, shared_server, partitions=3).load("events")
    assert [f.name for f in df.schema.fields] == ["offset", "value", "key"]
    assert df.rdd.getNumPartitions() == 3
    assert rows(df) == [(i, b"m%d" % i, "events") for i in range(5, 20)]


def test_batch_read_offset_range(spark, shared_server, client) -> None:
    client.twrite("events", *[b"m%d" % i for i in range(20)])
    ranged = reader(spark, shared_server, key="events", startingOffset=-5, endingOffset=18).load()
    assert [row.offset for row in ranged.collect()] == [15, 16, 17]
    assert reader(spark, shared_server, key="events", startingOffset="latest").load().count() == 0
    assert reader(spark, shared_server, key="never-written").load().count() == 0


def test_batch_read_with_a_user_schema_picks_columns_and_decodes_text(
    spark, shared_server, client
) -> None:
    client.twrite("events", "caf\u00e9".encode(), b"tea")
    df = reader(spark, shared_server).schema("value STRING, offset LONG").load("events")
    assert [tuple(row) for row in df.collect()] == [("caf\u00e9", 0), ("tea", 1)]
    with pytest.raises(Exception, match="unknown column"):
        reader(spark, shared_server).schema("topic STRING").load("events").collect()
    with pytest.raises(Exception, match="'offset' cannot be string"):
        reader(spark, shared_server).schema("offset STRING").load("events").collect()


def test_batch_read_with_bad_option_names_it(spark, shared_server) -> None:
    with pytest.raises(Exception, match="startingOffset"):
        reader(spark, shared_server, key="events", startingOffset="soon").load().collect()


# ---------------------------------------------------------------------------
# Batch write
# ---------------------------------------------------------------------------


def test_batch_write_appends_values_in_order(spark, shared_server, client) -> None:
    client.twrite("out", b"existing")
    df = spark.createDataFrame([(f"v{i}",) for i in range(250)], "value string").coalesce(1)
    (
        df.write.format("rcp11")
        .option("port", shared_server.port)
        .option("host", "127.0.0.1")
        .option("key", "out")
        .mode("append")
        .save()
    )
    assert client.tread("out", 0, 1000) == [b"existing"] + [b"v%d" % i for i in range(250)]


def test_batch_write_binary_values_and_key_column(spark, shared_server, client) -> None:
    data = [("a", bytearray(b"\x00\x01")), ("b", bytearray(b"\xff")), ("a", bytearray(b"z"))]
    df = spark.createDataFrame(data, "key string, value binary").coalesce(1)
    df.write.format("rcp11").option("port", shared_server.port).option("host", "127.0.0.1").mode(
        "append"
    ).save()
    assert client.tread("a", 0, 10) == [b"\x00\x01", b"z"]
    assert client.tread("b", 0, 10) == [b"\xff"]


def test_write_refuses_overwrite_and_frames_without_value(spark, shared_server) -> None:
    df = spark.createDataFrame([("x",)], "value string")
    writer = df.write.format("rcp11").option("port", shared_server.port).option("key", "k")
    with pytest.raises(Exception, match="append-only"):
        writer.mode("overwrite").save()
    no_value = spark.createDataFrame([("x",)], "text string")
    with pytest.raises(Exception, match="'value' column"):
        no_value.write.format("rcp11").option("port", shared_server.port).option("key", "k").mode(
            "append"
        ).save()


# ---------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------


def run_available_now(spark, srv, checkpoint: Path, sink: Path, **options: object):
    stream = spark.readStream.format("rcp11").option("port", srv.port).option("host", "127.0.0.1")
    for name, value in options.items():
        stream = stream.option(name, str(value))
    query = (
        stream.load()
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_streaming_read_resumes_from_the_checkpoint(spark, shared_server, client, tmp_path) -> None:
    client.twrite("events", *[b"a%d" % i for i in range(5)])
    checkpoint, sink = tmp_path / "checkpoint", tmp_path / "sink"
    run_available_now(
        spark, shared_server, checkpoint, sink, key="events", startingOffset="earliest"
    )
    first_run = sorted(rows(spark.read.parquet(str(sink))))
    assert first_run == [(i, b"a%d" % i, "events") for i in range(5)]

    client.twrite("events", b"b5", b"b6")
    run_available_now(
        spark, shared_server, checkpoint, sink, key="events", startingOffset="earliest"
    )
    both_runs = sorted(rows(spark.read.parquet(str(sink))))
    assert both_runs == first_run + [(5, b"b5", "events"), (6, b"b6", "events")]
    # Nothing was evicted: committing to the source is a no-op by default.
    assert client.tread("events", 0, 0, withinfo=True).first_offset == 0


def test_streaming_read_starts_at_latest_by_default(spark, shared_server, client, tmp_path) -> None:
    client.twrite("events", b"old")
    checkpoint, sink = tmp_path / "checkpoint", tmp_path / "sink"
    run_available_now(spark, shared_server, checkpoint, sink, key="events")
    client.twrite("events", b"new")
    run_available_now(spark, shared_server, checkpoint, sink, key="events")
    assert rows(spark.read.parquet(str(sink))) == [(1, b"new", "events")]


def test_max_offsets_per_trigger_splits_micro_batches(
    spark, shared_server, client, tmp_path
) -> None:
    client.twrite("events", *[b"m%d" % i for i in range(10)])
    query = run_available_now(
        spark,
        shared_server,
        tmp_path / "c",
        tmp_path / "s",
        key="events",
        startingOffset="earliest",
        maxOffsetsPerTrigger=3,
    )
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [3, 3, 3, 1]
    assert len(spark.read.parquet(str(tmp_path / "s")).collect()) == 10


def test_evict_on_commit_drops_what_spark_has_processed(
    spark, shared_server, client, tmp_path
) -> None:
    client.twrite("events", *[b"m%d" % i for i in range(4)])
    options = {"key": "events", "startingOffset": "earliest", "evictOnCommit": "true"}
    run_available_now(spark, shared_server, tmp_path / "c", tmp_path / "s", **options)
    client.twrite("events", b"m4")
    # Spark commits a batch to the source when it plans the next one, so the
    # second run is what evicts the first run's offsets.
    run_available_now(spark, shared_server, tmp_path / "c", tmp_path / "s", **options)
    assert client.tread("events", 0, 0, withinfo=True).first_offset >= 4
    assert len(spark.read.parquet(str(tmp_path / "s")).collect()) == 5


def test_streaming_write_copies_a_stream(spark, shared_server, client, tmp_path) -> None:
    client.twrite("source", *[b"s%d" % i for i in range(6)])
    query = (
        spark.readStream.format("rcp11")
        .option("port", shared_server.port)
        .option("host", "127.0.0.1")
        .option("key", "source")
        .option("startingOffset", "earliest")
        .load()
        .selectExpr("value")
        .writeStream.format("rcp11")
        .option("port", shared_server.port)
        .option("host", "127.0.0.1")
        .option("key", "copy")
        .option("checkpointLocation", str(tmp_path / "c"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert client.tread("copy", 0, 100) == [b"s%d" % i for i in range(6)]
