"""The "rcp11" PySpark data source against a real server, in one local
Spark (``local[2,2]``: two threads, a failed task is tried once more).

Source: subscribe / subscribePattern / load("a,b"), the offsets options,
failOnDataLoss, read limits, options checked at load(). Sink: target by
option or column, its errors, exactly once with a task that fails once.
The kill -9 of a driver and the standalone cluster have their own modules
(test_spark_recovery.py, test_spark_cluster.py); docs/SPARK.md describes
what is tested here.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess
from helpers_spark import (
    failing_once,
    fill,
    flushed_client,
    parquet_rows,
    reader,
    rows,
    run_available_now,
    stream_reader,
    to_parquet,
)

from rcp11.client import Client

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


@pytest.fixture
def client(shared_server: ServerProcess) -> Iterator[Client]:
    yield from flushed_client(shared_server)


def messages(client: Client, key: str) -> list[bytes]:
    return [m for m in client.tread(key, 0, 1_000_000) if m is not None]


def sink_keys(client: Client) -> list[bytes]:
    return sorted(client.keys("rcp11-sink:*"))


def last_offsets(checkpoint: Path) -> dict[str, int]:
    """The source offsets of the newest micro-batch in a checkpoint."""
    batches = [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    newest = max(batches, key=lambda p: int(p.name))
    return json.loads(newest.read_text().splitlines()[-1])


# ---------------------------------------------------------------------------
# Reading: which streams, schema
# ---------------------------------------------------------------------------


def test_batch_read_of_several_streams_skips_evicted_offsets(spark, shared_server, client) -> None:
    fill(client, "a", 20)
    fill(client, "b", 5)
    client.tevict("a", 4)
    df = reader(spark, shared_server, subscribe="a, b,missing").load()
    assert [(f.name, f.dataType.typeName()) for f in df.schema.fields] == [
        ("stream", "string"),
        ("offset", "long"),
        ("value", "binary"),
        ("timestamp", "timestamp"),
    ]
    expected = [("a", i, b"a%d" % i) for i in range(5, 20)] + [
        ("b", i, b"b%d" % i) for i in range(5)
    ]
    assert sorted(rows(df)) == expected
    # One Spark partition per stream with data (Kafka's default).
    assert df.rdd.getNumPartitions() == 2
    assert sorted(rows(reader(spark, shared_server).load("a,b"))) == expected


def test_subscribe_pattern_reads_matching_streams_only(spark, shared_server, client) -> None:
    fill(client, "ev:1", 3)
    fill(client, "ev:2", 2)
    fill(client, "other", 4)
    client.set("ev:string", "not a stream")
    df = reader(spark, shared_server, subscribePattern="ev:*").load()
    assert sorted({r[0] for r in rows(df)}) == ["ev:1", "ev:2"]
    assert len(rows(df)) == 5
    assert reader(spark, shared_server, subscribePattern="nothing*").load().count() == 0


def test_user_schema_picks_columns_and_decodes_utf8_strictly(spark, shared_server, client) -> None:
    client.twrite("t", "caf\u00e9".encode(), b"tea")
    df = reader(spark, shared_server).schema("value STRING, offset BIGINT").load("t")
    assert [tuple(row) for row in df.collect()] == [("caf\u00e9", 0), ("tea", 1)]
    client.twrite("t", b"\xff\xfe bad")
    with pytest.raises(Exception, match=r"offset 2 of stream 't' is not valid UTF-8"):
        reader(spark, shared_server).schema("value STRING").load("t").collect()
    # As BINARY the same message reads fine.
    assert reader(spark, shared_server).schema("value BINARY").load("t").count() == 3
    with pytest.raises(Exception, match="unknown column 'topic'"):
        reader(spark, shared_server).schema("topic STRING").load("t").collect()
    with pytest.raises(Exception, match="'offset' cannot be string"):
        reader(spark, shared_server).schema("offset STRING").load("t").collect()


def test_a_string_key_named_by_subscribe_is_an_error(spark, shared_server, client) -> None:
    client.set("s", "x")
    with pytest.raises(Exception, match="key 's' is not a stream"):
        reader(spark, shared_server, subscribe="s").load().collect()


# ---------------------------------------------------------------------------
# Options checked when the DataFrame is defined
# ---------------------------------------------------------------------------


def test_unknown_option_fails_at_load_listing_the_known_ones(spark, shared_server) -> None:
    with pytest.raises(Exception) as info:
        reader(spark, shared_server, subscribe="a", startingOffset="earliest").load()
    text = str(info.value)
    assert "unknown option 'startingoffset'" in text  # Spark passes names in lower case
    assert "did you mean 'startingOffsets'" in text
    assert "subscribePattern" in text and "failOnDataLoss" in text
    # The old 'key' option of the at-least-once source names no stream now.
    with pytest.raises(Exception, match="unknown option 'key'"):
        spark.readStream.format("rcp11").option("key", "dst").load()


def _before_our_message(text: str) -> str:
    """What Spark shows before the data source's own message."""
    assert "rcp11 data source: " in text, text
    return text.split("rcp11 data source: ")[0]


