"""Black-box acceptance tests: one test per SPEC.md rule, run as a user would.

Everything goes over the network (redis-py in RESP2 and RESP3, raw sockets,
redis-cli) or through files and signals (kill -9, config files). Nothing
imports the server. The tests that take `srv` run against both servers:
rcp11-server and redis-server with the rcp11 module (stream_server). Tests for bugs that are still open are marked
``xfail(strict=True)`` with the entry of /work/notes/bugs.md they cover.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import (
    WRONGTYPE,
    stream_info,
    tr,
    tw,
)

# ------------------------------------------------------------ 1. data model


def test_offsets_start_at_zero_and_follow_each_other(stream_client_resp: redis.Redis) -> None:
    assert tw(stream_client_resp, "s", "a") == 0
    assert tw(stream_client_resp, "s", "b", "c", "d") == 1
    assert tw(stream_client_resp, "s", "e") == 4
    assert tr(stream_client_resp, "s", 0, 10) == [b"a", b"b", b"c", b"d", b"e"]


def test_messages_are_binary_safe(stream_client_resp: redis.Redis) -> None:
    blob = bytes(range(256)) + b"\r\n\x00"
    tw(stream_client_resp, "s", blob, b"")
    assert tr(stream_client_resp, "s", 0, 2) == [blob, b""]


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


# ---------------------------------------------------------------- 2. TWRITE


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


# ----------------------------------------------------------------- 3. TREAD


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


# ------------------------------------------------------------------ groups


# ---------------------------------------------------------------- 4. TEVICT


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


# ---------------------------------------------------------------- 5. server


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


# ------------------------------------------------------------ 6. durability


def test_stream_at_offset_ceiling_reads_and_shuts_down(server_factory: Any) -> None:
    # The only way to a stream at 2^63-1 without writing 2^63 messages: the
    # AOF record the server itself logs when it raises a stream's next offset.
    srv = server_factory(appendonly="yes", start=False)
    record = [b"RCP11-RAISE-NEXT", b"s", b"%d" % (2**63 - 1)]
    srv.dir.joinpath("appendonly.aof").write_bytes(
        b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in record)
    )
    srv.start()
    c = srv.client()
    assert tw(c, "s", "last") == 2**63 - 1
    with pytest.raises(redis.ResponseError):
        tw(c, "s", "past")
    c.execute_command("TEVICT", "s", 2**63 - 1)
    info = tr(c, "s", -1, 1, "WITHINFO")[0]  # must be parseable int64s
    assert info[1] == 2**63 - 1
    # A group that read the last possible offset can read again (nothing).
    assert tr(c, "s", 0, 10, "GROUP", "g") == []
    assert tr(c, "s", 0, 10, "GROUP", "g") == []
    assert srv.stop(timeout=5) == 0
