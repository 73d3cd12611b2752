"""Kafka's timestamp options in the rcp11 source: startingTimestamp,
startingOffsetsByTimestamp (and its strategy), endingTimestamp and
endingOffsetsByTimestamp, resolved with the server's TSEEK, against both
servers (rcp11-server and redis-server with the module).

Tests that need TSEEK skip only when the server answers it with "unknown
command"; the option checks and the error for such a server always run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import RedisServer, ServerProcess, wait_for
from helpers_spark import (
    fill,
    flushed_client,
    parquet_rows,
    reader,
    rows,
    run_available_now,
    to_parquet,
)

from rcp11.client import Client
from rcp11.spark.options import OptionError, parse_read_options
from rcp11.spark.planning import Bounds, Seek, seek_times

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

# One full macronode at the default stream-node-max-entries (1000, both
# servers): the messages written after it start a node, where TSEEK is
# exact (docs/PROTOCOL.md, section 6), so the tests can expect exact rows.
NODE = 1000


@pytest.fixture
def client(stream_server: ServerProcess) -> Iterator[Client]:
    yield from flushed_client(stream_server)


def now_ms() -> int:
    return int(time.time() * 1000)


def after_now() -> int:
    """A time later than every append so far; returns once the clock has
    passed it, so every later append is at or after it."""
    mark = now_ms() + 1
    wait_for(lambda: now_ms() > mark, 5)
    return mark


def old_then_new(client: Client, streams: dict[str, int]) -> int:
    """NODE old messages in each stream, then ``new`` messages appended after
    the returned time."""
    for key in streams:
        fill(client, key, NODE, f"{key}-old")
    middle = after_now()
    for key, new in streams.items():
        fill(client, key, new, f"{key}-new")
    return middle


def offsets(df: Any) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for stream, offset, _ in sorted(rows(df)):
        found.setdefault(stream, []).append(offset)
    return found


def span(start: int, end: int) -> list[int]:
    return list(range(start, end))


# ---------------------------------------------------------------------------
# Options checked at load(), no server command involved
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"startingTimestamp": "yesterday"}, "'startingTimestamp' must be a time in ms"),
        ({"startingTimestamp": "-5"}, "'startingTimestamp' must be a time in ms"),
        ({"endingTimestamp": "1.5"}, "'endingTimestamp' must be a time in ms"),
        ({"startingOffsetsByTimestamp": "[1]"}, "'startingOffsetsByTimestamp' must be a JSON"),
        ({"endingOffsetsByTimestamp": '{"a": -1}'}, "'endingOffsetsByTimestamp' must be a JSON"),
        ({"startingOffsetsByTimestamp": '{"a": true}'}, "must be a JSON object"),
        ({"startingOffsetsByTimestampStrategy": "skip"}, "must be error or latest"),
        # Every value is checked, even one that another option overrides.
        ({"startingTimestamp": "5", "startingOffsetsByTimestamp": "{}"}, "must be a JSON"),
    ],
)
def test_bad_timestamp_options_fail_at_load(spark, stream_server, options, problem) -> None:  # noqa: F811
    with pytest.raises(Exception, match=problem):
        reader(spark, stream_server, subscribe="a", **options).load()


def test_precedence_follows_kafka() -> None:
    read = parse_read_options(
        {
            "subscribe": "a",
            "startingOffsets": "latest",
            "startingOffsetsByTimestamp": '{"a": 7}',
            "startingTimestamp": "5",
            "endingOffsets": "latest",
            "endingOffsetsByTimestamp": '{"a": 9}',
        }
    )
    assert read.starting_time is not None and read.starting_time.option == "startingTimestamp"
    assert read.starting_time.at == 5
    assert read.ending_time is not None and read.ending_time.per_stream == (("a", 9),)
    # A batch query may not start at 'latest', unless a timestamp option beats it.
    from rcp11.spark.options import check_batch_read

    check_batch_read(read)
    with pytest.raises(OptionError, match="cannot be 'latest'"):
        check_batch_read(parse_read_options({"subscribe": "a", "startingOffsets": "latest"}))


def test_ending_timestamps_are_for_batch_queries_only(spark, stream_server, tmp_path) -> None:  # noqa: F811
    for option, value in (("endingTimestamp", "5"), ("endingOffsetsByTimestamp", '{"a": 5}')):
        read = (
            spark.readStream.format("rcp11")
            .option("port", stream_server.port)
            .option("subscribe", "a")
        )
        query = run_available_now(to_parquet(read.option(option, value).load(), tmp_path, option))
        assert f"{option} applies to batch queries only" in str(query.exception())


def test_a_server_without_tseek_is_a_clear_error(redis_reference: RedisServer) -> None:
    plain = Client(host="127.0.0.1", port=redis_reference.port)
    try:
        with pytest.raises(OptionError, match="startingTimestamp needs the server's TSEEK"):
            seek_times(plain, {"a": 5}, "startingTimestamp")
    finally:
        plain.close()


# ---------------------------------------------------------------------------
# Against the server's TSEEK
# ---------------------------------------------------------------------------


def test_seek_times_finds_the_first_message_at_or_after_a_time(client) -> None:
    middle = old_then_new(client, {"a": 10})
    late = after_now()
    client.set("text", "x")
    found = seek_times(client, {"a": middle, "missing": middle}, "startingTimestamp")
    assert found == {"a": Seek(NODE, Bounds(0, NODE + 10)), "missing": Seek(0, Bounds(0, 0))}
    assert seek_times(client, {"a": 0}, "x")["a"].found == 0
    assert seek_times(client, {"a": late}, "x")["a"] == Seek(NODE + 10, Bounds(0, NODE + 10))
    with pytest.raises(OptionError, match="'text' is not a stream"):
        seek_times(client, {"text": 0}, "x")


def test_batch_read_between_times_with_kafka_precedence(spark, stream_server, client) -> None:  # noqa: F811
    middle = old_then_new(client, {"a": 10, "b": 5})
    late = after_now()
    both = {"subscribe": "a,b"}
    # startingTimestamp beats startingOffsets.
    df = reader(
        spark, stream_server, startingTimestamp=middle, startingOffsets='{"a": 0, "b": 0}', **both
    )
    assert offsets(df.load()) == {"a": span(NODE, NODE + 10), "b": span(NODE, NODE + 5)}
    texts = sorted(bytes(v) for _, _, v in rows(df.load()))
    assert texts[0] == b"a-new0" and all(b"-new" in t for t in texts)
    # Per stream; startingTimestamp beats the JSON.
    by_stream = f'{{"a": {middle}, "b": 0}}'
    df = reader(spark, stream_server, startingOffsetsByTimestamp=by_stream, **both).load()
    assert offsets(df) == {"a": span(NODE, NODE + 10), "b": span(0, NODE + 5)}
    df = reader(
        spark, stream_server, startingOffsetsByTimestamp=by_stream, startingTimestamp=0, **both
    )
    assert offsets(df.load()) == {"a": span(0, NODE + 10), "b": span(0, NODE + 5)}
    # Ending: before the first message at or after the time; beats endingOffsets.
    df = reader(
        spark, stream_server, endingTimestamp=middle, endingOffsets='{"a": 3, "b": 3}', **both
    )
    assert offsets(df.load()) == {"a": span(0, NODE), "b": span(0, NODE)}
    df = reader(
        spark, stream_server, endingOffsetsByTimestamp=f'{{"a": {middle}, "b": {late}}}', **both
    )
    assert offsets(df.load()) == {"a": span(0, NODE), "b": span(0, NODE + 5)}
    # A window: [middle, late) of a, nothing of b past its end.
    df = reader(spark, stream_server, subscribe="a", startingTimestamp=middle, endingTimestamp=late)
    assert offsets(df.load()) == {"a": span(NODE, NODE + 10)}
    # The JSON names exactly the streams read.
    with pytest.raises(Exception, match="startingOffsetsByTimestamp must name every stream"):
        reader(
            spark, stream_server, startingOffsetsByTimestamp=f'{{"a": {middle}}}', **both
        ).load().count()


def test_a_start_after_every_message_follows_the_strategy(spark, stream_server, client) -> None:  # noqa: F811
    old_then_new(client, {"a": 3})
    late = after_now()
    with pytest.raises(Exception, match="stream 'a' has no message appended at or after"):
        reader(spark, stream_server, subscribe="a", startingTimestamp=late).load().count()
    latest = {"startingOffsetsByTimestampStrategy": "latest"}
    assert (
        reader(spark, stream_server, subscribe="a", startingTimestamp=late, **latest).load().count()
        == 0
    )
    # A stream with nothing readable skips nothing: no error, no rows.
    assert (
        reader(spark, stream_server, subscribe="empty", startingTimestamp=late).load().count() == 0
    )
    # An end after every message is the stream's end (Kafka: latest).
    assert (
        reader(spark, stream_server, subscribe="a", endingTimestamp=late).load().count() == NODE + 3
    )


def test_pattern_streams_not_in_the_json_start_at_earliest(spark, stream_server, client) -> None:  # noqa: F811
    middle = old_then_new(client, {"ev:a": 2, "ev:b": 2})
    df = reader(
        spark,
        stream_server,
        subscribePattern="ev:*",
        startingOffsetsByTimestamp=f'{{"ev:a": {middle}}}',
    )
    assert offsets(df.load()) == {"ev:a": span(NODE, NODE + 2), "ev:b": span(0, NODE + 2)}


def test_streaming_starts_at_a_time_and_resumes_from_its_checkpoint(
    spark,  # noqa: F811
    stream_server,
    client,
    tmp_path,
) -> None:
    middle = old_then_new(client, {"a": 4})

    def run(starting: int) -> Any:
        df = (
            spark.readStream.format("rcp11")
            .option("port", stream_server.port)
            .option("subscribe", "a,never")  # a missing stream is empty, never an error
            .option("startingTimestamp", starting)
            .load()
        )
        return run_available_now(to_parquet(df, tmp_path))

    assert run(middle).exception() is None
    assert [o for _, o, _ in parquet_rows(spark, tmp_path)] == span(NODE, NODE + 4)
    fill(client, "a", 2, "later")
    # A restart resumes at its checkpoint; the timestamp applies to a new query only.
    assert run(0).exception() is None
    assert [o for _, o, _ in parquet_rows(spark, tmp_path)] == span(NODE, NODE + 6)