def test_our_message_comes_right_after_sparks_own_line(spark, shared_server, client) -> None:
    """Spark shows a Python worker's failure as its own line, then the
    traceback, the message last; ours come right after Spark's line, in
    every place Spark runs the data source."""
    # The data source's constructor, run when the DataFrame is defined.
    with pytest.raises(Exception) as info:
        reader(spark, shared_server, subscribe="a", startingOffset="earliest").load()
    head = _before_our_message(str(info.value))
    assert "Failed to create Python data source instance" in head
    assert "Traceback" not in head and "\n" not in head
    # A read task.
    client.twrite("t", b"\xff")
    with pytest.raises(Exception) as info:
        reader(spark, shared_server, subscribe="t").schema("value STRING").load().collect()
    head = _before_our_message(str(info.value))
    assert "Traceback" not in head and 'File "' not in head
    # A streaming query whose reader refuses its options: PySpark's runner
    # would bury the message under an UnboundLocalError of its own.
    query = run_available_now(stream_reader(spark, shared_server).load().writeStream.format("noop"))
    text = str(query.exception())
    head = _before_our_message(text)
    assert "say which streams to read" in text
    assert "Traceback" not in head and "UnboundLocalError" not in text


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"subscribe": "a", "port": "six"}, "option 'port' must be an integer"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({"subscribe": "a", "minPartitions": "0"}, "'minPartitions' must be an integer >= 1"),
        ({"subscribe": "a", "maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
        ({"subscribe": "a", "startingOffsets": "first"}, "'startingOffsets' must be 'earliest'"),
        ({"subscribe": "a", "startingOffsets": '{"a": "x"}'}, "'startingOffsets' must be"),
        ({"subscribe": "a", "subscribePattern": "a*"}, "only one of subscribe, subscribePattern"),
        ({"subscribe": " , "}, "'subscribe' must be one or more stream names"),
    ],
)
def test_bad_option_values_fail_at_load_naming_the_option(
    spark, shared_server, options, problem
) -> None:
    with pytest.raises(Exception, match=problem):
        reader(spark, shared_server, **options).load()


