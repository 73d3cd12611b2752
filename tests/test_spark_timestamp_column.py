"""The source's `timestamp` column (docs/SPARK.md, "Rows"): each message's
own append time, as TREAD WITHTIMES gives it, against both servers; kept
across a server restart and a TCONCAT; an event-time window with a
watermark over it.

The timestamp options (startingTimestamp...) are test_spark_timestamps.py's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import ServerProcess, wait_for
from helpers_spark import flushed_client, reader, stream_reader

from rcp11.client import Client

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


@pytest.fixture
def client(stream_server: ServerProcess) -> Iterator[Client]:
    yield from flushed_client(stream_server)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def next_ms() -> None:
    """Wait until the wall clock is in a millisecond no write so far got."""
    start = wall_ms()
    wait_for(lambda: wall_ms() > start, 5)


def one_per_ms(client: Client, key: str, n: int, prefix: str = "m") -> None:
    """n messages, each written in a millisecond of its own."""
    for i in range(n):
        next_ms()
        client.twrite(key, f"{prefix}{i}".encode())


def server_times(client: Client, key: str) -> dict[int, int]:
    """offset -> append time (ms) of every readable message, from the server."""
    info = client.tread(key, 0, 0, withinfo=True)
    result = client.tread(key, info.first_offset, info.length, withtimes=True, withinfo=True)
    return {offset: t for offset, t, _ in result.timed_items()}


def spark_times(df: Any) -> dict[int, int]:
    """offset -> the timestamp column, in ms since the epoch."""
    out = {}
    for row in df.select("offset", "timestamp").collect():
        stamp: datetime = row.timestamp
        out[row.offset] = round(stamp.timestamp() * 1000)
    return out


def test_the_schema_has_kafkas_timestamp_column(spark, stream_server, client) -> None:  # noqa: F811
    df = reader(spark, stream_server, subscribe="s").load()
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("stream", "string"),
        ("offset", "bigint"),
        ("value", "binary"),
        ("timestamp", "timestamp"),
    ]


def test_each_row_has_its_own_messages_time(spark, stream_server, client) -> None:  # noqa: F811
    """Messages written one per millisecond share a macronode: each row has
    its message's time, not its node's."""
    one_per_ms(client, "s", 30)
    next_ms()
    client.twrite("s", b"a", b"b", b"c")  # one TWRITE: one time
    client.tevict("s", 4)
    expected = server_times(client, "s")
    assert len(set(expected.values())) == 30 - 5 + 1
    df = reader(spark, stream_server, subscribe="s").load()
    assert spark_times(df) == expected
    # A user schema may ask for the column alone, or with the text.
    picked = reader(spark, stream_server, subscribe="s").schema("timestamp TIMESTAMP").load()
    assert sorted(round(r.timestamp.timestamp() * 1000) for r in picked.collect()) == sorted(
        expected.values()
    )
    assert spark.conf.get("spark.sql.session.timeZone")  # shown in the session's zone
    first = min(expected)
    row = reader(spark, stream_server, subscribe="s").load().where(f"offset = {first}").first()
    assert row.timestamp.astimezone(UTC) == datetime.fromtimestamp(expected[first] / 1000, UTC)


def test_a_tconcat_keeps_each_messages_time(spark, stream_server, client) -> None:  # noqa: F811
    client.twrite("dst", b"first")
    one_per_ms(client, "staged", 12)
    staged = server_times(client, "staged")
    client.execute_command("TCONCAT", "dst", "staged")
    df = reader(spark, stream_server, subscribe="dst").load().where("offset > 0")
    assert spark_times(df) == {offset + 1: t for offset, t in staged.items()}


@pytest.mark.parametrize("kind", ["rcp11", "module"])
def test_times_survive_a_restart(spark, server_factory, module_factory, kind) -> None:  # noqa: F811
    if kind == "rcp11":
        srv = server_factory(appendonly="yes", appendfsync="always")
    else:
        srv = module_factory(appendonly="yes", appendfsync="always")
    c = Client(port=srv.port)
    one_per_ms(c, "s", 20)
    before = server_times(c, "s")
    c.close()
    srv.kill9()
    srv.start()
    df = reader(spark, srv, subscribe="s").load()
    assert spark_times(df) == before
    srv.restart()
    assert spark_times(reader(spark, srv, subscribe="s").load()) == before


def test_an_event_time_window_with_a_watermark(spark, stream_server, client, tmp_path) -> None:  # noqa: F811
    """Counts per one-second window of append time, a window emitted once
    the watermark (the newest time seen, less half a second) has passed
    its end: the windows of the first two seconds, and not the last one."""
    for batch in range(3):
        if batch:  # into the next whole second, and half a second more
            mark = (wall_ms() // 1000 + 1) * 1000 + 500
            wait_for(lambda mark=mark: wall_ms() >= mark, 5)
        client.twrite("ev", *[f"e{batch}-{i}".encode() for i in range(5 + batch)])
    times = server_times(client, "ev")
    per_second = Counter(t // 1000 for t in times.values())
    closed = {s: n for s, n in per_second.items() if s < max(per_second)}
    assert len(closed) == 2
    windows = (
        stream_reader(spark, stream_server, subscribe="ev", startingOffsets="earliest")
        .load()
        .withWatermark("timestamp", "500 milliseconds")
        .groupBy(spark_window("timestamp", "1 second"))
        .count()
    )
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "true")
    query = (
        windows.writeStream.format("memory")
        .queryName("windows")
        .outputMode("append")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:

        def emitted() -> dict[int, int]:
            rows = spark.sql("SELECT window.start AS start, count FROM windows").collect()
            return {round(r.start.timestamp()): r["count"] for r in rows}

        wait_for(lambda: len(emitted()) >= len(closed) or query.exception() is not None, 120)
        assert query.exception() is None
        assert emitted() == closed  # the open window is not emitted
    finally:
        query.stop()
        spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")


def spark_window(column: str, duration: str) -> Any:
    from pyspark.sql.functions import window

    return window(column, duration)
