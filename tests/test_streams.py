"""TWRITE / TREAD / TEVICT / TCONCAT end to end against a real server
(docs/PROTOCOL.md sections 1-5), in RESP2 and RESP3. Every test runs against
both servers: rcp11-server and redis-server with the rcp11 module (the
stream_server fixture). Groups and blocking reads: test_groups_blocking.py;
edge cases on rcp11-server: test_streams_edge_cases.py."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
from conftest import (
    WRONGTYPE,
    Reader,
    ServerProcess,
    error_of,
    stream_info,
    tr,
    tw,
    twrite,
    wait_blocked,
)


def blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


# -------------------------------------------------------------- TWRITE


def test_twrite_simple_form_returns_consecutive_offsets(stream_client_resp: redis.Redis) -> None:
    assert twrite(stream_client_resp, "s", "a") == 0
    assert twrite(stream_client_resp, "s", "b") == 1
    assert tr(stream_client_resp, "s", 0, 10) == [b"a", b"b"]


def test_twrite_simple_form_entry_may_be_the_word_entries(stream_client_resp: redis.Redis) -> None:
    assert twrite(stream_client_resp, "s", "ENTRIES") == 0
    assert tr(stream_client_resp, "s", 0, 10) == [b"ENTRIES"]


def test_twrite_entries_form_returns_first_offset_of_the_batch(
    stream_client_resp: redis.Redis,
) -> None:
    assert twrite(stream_client_resp, "s", "ENTRIES", "a", "b", "c") == 0
    assert twrite(stream_client_resp, "s", "entries", "d", "e") == 3
    assert tr(stream_client_resp, "s", 0, 10) == [b"a", b"b", b"c", b"d", b"e"]


def test_twrite_binary_entries_round_trip(stream_client_resp: redis.Redis) -> None:
    payloads = [b"\x00\r\n\xff", b"", b"x" * 100_000]
    twrite(stream_client_resp, "s", "ENTRIES", *payloads)
    assert tr(stream_client_resp, "s", 0, 10) == payloads


def test_twrite_backlog_keeps_the_newest_count_messages(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", "a", "b", "c")
    assert twrite(stream_client_resp, "s", "BACKLOG", 2, "ENTRIES", "d", "e") == 3
    assert tr(stream_client_resp, "s", 0, 10) == [None, None, None, b"d", b"e"]
    assert tr(stream_client_resp, "s", 0, 0, "WITHINFO") == [[3, 4, 0, 0]]
    assert twrite(stream_client_resp, "s", "BACKLOG", 0, "ENTRIES", "f") == 5
    assert tr(stream_client_resp, "s", 0, 0, "WITHINFO") == [[6, 5, 0, 0]]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["a", "b"], "unknown option 'a'"),
        (["BACKLOG", "3", "x", "y"], "unknown option 'x'"),
        (["BACKLOG", "3", "x"], "unknown option 'x'"),
        (["BACKLOG", "3"], "ENTRIES is missing"),
        (["BACKLOG", "1", "ENTRIES"], "no entry after ENTRIES"),
        (["BACKLOG", "1", "BACKLOG", "2", "ENTRIES", "x"], "BACKLOG given more than once"),
    ],
)
def test_twrite_syntax_errors_name_the_problem_and_write_nothing(
    stream_client_resp: redis.Redis, args: list[str], problem: str
) -> None:
    message = error_of(stream_client_resp, "TWRITE", "s", *args)
    assert message.startswith("syntax error") and problem in message
    assert stream_client_resp.exists("s") == 0


@pytest.mark.parametrize("count", ["-1", "x", "1.5"])
def test_twrite_bad_backlog_count(stream_client_resp: redis.Redis, count: str) -> None:
    assert "BACKLOG count" in error_of(
        stream_client_resp, "TWRITE", "s", "BACKLOG", count, "ENTRIES", "x"
    )
    assert stream_client_resp.exists("s") == 0


def test_twrite_against_a_string_is_wrongtype(stream_client_resp: redis.Redis) -> None:
    stream_client_resp.set("k", "v")
    assert error_of(stream_client_resp, "TWRITE", "k", "x") == WRONGTYPE
    assert stream_client_resp.get("k") == b"v"


def test_offsets_start_at_zero_and_follow_each_other(stream_client_resp: redis.Redis) -> None:
    assert tw(stream_client_resp, "s", "a") == 0
    assert tw(stream_client_resp, "s", "b", "c", "d") == 1
    assert tw(stream_client_resp, "s", "e") == 4
    assert tr(stream_client_resp, "s", 0, 10) == [b"a", b"b", b"c", b"d", b"e"]


def test_messages_are_binary_safe(stream_client_resp: redis.Redis) -> None:
    blob = bytes(range(256)) + b"\r\n\x00"
    tw(stream_client_resp, "s", blob, b"")
    assert tr(stream_client_resp, "s", 0, 2) == [blob, b""]


def test_simple_form_takes_any_bytes_as_the_entry(stream_client_resp: redis.Redis) -> None:
    assert stream_client_resp.execute_command("TWRITE", "s", "ENTRIES") == 0
    assert stream_client_resp.execute_command("TWRITE", "s", "BACKLOG") == 1
    assert tr(stream_client_resp, "s", 0, 10) == [b"ENTRIES", b"BACKLOG"]


@pytest.mark.parametrize(
    "args",
    [
        ["BACKLOG", "1", "ENTRIES"],  # no entry after ENTRIES
        ["BACKLOG", "1", "x"],  # ENTRIES missing
        ["FOO", "1", "ENTRIES", "x"],  # unknown option
        ["BACKLOG", "-1", "ENTRIES", "x"],  # bad count
        ["BACKLOG", "x", "ENTRIES", "x"],
        ["a", "b"],
    ],
)
def test_twrite_bad_syntax_is_an_error_and_writes_nothing(
    stream_client_resp: redis.Redis, args: list[str]
) -> None:
    with pytest.raises(redis.ResponseError, match="^(syntax error|.*)"):
        stream_client_resp.execute_command("TWRITE", "s", *args)
    assert stream_client_resp.exists("s") == 0


def test_twrite_without_entry_is_wrong_arity(stream_client_resp: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'twrite' command"):
        stream_client_resp.execute_command("TWRITE", "s")


def test_backlog_keeps_exactly_the_newest(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b")
    assert (
        stream_client_resp.execute_command("TWRITE", "s", "BACKLOG", 2, "ENTRIES", "c", "d", "e")
        == 2
    )
    assert tr(stream_client_resp, "s", 0, 10, "WITHINFO") == [
        [3, 4, 0, 5],
        None,
        None,
        None,
        b"d",
        b"e",
    ]
    assert stream_client_resp.execute_command("TWRITE", "t", "BACKLOG", 10, "ENTRIES", "a") == 0
    assert tr(stream_client_resp, "t", 0, 10) == [b"a"]
    assert stream_client_resp.execute_command("TWRITE", "u", "BACKLOG", 0, "ENTRIES", "a", "b") == 0
    assert tr(stream_client_resp, "u", 0, 10, "WITHINFO") == [[2, 1, 0, 2], None, None]


# -------------------------------------------------------------- TREAD


def test_tread_missing_key_is_an_empty_stream(
    stream_client: redis.Redis, stream_client3: redis.Redis
) -> None:
    assert tr(stream_client, "nokey", 0, 10) == []
    assert tr(stream_client, "nokey", 5, 10, "WITHINFO") == [[0, -1, 5, 0]]
    assert tr(stream_client3, "nokey", -3, 10, "WITHINFO") == [[0, -1, 0, 0]]
    assert stream_client.exists("nokey") == 0


def test_tread_offset_and_count(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", *"abcdef")
    assert tr(stream_client_resp, "s", 2, 3) == [b"c", b"d", b"e"]
    assert tr(stream_client_resp, "s", 4, 100) == [b"e", b"f"]
    assert tr(stream_client_resp, "s", 6, 10) == []
    assert tr(stream_client_resp, "s", 60, 10) == []


def test_tread_negative_offset_counts_back_from_next_and_floors_at_zero(
    stream_client_resp: redis.Redis,
) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", *"abcdef")
    assert tr(stream_client_resp, "s", -2, 10) == [b"e", b"f"]
    assert tr(stream_client_resp, "s", -100, 2) == [b"a", b"b"]
    assert tr(stream_client_resp, "s", -2, 10, "WITHINFO")[0] == [0, 5, 4, 2]


def test_tread_withinfo_header(stream_client: redis.Redis, stream_client3: redis.Redis) -> None:
    twrite(stream_client, "s", "ENTRIES", *"abcde")
    stream_client.execute_command("TEVICT", "s", 1)
    for client in (stream_client, stream_client3):
        assert tr(client, "s", 0, 3, "WITHINFO") == [[2, 4, 0, 3], None, None, b"c"]
        assert tr(client, "s", 4, 3, "WITHINFO") == [[2, 4, 4, 1], b"e"]
        assert tr(client, "s", 9, 3, "WITHINFO") == [[2, 4, 9, 0]]


def test_tread_count_zero_returns_no_messages(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", "a", "b")
    assert tr(stream_client_resp, "s", 0, 0) == []
    assert tr(stream_client_resp, "s", 0, 0, "WITHINFO") == [[0, 1, 0, 0]]


def test_tread_evicted_offsets_are_nulls_in_both_protocols(
    stream_client: redis.Redis, stream_client3: redis.Redis
) -> None:
    twrite(stream_client, "s", "ENTRIES", *"abcd")
    assert stream_client.execute_command("TEVICT", "s", 1) == 2
    assert tr(stream_client, "s", 0, 10) == [None, None, b"c", b"d"]
    assert tr(stream_client3, "s", 0, 10) == [None, None, b"c", b"d"]


def test_tread_resp3_wire_format_uses_resp3_nulls(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    twrite(stream_client, "s", "ENTRIES", "a", "b")
    stream_client.execute_command("TEVICT", "s", 0)
    with stream_server.raw() as raw:
        raw.call("HELLO", "3")
        raw.send(b"TREAD s 0 5\r\nTREAD s 10 1 BLOCK 1\r\n")
        assert raw.read_until(b"b\r\n_\r\n") == b"*2\r\n_\r\n$1\r\nb\r\n_\r\n"


def test_tread_options_in_any_order(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", "a", "b")
    assert tr(stream_client_resp, "s", 0, 1, "WITHINFO", "GROUP", "g", "BLOCK", 10) == [
        [0, 1, 0, 1],
        b"a",
    ]
    assert tr(stream_client_resp, "s", 0, 1, "block", 10, "withinfo", "group", "g") == [
        [0, 1, 1, 1],
        b"b",
    ]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["WITHINFO", "WITHINFO"], "WITHINFO given more than once"),
        (["BLOCK", "1", "BLOCK", "2"], "BLOCK given more than once"),
        (["GROUP", "g", "GROUP", "h"], "GROUP given more than once"),
        (["BLOCK"], "BLOCK needs a value"),
        (["GROUP"], "GROUP needs a value"),
        (["FOO"], "unknown option 'FOO'"),
    ],
)
def test_tread_option_errors(
    stream_client_resp: redis.Redis, options: list[str], problem: str
) -> None:
    assert problem in error_of(stream_client_resp, "TREAD", "s", 0, 1, *options)


def test_tread_argument_errors(stream_client_resp: redis.Redis) -> None:
    assert "offset" in error_of(stream_client_resp, "TREAD", "s", "x", 1)
    assert "count" in error_of(stream_client_resp, "TREAD", "s", 0, "x")
    assert error_of(stream_client_resp, "TREAD", "s", 0, -1) == "count must be >= 0"
    assert error_of(stream_client_resp, "TREAD", "s", 0, 1, "BLOCK", -1) == "timeout is negative"
    assert "timeout" in error_of(stream_client_resp, "TREAD", "s", 0, 1, "BLOCK", "soon")
    assert error_of(stream_client_resp, "TREAD", "s", 0, 1, "GROUP", "g", "GROUPNEW", "h") == (
        "GROUP and GROUPNEW cannot be used together"
    )
    assert (
        error_of(stream_client_resp, "TREAD", "s")
        == "wrong number of arguments for 'tread' command"
    )


def test_tread_against_a_string_is_wrongtype(stream_client_resp: redis.Redis) -> None:
    stream_client_resp.set("k", "v")
    assert error_of(stream_client_resp, "TREAD", "k", 0, 1) == WRONGTYPE
    assert error_of(stream_client_resp, "TEVICT", "k", 0) == WRONGTYPE
    twrite(stream_client_resp, "s", "x")
    assert error_of(stream_client_resp, "GET", "s") == WRONGTYPE
    assert error_of(stream_client_resp, "INCR", "s") == WRONGTYPE


def test_missing_key_reads_as_empty_stream(stream_client_resp: redis.Redis) -> None:
    assert tr(stream_client_resp, "nokey", 0, 10) == []
    assert tr(stream_client_resp, "nokey", 0, 10, "WITHINFO") == [[0, -1, 0, 0]]
    assert stream_client_resp.exists("nokey") == 0


def test_other_type_answers_wrongtype(stream_client_resp: redis.Redis) -> None:
    stream_client_resp.set("str", "v")
    for cmd in (["TWRITE", "str", "x"], ["TREAD", "str", 0, 1], ["TEVICT", "str", 1]):
        with pytest.raises(redis.ResponseError, match=WRONGTYPE):
            stream_client_resp.execute_command(*cmd)
    tw(stream_client_resp, "s", "x")
    with pytest.raises(redis.ResponseError, match=WRONGTYPE):
        stream_client_resp.get("s")
    assert stream_client_resp.type("s") in (b"rcp11-log", "rcp11-log")
    assert stream_client_resp.type("str") in (b"string", "string")


def test_negative_offset_counts_back_from_next_and_floors_at_zero(
    stream_client_resp: redis.Redis,
) -> None:
    tw(stream_client_resp, "s", *[str(i) for i in range(20)])
    assert tr(stream_client_resp, "s", -10, 10) == [str(i).encode() for i in range(10, 20)]
    assert tr(stream_client_resp, "s", -2, 10) == [b"18", b"19"]
    assert tr(stream_client_resp, "s", -100, 2) == [b"0", b"1"]
    assert tr(stream_client_resp, "s", -100, 1, "WITHINFO")[0] == [0, 19, 0, 1]


def test_reply_stops_at_last_offset_and_past_next_is_empty(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b", "c")
    assert tr(stream_client_resp, "s", 1, 100) == [b"b", b"c"]
    assert tr(stream_client_resp, "s", 3, 10) == []
    assert tr(stream_client_resp, "s", 1000, 10) == []


def test_evicted_offsets_are_null_in_place(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b", "c", "d")
    stream_client_resp.execute_command("TEVICT", "s", 1)
    assert tr(stream_client_resp, "s", 0, 10) == [None, None, b"c", b"d"]


def test_withinfo_shape(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b", "c", "d")
    stream_client_resp.execute_command("TEVICT", "s", 0)
    assert tr(stream_client_resp, "s", 0, 2, "WITHINFO") == [[1, 3, 0, 2], None, b"b"]
    assert tr(stream_client_resp, "s", -1, 5, "WITHINFO") == [[1, 3, 3, 1], b"d"]
    assert tr(stream_client_resp, "s", 10, 5, "WITHINFO")[0][:2] == [1, 3]
    assert tr(stream_client_resp, "s", 10, 5, "WITHINFO")[0][3] == 0


def test_count_zero_returns_no_messages(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b")
    assert tr(stream_client_resp, "s", 0, 0) == []
    assert tr(stream_client_resp, "s", 0, 0, "WITHINFO") == [[0, 1, 0, 0]]


def test_options_in_any_order(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b")
    a = tr(stream_client_resp, "s", 0, 5, "WITHINFO", "BLOCK", 10, "GROUP", "g1")
    b = tr(stream_client_resp, "s", 0, 5, "GROUP", "g2", "WITHINFO", "BLOCK", 10)
    assert a == b == [[0, 1, 0, 2], b"a", b"b"]


@pytest.mark.parametrize(
    "opts",
    [
        ["WITHINFO", "WITHINFO"],
        ["BLOCK", "1", "BLOCK", "1"],
        ["GROUP", "g", "GROUPNEW", "h"],
        ["GROUP", "g", "GROUP", "g"],
        ["BLOCK", "-1"],
        ["BLOCK", "x"],
        ["FOO"],
        ["GROUP"],
    ],
)
def test_tread_bad_options_are_errors(stream_client_resp: redis.Redis, opts: list[str]) -> None:
    tw(stream_client_resp, "s", "a")
    with pytest.raises(redis.ResponseError):
        tr(stream_client_resp, "s", 0, 5, *opts)
    assert stream_client_resp.exists("g") == 0 and stream_client_resp.exists("h") == 0


@pytest.mark.parametrize("bad", [["x", "1"], ["0", "-1"], ["0", "x"], ["9223372036854775808", "1"]])
def test_tread_bad_offset_or_count(stream_client_resp: redis.Redis, bad: list[str]) -> None:
    with pytest.raises(redis.ResponseError):
        tr(stream_client_resp, "s", *bad)


# -------------------------------------------------------------- TEVICT


def test_tevict_positive_and_negative(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", *"abcdefgh")
    assert stream_client_resp.execute_command("TEVICT", "s", 2) == 3
    assert stream_client_resp.execute_command("TEVICT", "s", 2) == 0
    assert stream_client_resp.execute_command("TEVICT", "s", -2) == 3
    assert tr(stream_client_resp, "s", 0, 10, "WITHINFO") == [[6, 7, 0, 8]] + [None] * 6 + [
        b"g",
        b"h",
    ]


def test_tevict_missing_key_is_zero_and_creates_nothing(stream_client_resp: redis.Redis) -> None:
    assert stream_client_resp.execute_command("TEVICT", "nokey", 5) == 0
    assert stream_client_resp.exists("nokey") == 0


def test_tevict_past_the_end_empties_but_keeps_next_offset(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", "a", "b")
    assert stream_client_resp.execute_command("TEVICT", "s", 100) == 2
    assert tr(stream_client_resp, "s", 0, 0, "WITHINFO") == [[2, 1, 0, 0]]
    assert stream_client_resp.type("s") == b"rcp11-log"
    assert twrite(stream_client_resp, "s", "c") == 2


def test_del_forgets_the_history(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", "a", "b")
    assert stream_client_resp.delete("s") == 1
    assert tr(stream_client_resp, "s", 0, 0, "WITHINFO") == [[0, -1, 0, 0]]
    assert twrite(stream_client_resp, "s", "c") == 0


def test_del_restarts_offsets_at_zero(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b", "c")
    assert stream_client_resp.delete("s") == 1
    assert tw(stream_client_resp, "s", "x") == 0
    assert tr(stream_client_resp, "s", 0, 10, "WITHINFO") == [[0, 0, 0, 1], b"x"]


def test_next_offset_survives_evicting_everything(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b", "c")
    assert stream_client_resp.execute_command("TEVICT", "s", 100) == 3
    assert stream_client_resp.exists("s") == 1
    assert tr(stream_client_resp, "s", 0, 10, "WITHINFO") == [[3, 2, 0, 3], None, None, None]
    assert tw(stream_client_resp, "s", "d") == 3


def test_tevict_counts_and_negative_keeps_newest(stream_client_resp: redis.Redis) -> None:
    assert stream_client_resp.execute_command("TEVICT", "missing", 5) == 0
    tw(stream_client_resp, "s", *"abcdef")
    assert stream_client_resp.execute_command("TEVICT", "s", 1) == 2
    assert stream_client_resp.execute_command("TEVICT", "s", 1) == 0
    assert stream_client_resp.execute_command("TEVICT", "s", -2) == 2
    assert tr(stream_client_resp, "s", 0, 10) == [None, None, None, None, b"e", b"f"]
    assert stream_client_resp.execute_command("TEVICT", "s", -10) == 0
    assert stream_client_resp.execute_command("TEVICT", "s", 1000) == 2
    assert tr(stream_client_resp, "s", 0, 0, "WITHINFO") == [[6, 5, 0, 0]]


def test_evicted_macronodes_give_memory_back(stream_client: redis.Redis) -> None:
    tw(stream_client, "s", *[b"x" * 100] * 5000)
    before = stream_client.memory_usage("s")
    stream_client.execute_command("TEVICT", "s", -1)
    after = stream_client.memory_usage("s")
    assert after < before / 2
    assert stream_info(stream_client)["stream_messages"] == 1


# -------------------------------------------------------------- TCONCAT


def test_tconcat_appends_readable_messages_in_order_and_deletes_sources(
    stream_client: redis.Redis,
) -> None:
    twrite(stream_client, "dst", "ENTRIES", "d0", "d1")
    twrite(stream_client, "a", "ENTRIES", "a0", "a1", "a2")
    stream_client.execute_command("TEVICT", "a", 0)  # a0 is not readable: not appended
    twrite(stream_client, "b", "b0")
    assert stream_client.execute_command("TCONCAT", "dst", "a", "missing", "b") == 2
    assert tr(stream_client, "dst", 0, 10) == [b"d0", b"d1", b"a1", b"a2", b"b0"]
    assert stream_client.exists("a", "b", "missing") == 0


def test_tconcat_creates_dst_and_answers_its_next_offset_when_nothing_is_added(
    stream_client: redis.Redis,
) -> None:
    twrite(stream_client, "src", "x")
    assert stream_client.execute_command("TCONCAT", "new", "src") == 0
    assert tr(stream_client, "new", 0, 5, "WITHINFO") == [[0, 0, 0, 1], b"x"]
    assert stream_client.execute_command("TCONCAT", "new", "nothing") == 1
    assert twrite(stream_client, "new", "y") == 1


def test_tconcat_with_nothing_to_move_still_creates_dst(stream_client: redis.Redis) -> None:
    assert stream_client.execute_command("TCONCAT", "made", "missing", "absent") == 0
    assert stream_client.exists("made") == 1
    assert tr(stream_client, "made", 0, 0, "WITHINFO") == [[0, -1, 0, 0]]
    twrite(stream_client, "empty", "x")
    stream_client.execute_command("TEVICT", "empty", 0)  # a source with nothing readable
    assert stream_client.execute_command("TCONCAT", "made-too", "empty") == 0
    assert stream_client.exists("made-too", "empty") == 1


@pytest.mark.parametrize("watched", ["missing-source", "existing-dst", "new-dst"])
def test_tconcat_aborts_a_transaction_watching_any_key_it_names(
    stream_server: ServerProcess, stream_client: redis.Redis, watched: str
) -> None:
    """Even when nothing moves: a WATCHed missing source, or the destination,
    counts as modified (the module's way, inside redis-server)."""
    twrite(stream_client, "existing-dst", "d")
    other = stream_server.client()
    with stream_client.pipeline(transaction=True) as pipe:
        pipe.watch(watched)
        other.execute_command(
            "TCONCAT", "new-dst" if watched == "new-dst" else "existing-dst", "missing-source"
        )
        pipe.multi()
        pipe.set("progress", 1)
        with pytest.raises(redis.WatchError):
            pipe.execute()
    assert stream_client.exists("progress") == 0
    other.close()


def test_tconcat_errors_change_nothing(stream_client: redis.Redis) -> None:
    twrite(stream_client, "dst", "d")
    twrite(stream_client, "src", "s")
    stream_client.set("text", "v")
    assert error_of(stream_client, "TCONCAT", "dst", "src", "text") == WRONGTYPE
    assert error_of(stream_client, "TCONCAT", "text", "src") == WRONGTYPE
    assert "source key 'dst'" in error_of(stream_client, "TCONCAT", "dst", "src", "dst")
    assert "source key 'src'" in error_of(stream_client, "TCONCAT", "dst", "src", "src")
    assert (
        error_of(stream_client, "TCONCAT", "dst")
        == "wrong number of arguments for 'tconcat' command"
    )
    assert tr(stream_client, "dst", 0, 5) == [b"d"] and tr(stream_client, "src", 0, 5) == [b"s"]


def test_tconcat_wakes_readers_of_dst_and_commits_a_watched_transaction(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    stream_client.execute_command("TCONCAT", "other", "none")  # before a reader blocks on dst
    reader = Reader(stream_server, "TREAD", "dst", 0, 10, "BLOCK", 0)
    reader.start()
    wait_blocked(stream_client, 1)
    twrite(stream_client, "stage", "ENTRIES", "m1", "m2")
    with stream_client.pipeline(transaction=True) as pipe:
        pipe.watch("progress")
        pipe.multi()
        pipe.execute_command("TCONCAT", "dst", "stage")
        pipe.set("progress", 7)
        assert pipe.execute() == [0, True]
    assert reader.result() == [b"m1", b"m2"]


# -------------------------------------------------------------- transactions, pipelines


def test_multi_exec_with_twrite_and_tread(stream_client_resp: redis.Redis) -> None:
    pipe = stream_client_resp.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s", "ENTRIES", "a", "b")
    pipe.execute_command("TREAD", "s", 0, 10, "BLOCK", 0)  # does not block in MULTI
    pipe.execute_command("TREAD", "s", 0, 1, "GROUP", "g")
    assert pipe.execute() == [0, [b"a", b"b"], [b"a"]]
    assert stream_client_resp.get("g") == b"1"


def test_watch_aborts_the_transaction_when_the_stream_grows(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    other = stream_server.client()
    try:
        with stream_client.pipeline(transaction=True) as pipe:
            pipe.watch("s")
            other.execute_command("TWRITE", "s", "sneaky")
            pipe.multi()
            pipe.execute_command("TWRITE", "s", "mine")
            with pytest.raises(redis.WatchError):
                pipe.execute()
    finally:
        other.close()
    assert tr(stream_client, "s", 0, 10) == [b"sneaky"]


# ---------------------------------------- stream keys under generic commands


def test_error_texts_match_redis(stream_client: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError) as exc:
        stream_client.execute_command("FOO", "a", "b")
    assert str(exc.value) == "unknown command 'FOO', with args beginning with: 'a' 'b' "
    with pytest.raises(redis.ResponseError) as exc:
        stream_client.execute_command("GET")
    assert str(exc.value) == "wrong number of arguments for 'get' command"


def test_type_exists_scan_rename_on_streams(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a")
    stream_client_resp.rename("s", "t")
    assert tr(stream_client_resp, "t", 0, 5) == [b"a"]
    assert stream_client_resp.exists("s", "t") == 1
    assert stream_client_resp.object("encoding", "t") is not None
    assert isinstance(stream_client_resp.memory_usage("t"), int)