def test_offsets_rules_of_batch_and_streaming_queries(
    spark, shared_server, client, tmp_path
) -> None:
    fill(client, "a", 3)
    with pytest.raises(Exception, match="cannot be 'latest'"):
        reader(spark, shared_server, subscribe="a", startingOffsets="latest").load().collect()
    with pytest.raises(Exception, match="cannot be 'earliest'"):
        reader(spark, shared_server, subscribe="a", endingOffsets='{"a": -2}').load().collect()
    with pytest.raises(Exception, match="does not name 'b'"):
        reader(spark, shared_server, subscribe="a,b", startingOffsets='{"a": 0}').load().collect()
    with pytest.raises(Exception, match="names 'zzz'"):
        reader(
            spark, shared_server, subscribe="a", startingOffsets='{"a": 0, "zzz": 1}'
        ).load().collect()
    with pytest.raises(Exception, match="endingOffsets applies to batch queries only"):
        query = run_available_now(
            to_parquet(
                stream_reader(spark, shared_server, subscribe="a", endingOffsets="latest").load(),
                tmp_path,
            )
        )
        raise AssertionError(query.exception())
    with pytest.raises(Exception, match="option 'stream' applies to writes"):
        reader(spark, shared_server, subscribe="a", stream="x").load().collect()


def test_starting_and_ending_offsets_json(spark, shared_server, client) -> None:
    fill(client, "a", 10)
    fill(client, "b", 10)
    df = reader(
        spark,
        shared_server,
        subscribe="a,b",
        startingOffsets='{"a": 7, "b": -2}',
        endingOffsets='{"a": -1, "b": 3}',
    ).load()
    assert sorted((s, o) for s, o, _ in rows(df)) == [("a", 7), ("a", 8), ("a", 9)] + [
        ("b", 0),
        ("b", 1),
        ("b", 2),
    ]
    with pytest.raises(Exception, match="offset 50, beyond its next offset 10"):
        reader(
            spark, shared_server, subscribe="a,b", startingOffsets='{"a": 50, "b": 0}'
        ).load().collect()
    # Kafka's plural spelling is the one: earliest reads everything.
    assert (
        reader(spark, shared_server, subscribe="a", startingOffsets="earliest").load().count() == 10
    )


def test_min_partitions_and_max_records_per_partition(spark, shared_server, client) -> None:
    fill(client, "big", 1000)
    fill(client, "small", 10)
    df = reader(spark, shared_server, subscribe="big,small", minPartitions=6).load()
    assert df.rdd.getNumPartitions() >= 6
    assert df.count() == 1010
    df = reader(spark, shared_server, subscribe="big,small", maxRecordsPerPartition=300).load()
    assert df.rdd.getNumPartitions() == 5  # 4 pieces of "big", 1 of "small"
    assert sorted(r[1] for r in rows(df) if r[0] == "big") == list(range(1000))


# ---------------------------------------------------------------------------
# failOnDataLoss
# ---------------------------------------------------------------------------


def test_batch_start_below_the_first_readable_offset(spark, shared_server, client) -> None:
    fill(client, "a", 10)
    client.tevict("a", 5)
    options = {"subscribe": "a", "startingOffsets": '{"a": 2}'}
    with pytest.raises(Exception, match=r"data loss in stream 'a': offsets 2 to 5"):
        reader(spark, shared_server, **options).load().collect()
    df = reader(spark, shared_server, failOnDataLoss="false", **options).load()
    assert [r[1] for r in rows(df)] == [6, 7, 8, 9]


@pytest.mark.parametrize("fail", [True, False])
def test_streaming_evicted_unread_data(spark, shared_server, client, tmp_path, fail) -> None:
    fill(client, "ev", 5)
    options = {
        "subscribe": "ev",
        "startingOffsets": "earliest",
        "failOnDataLoss": str(fail).lower(),
    }
    first = run_available_now(
        to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path)
    )
    assert first.exception() is None
    fill(client, "ev", 5, prefix="late")  # offsets 5..9
    client.tevict("ev", 7)  # 5, 6, 7 evicted before the query read them
    second = run_available_now(
        to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path)
    )
    got = [r[1] for r in parquet_rows(spark, tmp_path)]
    if fail:
        assert "data loss in stream 'ev': offsets 5 to 7" in str(second.exception())
        assert got == [0, 1, 2, 3, 4]
    else:
        assert second.exception() is None
        assert got == [0, 1, 2, 3, 4, 8, 9]


@pytest.mark.parametrize("fail", [True, False])
def test_streaming_stream_deleted_and_recreated(
    spark, shared_server, client, tmp_path, fail
) -> None:
    fill(client, "ev", 5)
    options = {
        "subscribe": "ev",
        "startingOffsets": "earliest",
        "failOnDataLoss": str(fail).lower(),
    }
    assert run_available_now(
        to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path)
    )
    client.delete("ev")
    fill(client, "ev", 3, prefix="new")  # next offset 3, below the checkpoint's 5
    second = run_available_now(
        to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path)
    )
    got = parquet_rows(spark, tmp_path)
    if fail:
        assert "stream 'ev' was deleted or recreated" in str(second.exception())
        assert "next offset is now 3, below the checkpoint's 5" in str(second.exception())
        assert len(got) == 5
    else:
        assert second.exception() is None
        assert [r for r in got if r[2].startswith(b"new")] == [
            ("ev", i, b"new%d" % i) for i in range(3)
        ]


# ---------------------------------------------------------------------------
# Streaming reads
# ---------------------------------------------------------------------------


def test_checkpoint_offsets_name_every_stream_and_resume(
    spark, shared_server, client, tmp_path
) -> None:
    fill(client, "a", 4)
    fill(client, "b", 2)
    options = {"subscribe": "a,b", "startingOffsets": "earliest"}
    query = run_available_now(
        to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path)
    )
    assert query.exception() is None
    assert last_offsets(tmp_path / "out-checkpoint") == {"a": 4, "b": 2}
    client.twrite("b", b"b2")
    run_available_now(to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path))
    assert last_offsets(tmp_path / "out-checkpoint") == {"a": 4, "b": 3}
    assert [r[:2] for r in parquet_rows(spark, tmp_path)] == [("a", i) for i in range(4)] + [
        ("b", i) for i in range(3)
    ]


def test_streaming_starts_at_latest_by_default_and_missing_streams_never_hang(
    spark, shared_server, client, tmp_path
) -> None:
    fill(client, "a", 3)
    query = run_available_now(
        to_parquet(stream_reader(spark, shared_server, subscribe="a,nope").load(), tmp_path)
    )
    assert query.exception() is None and not query.isActive
    client.twrite("a", b"new")
    client.twrite("nope", b"first")
    run_available_now(
        to_parquet(stream_reader(spark, shared_server, subscribe="a,nope").load(), tmp_path)
    )
    assert parquet_rows(spark, tmp_path) == [("a", 3, b"new"), ("nope", 0, b"first")]


def test_pattern_picks_up_new_streams_from_their_earliest(
    spark, shared_server, client, tmp_path
) -> None:
    fill(client, "ev:a", 2)
    options = {"subscribePattern": "ev:*", "startingOffsets": "earliest"}
    run_available_now(to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path))
    fill(client, "ev:b", 3)
    client.tevict("ev:b", 0)  # a new stream is read from its first readable message
    run_available_now(to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path))
    assert [r[:2] for r in parquet_rows(spark, tmp_path)] == [
        ("ev:a", 0),
        ("ev:a", 1),
        ("ev:b", 1),
        ("ev:b", 2),
    ]


def test_max_offsets_per_trigger_is_shared_by_backlog(
    spark, shared_server, client, tmp_path
) -> None:
    fill(client, "a", 30)
    fill(client, "b", 10)
    options = {"subscribe": "a,b", "startingOffsets": "earliest", "maxOffsetsPerTrigger": 8}
    query = run_available_now(
        to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path)
    )
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [8, 8, 8, 8, 8]
    assert json.loads(batches[0]["sources"][0]["endOffset"]) == {"a": 6, "b": 2}
    assert len(parquet_rows(spark, tmp_path)) == 40


def test_min_offsets_per_trigger_waits_until_max_trigger_delay(shared_server, client) -> None:
    """The driver-side reader Spark calls before every micro-batch."""
    from pyspark.sql.streaming.datasource import ReadMinRows

    from rcp11.spark.options import parse_read_options
    from rcp11.spark.source import StreamReader

    fill(client, "a", 3)
    options = {"port": str(shared_server.port), "subscribe": "a", "startingOffsets": "earliest"}
    waiting = StreamReader(
        parse_read_options({**options, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "1h"}), None
    )
    start = waiting.initialOffset()
    assert waiting.getDefaultReadLimit() == ReadMinRows(5)
    assert waiting.latestOffset(start, ReadMinRows(5)) == start == {"a": 0}
    fill(client, "a", 2, prefix="more")
    assert waiting.latestOffset(start, ReadMinRows(5)) == {"a": 5}
    impatient = StreamReader(
        parse_read_options({**options, "minOffsetsPerTrigger": "50", "maxTriggerDelay": "0ms"}),
        None,
    )
    assert impatient.latestOffset(start, ReadMinRows(50)) == {"a": 5}


def test_evict_on_commit_drops_what_spark_has_processed(
    spark, shared_server, client, tmp_path
) -> None:
    fill(client, "ev", 4)
    options = {"subscribe": "ev", "startingOffsets": "earliest", "evictOnCommit": "true"}
    run_available_now(to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path))
    client.twrite("ev", b"e4")
    # Spark commits a batch to the source when it plans the next one.
    run_available_now(to_parquet(stream_reader(spark, shared_server, **options).load(), tmp_path))
    assert client.tread("ev", 0, 0, withinfo=True).first_offset >= 4
    assert len(parquet_rows(spark, tmp_path)) == 5


# ---------------------------------------------------------------------------
# Writing: where rows go, and the errors
# ---------------------------------------------------------------------------


def writer(df: Any, shared_server: ServerProcess, **options: object) -> Any:
    write = df.write.format("rcp11").option("port", shared_server.port).mode("append")
    for name, value in options.items():
        write = write.option(name, str(value))
    return write


def test_write_errors_show_our_message_right_after_sparks_line(
    spark, shared_server, client
) -> None:
    """A write task (executors) and the commit (a worker of the driver)
    unpickle the writer without loading the data source's module: their
    errors too come first, not under a traceback."""
    rows = spark.createDataFrame([("a", None)], "value STRING, stream STRING")
    with pytest.raises(Exception) as info:
        writer(rows, shared_server).save()
    head = _before_our_message(str(info.value))
    assert "Traceback" not in head and 'File "' not in head
    client.set("str", "x")
    values = spark.createDataFrame([("a",)], "value STRING")
    with pytest.raises(Exception) as info:
        writer(values, shared_server, stream="str").save()
    text = str(info.value)
    assert "cannot write to 'str'" in text
    head = _before_our_message(text)
    assert "Traceback" not in head and 'File "' not in head


def test_batch_write_by_option_topic_path_or_column(spark, shared_server, client) -> None:
    client.twrite("out", b"existing")
    values = spark.createDataFrame([(f"v{i}",) for i in range(250)], "value string").coalesce(1)
    writer(values, shared_server, stream="out").save()
    assert messages(client, "out") == [b"existing"] + [b"v%d" % i for i in range(250)]
    writer(values.limit(2), shared_server, topic="t").save()
    writer(values.limit(1), shared_server).save("p")
    assert messages(client, "t") == [b"v0", b"v1"] and messages(client, "p") == [b"v0"]
    routed = spark.createDataFrame(
        [("x", bytearray(b"\x00\x01")), ("y", bytearray(b"\xff")), ("x", bytearray(b"z"))],
        "stream string, value binary",
    ).coalesce(1)
    writer(routed, shared_server).save()
    assert messages(client, "x") == [b"\x00\x01", b"z"] and messages(client, "y") == [b"\xff"]
    assert sink_keys(client) == []  # no staging stream or registry is left


def test_write_errors(spark, shared_server, client) -> None:
    values = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="append-only"):
        values.write.format("rcp11").option("port", shared_server.port).option("stream", "k").mode(
            "overwrite"
        ).save()
    with pytest.raises(Exception, match="say which stream to write to"):
        writer(values, shared_server).save()
    with pytest.raises(Exception, match="only one of stream, topic"):
        writer(values, shared_server, stream="a", topic="b").save()
    with pytest.raises(Exception, match="column 'value' is missing"):
        writer(spark.createDataFrame([("x",)], "text string"), shared_server, stream="k").save()
    with pytest.raises(Exception, match="'value' must be binary or string, not integer"):
        writer(spark.createDataFrame([(1,)], "value int"), shared_server, stream="k").save()
    with pytest.raises(Exception, match="'value' is null"):
        writer(spark.createDataFrame([(None,)], "value string"), shared_server, stream="k").save()
    with pytest.raises(Exception, match="option 'subscribe' applies to reads"):
        writer(values, shared_server, stream="k", subscribe="a").save()
    assert client.keys("*") == []


def test_topic_option_with_a_kafka_shaped_frame(spark, shared_server, client) -> None:
    """Reproduction: key = user id, value, option topic made one stream per
    user. A key column is now an error; without it every row goes to the topic."""
    kafka_shaped = spark.createDataFrame(
        [("user1", "a"), ("user2", "b"), ("user1", "c")], "key string, value string"
    )
    with pytest.raises(Exception, match="'key' column, but rcp11 messages have no key"):
        writer(kafka_shaped, shared_server, topic="events").save()
    assert client.keys("*") == []
    writer(kafka_shaped.drop("key").coalesce(1), shared_server, topic="events").save()
    assert messages(client, "events") == [b"a", b"b", b"c"]
    assert client.exists("user1", "user2") == 0


def test_no_feedback_loop_into_the_source_stream(spark, shared_server, client, tmp_path) -> None:
    """Reproduction: a frame read from 'src' written with a target option
    went back into 'src' (its column beat the option)."""
    fill(client, "src", 3)
    frame = stream_reader(spark, shared_server, subscribe="src", startingOffsets="earliest").load()

    def sink(df: Any, **options: str) -> Any:
        write = df.writeStream.format("rcp11").option("port", shared_server.port)
        for name, value in options.items():
            write = write.option(name, value)
        return write.option("checkpointLocation", str(tmp_path / "c" / str(len(options))))

    both = run_available_now(sink(frame, stream="dst"))
    assert "both the option 'stream' and a 'stream' column" in str(both.exception())
    fine = run_available_now(sink(frame.select("value"), stream="dst"))
    assert fine.exception() is None
    assert messages(client, "dst") == [b"src0", b"src1", b"src2"]
    assert messages(client, "src") == [b"src0", b"src1", b"src2"]


def test_batch_writes_inside_foreach_batch_leave_nothing_behind(
    spark, shared_server, client, tmp_path
) -> None:
    """Spark's streaming query and micro-batch ids are visible to a batch
    write inside foreachBatch; it must still commit as a one-off job."""
    fill(client, "src", 10)
    frame = stream_reader(
        spark, shared_server, subscribe="src", startingOffsets="earliest", maxOffsetsPerTrigger=4
    ).load()
    port = shared_server.port

    def write_batch(df: Any, batch_id: int) -> None:
        df.select("value").write.format("rcp11").option("port", port).option("stream", "dst").mode(
            "append"
        ).save()

    query = run_available_now(
        frame.writeStream.foreachBatch(write_batch).option(
            "checkpointLocation", str(tmp_path / "c")
        )
    )
    assert query.exception() is None
    assert messages(client, "dst") == [b"src%d" % i for i in range(10)]
    assert sink_keys(client) == []


# ---------------------------------------------------------------------------
# Exactly once
# ---------------------------------------------------------------------------


def staged_total(client: Client) -> int:
    return int(client.info("stats").get("total_messages_written", 0))


def test_batch_write_with_a_task_failing_once_is_exactly_once(spark, shared_server, client) -> None:
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        values = spark.range(0, 6000, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
        failing = values.mapInArrow(failing_once(), values.schema)
        writer(failing, shared_server, stream="out", batchSize=100).save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert Counter(messages(client, "out")) == Counter(str(i).encode() for i in range(6000))
    assert sink_keys(client) == []
    # The failed attempt had staged rows (now dropped): staging 6000 rows once,
    # then TCONCAT appending them, would count exactly 12000.
    assert staged_total(client) > 12000


def test_streaming_copy_with_a_task_failing_once_is_exactly_once(
    spark, shared_server, client, tmp_path
) -> None:
    for part in range(3):
        client.twrite("src", *[b"%d" % i for i in range(part * 2000, part * 2000 + 2000)])
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        frame = stream_reader(
            spark,
            shared_server,
            subscribe="src",
            startingOffsets="earliest",
            minPartitions=2,
            batchSize=500,
        ).load()
        failing = frame.select("value").mapInArrow(failing_once(), "value binary")
        query = run_available_now(
            failing.writeStream.format("rcp11")
            .option("port", shared_server.port)
            .option("stream", "dst")
            .option("batchSize", 100)
            .option("checkpointLocation", str(tmp_path / "c"))
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert query.exception() is None
    assert Counter(messages(client, "dst")) == Counter(b"%d" % i for i in range(6000))
    # What is left: the query's progress key and staging registry; no staging stream.
    assert [k.split(b":")[-1] for k in sink_keys(client)] == [b"progress", b"staged"]


def test_the_docs_list_every_option_with_its_default() -> None:
    """docs/SPARK.md's table is the option table of rcp11.spark.options,
    and the README's shorter one names every option."""
    from conftest import REPO

    from rcp11.spark.options import OPTIONS

    rows = {}
    for line in (REPO / "docs" / "SPARK.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    assert rows == {doc.name: (doc.applies, doc.default) for doc in OPTIONS}
    readme = (REPO / "README.md").read_text()
    spark_section = readme[readme.index("### Spark") : readme.index("## Benchmarks")]
    assert [doc.name for doc in OPTIONS if f"`{doc.name}`" not in spark_section] == []


def test_twrite_requests_are_framed_for_any_value() -> None:
    import hiredis

    from rcp11.spark.columns import pack_twrite

    values = [b"", b"a", b"\r\n$3\r\n", bytes(range(256)), b"x" * 100_000]
    reader = hiredis.Reader()
    reader.feed(pack_twrite(b"k{1}", values) * 2)
    expected = [b"TWRITE", b"k{1}", b"ENTRIES", *values]
    assert reader.gets() == expected and reader.gets() == expected and reader.gets() is False


def test_staging_twrites_stay_small_enough_for_the_servers_c_lane() -> None:
    """A task's TWRITEs carry at most batchSize rows and about 48 KB (the
    server runs requests that fit its 64 KB carry in C); a larger message
    goes alone, and every row is in exactly one TWRITE, in order."""
    import pyarrow as pa

    from rcp11.spark.columns import twrite_cuts
    from rcp11.spark.sink import TWRITE_MAX_BYTES

    sizes = [100] * 2_000 + [70_000] + [10] * 5 + [0] * 3
    values = pa.array([b"x" * n for n in sizes], type=pa.binary()).slice(1)
    cuts = list(twrite_cuts(values, 300, TWRITE_MAX_BYTES))
    assert [b for b, _ in cuts] == [0] + [e for _, e in cuts[:-1]]
    assert cuts[-1][1] == len(values)
    for begin, end in cuts:
        size = sum(len(v) for v in values.slice(begin, end - begin).to_pylist())
        assert end - begin <= 300 and (size <= TWRITE_MAX_BYTES or end - begin == 1)
    assert (1999, 2000) in cuts  # the 70 KB message, alone
