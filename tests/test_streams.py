"""TWRITE / TREAD / TEVICT end to end against a real server (SPEC.md 1-4),
in RESP2 and RESP3, including blocking reads and groups. Every test runs
against both servers: rcp11-server and redis-server with the rcp11 module
(the stream_server fixture)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import ServerProcess, require, wait_blocked

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


@pytest.fixture(scope="module")
def srv(stream_server: ServerProcess) -> ServerProcess:
    return stream_server


@pytest.fixture
def r(srv: ServerProcess) -> Iterator[redis.Redis]:
    client = srv.client(protocol=2)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def r3(srv: ServerProcess, r: redis.Redis) -> Iterator[redis.Redis]:
    client = srv.client(protocol=3)
    yield client
    client.close()


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def rr(request: pytest.FixtureRequest, srv: ServerProcess, r: redis.Redis) -> Iterator[redis.Redis]:
    """The same test in both protocols (the database is already flushed by r)."""
    client = srv.client(protocol=request.param)
    yield client
    client.close()


def twrite(client: redis.Redis, key: str, *args: Any) -> Any:
    return client.execute_command("TWRITE", key, *args)


def tread(client: redis.Redis, key: str, *args: Any) -> Any:
    return client.execute_command("TREAD", key, *args)


def error_of(client: redis.Redis, *argv: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*argv)
    return str(info.value)


def blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


class Reader(threading.Thread):
    """A client that runs one (blocking) command in the background."""

    def __init__(self, srv: ServerProcess, *argv: Any, protocol: int = 2) -> None:
        super().__init__(daemon=True)
        self.client = srv.client(protocol=protocol)
        self.argv = argv
        self.reply: Any = "no reply"

    def run(self) -> None:
        try:
            self.reply = self.client.execute_command(*self.argv)
        except redis.RedisError as exc:
            self.reply = exc
        finally:
            self.client.close()

    def result(self) -> Any:
        self.join(10)
        assert not self.is_alive(), "reader still blocked"
        return self.reply


# -------------------------------------------------------------- TWRITE


def test_twrite_simple_form_returns_consecutive_offsets(rr: redis.Redis) -> None:
    assert twrite(rr, "s", "a") == 0
    assert twrite(rr, "s", "b") == 1
    assert tread(rr, "s", 0, 10) == [b"a", b"b"]


def test_twrite_simple_form_entry_may_be_the_word_entries(rr: redis.Redis) -> None:
    assert twrite(rr, "s", "ENTRIES") == 0
    assert tread(rr, "s", 0, 10) == [b"ENTRIES"]


def test_twrite_entries_form_returns_first_offset_of_the_batch(rr: redis.Redis) -> None:
    assert twrite(rr, "s", "ENTRIES", "a", "b", "c") == 0
    assert twrite(rr, "s", "entries", "d", "e") == 3
    assert tread(rr, "s", 0, 10) == [b"a", b"b", b"c", b"d", b"e"]


def test_twrite_binary_entries_round_trip(rr: redis.Redis) -> None:
    payloads = [b"\x00\r\n\xff", b"", b"x" * 100_000]
    twrite(rr, "s", "ENTRIES", *payloads)
    assert tread(rr, "s", 0, 10) == payloads


def test_twrite_backlog_keeps_the_newest_count_messages(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", "a", "b", "c")
    assert twrite(rr, "s", "BACKLOG", 2, "ENTRIES", "d", "e") == 3
    assert tread(rr, "s", 0, 10) == [None, None, None, b"d", b"e"]
    assert tread(rr, "s", 0, 0, "WITHINFO") == [[3, 4, 0, 0]]
    assert twrite(rr, "s", "BACKLOG", 0, "ENTRIES", "f") == 5
    assert tread(rr, "s", 0, 0, "WITHINFO") == [[6, 5, 0, 0]]


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
    rr: redis.Redis, args: list[str], problem: str
) -> None:
    message = error_of(rr, "TWRITE", "s", *args)
    assert message.startswith("syntax error") and problem in message
    assert rr.exists("s") == 0


@pytest.mark.parametrize("count", ["-1", "x", "1.5"])
def test_twrite_bad_backlog_count(rr: redis.Redis, count: str) -> None:
    assert "BACKLOG count" in error_of(rr, "TWRITE", "s", "BACKLOG", count, "ENTRIES", "x")
    assert rr.exists("s") == 0


def test_twrite_against_a_string_is_wrongtype(rr: redis.Redis) -> None:
    rr.set("k", "v")
    assert error_of(rr, "TWRITE", "k", "x") == WRONGTYPE
    assert rr.get("k") == b"v"


# -------------------------------------------------------------- TREAD


def test_tread_missing_key_is_an_empty_stream(r: redis.Redis, r3: redis.Redis) -> None:
    assert tread(r, "nokey", 0, 10) == []
    assert tread(r, "nokey", 5, 10, "WITHINFO") == [[0, -1, 5, 0]]
    assert tread(r3, "nokey", -3, 10, "WITHINFO") == [[0, -1, 0, 0]]
    assert r.exists("nokey") == 0


def test_tread_offset_and_count(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", *"abcdef")
    assert tread(rr, "s", 2, 3) == [b"c", b"d", b"e"]
    assert tread(rr, "s", 4, 100) == [b"e", b"f"]
    assert tread(rr, "s", 6, 10) == []
    assert tread(rr, "s", 60, 10) == []


def test_tread_negative_offset_counts_back_from_next_and_floors_at_zero(
    rr: redis.Redis,
) -> None:
    twrite(rr, "s", "ENTRIES", *"abcdef")
    assert tread(rr, "s", -2, 10) == [b"e", b"f"]
    assert tread(rr, "s", -100, 2) == [b"a", b"b"]
    assert tread(rr, "s", -2, 10, "WITHINFO")[0] == [0, 5, 4, 2]


def test_tread_withinfo_header(r: redis.Redis, r3: redis.Redis) -> None:
    twrite(r, "s", "ENTRIES", *"abcde")
    r.execute_command("TEVICT", "s", 1)
    for client in (r, r3):
        assert tread(client, "s", 0, 3, "WITHINFO") == [[2, 4, 0, 3], None, None, b"c"]
        assert tread(client, "s", 4, 3, "WITHINFO") == [[2, 4, 4, 1], b"e"]
        assert tread(client, "s", 9, 3, "WITHINFO") == [[2, 4, 9, 0]]


def test_tread_count_zero_returns_no_messages(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", "a", "b")
    assert tread(rr, "s", 0, 0) == []
    assert tread(rr, "s", 0, 0, "WITHINFO") == [[0, 1, 0, 0]]


def test_tread_evicted_offsets_are_nulls_in_both_protocols(r: redis.Redis, r3: redis.Redis) -> None:
    twrite(r, "s", "ENTRIES", *"abcd")
    assert r.execute_command("TEVICT", "s", 1) == 2
    assert tread(r, "s", 0, 10) == [None, None, b"c", b"d"]
    assert tread(r3, "s", 0, 10) == [None, None, b"c", b"d"]


def test_tread_resp3_wire_format_uses_resp3_nulls(srv: ServerProcess, r: redis.Redis) -> None:
    twrite(r, "s", "ENTRIES", "a", "b")
    r.execute_command("TEVICT", "s", 0)
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.sendall(b"HELLO 3\r\n")
        recv_until(sock, b"modules")
        sock.sendall(b"TREAD s 0 5\r\nTREAD s 10 1 BLOCK 1\r\n")
        assert recv_until(sock, b"b\r\n_\r\n") == b"*2\r\n_\r\n$1\r\nb\r\n_\r\n"


def recv_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    sock.settimeout(10)
    while marker not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed; got {data!r}"
        data += chunk
    return data


def test_tread_options_in_any_order(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", "a", "b")
    assert tread(rr, "s", 0, 1, "WITHINFO", "GROUP", "g", "BLOCK", 10) == [[0, 1, 0, 1], b"a"]
    assert tread(rr, "s", 0, 1, "block", 10, "withinfo", "group", "g") == [[0, 1, 1, 1], b"b"]


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
def test_tread_option_errors(rr: redis.Redis, options: list[str], problem: str) -> None:
    assert problem in error_of(rr, "TREAD", "s", 0, 1, *options)


def test_tread_argument_errors(rr: redis.Redis) -> None:
    assert "offset" in error_of(rr, "TREAD", "s", "x", 1)
    assert "count" in error_of(rr, "TREAD", "s", 0, "x")
    assert error_of(rr, "TREAD", "s", 0, -1) == "count must be >= 0"
    assert error_of(rr, "TREAD", "s", 0, 1, "BLOCK", -1) == "timeout is negative"
    assert "timeout" in error_of(rr, "TREAD", "s", 0, 1, "BLOCK", "soon")
    assert error_of(rr, "TREAD", "s", 0, 1, "GROUP", "g", "GROUPNEW", "h") == (
        "GROUP and GROUPNEW cannot be used together"
    )
    assert error_of(rr, "TREAD", "s") == "wrong number of arguments for 'tread' command"


def test_tread_against_a_string_is_wrongtype(rr: redis.Redis) -> None:
    rr.set("k", "v")
    assert error_of(rr, "TREAD", "k", 0, 1) == WRONGTYPE
    assert error_of(rr, "TEVICT", "k", 0) == WRONGTYPE
    twrite(rr, "s", "x")
    assert error_of(rr, "GET", "s") == WRONGTYPE
    assert error_of(rr, "INCR", "s") == WRONGTYPE


# -------------------------------------------------------------- TEVICT


def test_tevict_positive_and_negative(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", *"abcdefgh")
    assert rr.execute_command("TEVICT", "s", 2) == 3
    assert rr.execute_command("TEVICT", "s", 2) == 0
    assert rr.execute_command("TEVICT", "s", -2) == 3
    assert tread(rr, "s", 0, 10, "WITHINFO") == [[6, 7, 0, 8]] + [None] * 6 + [b"g", b"h"]


def test_tevict_missing_key_is_zero_and_creates_nothing(rr: redis.Redis) -> None:
    assert rr.execute_command("TEVICT", "nokey", 5) == 0
    assert rr.exists("nokey") == 0


def test_tevict_past_the_end_empties_but_keeps_next_offset(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", "a", "b")
    assert rr.execute_command("TEVICT", "s", 100) == 2
    assert tread(rr, "s", 0, 0, "WITHINFO") == [[2, 1, 0, 0]]
    assert rr.type("s") == b"rcp11-log"
    assert twrite(rr, "s", "c") == 2


def test_del_forgets_the_history(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", "a", "b")
    assert rr.delete("s") == 1
    assert tread(rr, "s", 0, 0, "WITHINFO") == [[0, -1, 0, 0]]
    assert twrite(rr, "s", "c") == 0


# -------------------------------------------------------------- TCONCAT


def test_tconcat_appends_readable_messages_in_order_and_deletes_sources(r: redis.Redis) -> None:
    twrite(r, "dst", "ENTRIES", "d0", "d1")
    twrite(r, "a", "ENTRIES", "a0", "a1", "a2")
    r.execute_command("TEVICT", "a", 0)  # a0 is not readable: not appended
    twrite(r, "b", "b0")
    assert r.execute_command("TCONCAT", "dst", "a", "missing", "b") == 2
    assert tread(r, "dst", 0, 10) == [b"d0", b"d1", b"a1", b"a2", b"b0"]
    assert r.exists("a", "b", "missing") == 0


def test_tconcat_creates_dst_and_answers_its_next_offset_when_nothing_is_added(
    r: redis.Redis,
) -> None:
    twrite(r, "src", "x")
    assert r.execute_command("TCONCAT", "new", "src") == 0
    assert tread(r, "new", 0, 5, "WITHINFO") == [[0, 0, 0, 1], b"x"]
    assert r.execute_command("TCONCAT", "new", "nothing") == 1
    assert twrite(r, "new", "y") == 1


def test_tconcat_errors_change_nothing(r: redis.Redis) -> None:
    twrite(r, "dst", "d")
    twrite(r, "src", "s")
    r.set("text", "v")
    assert error_of(r, "TCONCAT", "dst", "src", "text") == WRONGTYPE
    assert error_of(r, "TCONCAT", "text", "src") == WRONGTYPE
    assert "source key 'dst'" in error_of(r, "TCONCAT", "dst", "src", "dst")
    assert "source key 'src'" in error_of(r, "TCONCAT", "dst", "src", "src")
    assert error_of(r, "TCONCAT", "dst") == "wrong number of arguments for 'tconcat' command"
    assert tread(r, "dst", 0, 5) == [b"d"] and tread(r, "src", 0, 5) == [b"s"]


def test_tconcat_wakes_readers_of_dst_and_commits_a_watched_transaction(
    srv: ServerProcess, r: redis.Redis
) -> None:
    r.execute_command("TCONCAT", "other", "none")  # before a reader blocks on dst
    reader = Reader(srv, "TREAD", "dst", 0, 10, "BLOCK", 0)
    reader.start()
    wait_blocked(r, 1)
    twrite(r, "stage", "ENTRIES", "m1", "m2")
    with r.pipeline(transaction=True) as pipe:
        pipe.watch("progress")
        pipe.multi()
        pipe.execute_command("TCONCAT", "dst", "stage")
        pipe.set("progress", 7)
        assert pipe.execute() == [0, True]
    assert reader.result() == [b"m1", b"m2"]


# -------------------------------------------------------------- groups


def test_group_starts_at_first_readable_offset_and_advances(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", *"abcde")
    rr.execute_command("TEVICT", "s", 0)
    # The offset argument is ignored in a group read.
    assert tread(rr, "s", 99, 2, "GROUP", "g") == [b"b", b"c"]
    assert rr.get("g") == b"3"
    assert tread(rr, "s", 0, 10, "GROUP", "g", "WITHINFO") == [[1, 4, 3, 2], b"d", b"e"]
    assert rr.get("g") == b"5"
    assert tread(rr, "s", 0, 10, "GROUP", "g") == []
    assert rr.get("g") == b"5"


def test_group_key_is_written_also_when_nothing_is_read(rr: redis.Redis) -> None:
    assert tread(rr, "s", 0, 10, "GROUP", "g") == []
    assert rr.get("g") == b"0"
    twrite(rr, "s", "ENTRIES", "a", "b")
    assert tread(rr, "s", 0, 10, "GROUPNEW", "h") == []
    assert rr.get("h") == b"2"
    twrite(rr, "s", "c")
    assert tread(rr, "s", 0, 10, "GROUPNEW", "h") == [b"c"]
    assert tread(rr, "s", 0, 10, "GROUP", "g") == [b"a", b"b", b"c"]


def test_group_key_is_an_ordinary_string(rr: redis.Redis) -> None:
    twrite(rr, "s", "ENTRIES", *"abcd")
    tread(rr, "s", 0, 10, "GROUP", "g")
    rr.set("g", 1)  # rewind
    assert tread(rr, "s", 0, 2, "GROUP", "g") == [b"b", b"c"]
    rr.delete("g")  # reset
    assert tread(rr, "s", 0, 1, "GROUP", "g") == [b"a"]
    assert rr.type("g") == b"string"


def test_group_key_errors(rr: redis.Redis) -> None:
    twrite(rr, "s", "a")
    rr.set("g", "not-a-number")
    message = error_of(rr, "TREAD", "s", 0, 1, "GROUP", "g")
    assert message.startswith("group key 'g'")
    rr.set("g", "-3")
    assert error_of(rr, "TREAD", "s", 0, 1, "GROUP", "g").startswith("group key 'g'")
    assert "group key" in error_of(rr, "TREAD", "s", 0, 1, "GROUP", "s")
    twrite(rr, "other", "x")
    assert error_of(rr, "TREAD", "s", 0, 1, "GROUP", "other") == WRONGTYPE
    assert rr.get("g") == b"-3"


# -------------------------------------------------------------- blocking


def test_blocked_reader_wakes_on_write(srv: ServerProcess, r: redis.Redis) -> None:
    twrite(r, "s", "old")
    reader = Reader(srv, "TREAD", "s", 1, 10, "BLOCK", 0)
    reader.start()
    wait_blocked(r, 1)
    twrite(r, "s", "ENTRIES", "new1", "new2")
    assert reader.result() == [b"new1", b"new2"]
    assert blocked_clients(r) == 0


def test_pipelined_writes_wake_a_blocked_reader_after_the_first(
    srv: ServerProcess, r: redis.Redis
) -> None:
    # As in Redis, a reader is served right after the command that fed it,
    # not after the whole pipeline: it gets one message, not three.
    twrite(r, "s", "old")
    reader = Reader(srv, "TREAD", "s", 1, 10, "BLOCK", 0)
    reader.start()
    wait_blocked(r, 1)
    pipe = r.pipeline(transaction=False)
    for n in range(3):
        pipe.execute_command("TWRITE", "s", f"new{n}")
    assert pipe.execute() == [1, 2, 3]
    assert reader.result() == [b"new0"]
    assert tread(r, "s", 0, 10) == [b"old", b"new0", b"new1", b"new2"]


def test_block_with_data_available_answers_at_once(r: redis.Redis) -> None:
    twrite(r, "s", "a")
    assert tread(r, "s", 0, 10, "BLOCK", 0) == [b"a"]


@pytest.mark.parametrize("protocol", [2, 3])
def test_block_timeout_is_a_null_array(srv: ServerProcess, r: redis.Redis, protocol: int) -> None:
    client = srv.client(protocol=protocol)
    try:
        assert tread(client, "s", 0, 10, "BLOCK", 30) is None
        assert tread(client, "s", 0, 10, "BLOCK", 30, "WITHINFO") is None
    finally:
        client.close()


def test_block_timeout_wire_format_resp2(srv: ServerProcess, r: redis.Redis) -> None:
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.sendall(b"TREAD s 0 1 BLOCK 20\r\nPING\r\n")
        assert recv_until(sock, b"+PONG\r\n") == b"*-1\r\n+PONG\r\n"


def test_reader_beyond_next_offset_waits_until_the_stream_reaches_it(
    srv: ServerProcess, r: redis.Redis
) -> None:
    reader = Reader(srv, "TREAD", "s", 3, 10, "BLOCK", 0, "WITHINFO")
    reader.start()
    wait_blocked(r, 1)
    twrite(r, "s", "ENTRIES", "a", "b")
    twrite(r, "s", "c")
    assert reader.is_alive()
    twrite(r, "s", "ENTRIES", "d", "e")
    assert reader.result() == [[0, 4, 3, 2], b"d", b"e"]


def test_group_spreads_messages_over_three_blocked_readers(
    srv: ServerProcess, r: redis.Redis
) -> None:
    readers = []
    for n in range(3):
        reader = Reader(srv, "TREAD", "s", 0, 2, "BLOCK", 0, "GROUP", "g")
        reader.start()
        wait_blocked(r, n + 1)  # fixes the order in which they blocked
        readers.append(reader)
    twrite(r, "s", "ENTRIES", "a", "b", "c", "d", "e")
    assert [reader.result() for reader in readers] == [[b"a", b"b"], [b"c", b"d"], [b"e"]]
    assert r.get("g") == b"5"


def test_group_reader_that_got_nothing_keeps_its_place(srv: ServerProcess, r: redis.Redis) -> None:
    first = Reader(srv, "TREAD", "s", 0, 5, "BLOCK", 0, "GROUP", "g")
    first.start()
    wait_blocked(r, 1)
    second = Reader(srv, "TREAD", "s", 0, 5, "BLOCK", 0, "GROUP", "g")
    second.start()
    wait_blocked(r, 2)
    twrite(r, "s", "a")
    assert first.result() == [b"a"]
    third = Reader(srv, "TREAD", "s", 0, 5, "BLOCK", 0, "GROUP", "g")
    third.start()
    wait_blocked(r, 2)
    twrite(r, "s", "b")
    assert second.result() == [b"b"]
    twrite(r, "s", "c")
    assert third.result() == [b"c"]


def test_disconnected_blocked_reader_is_forgotten(srv: ServerProcess, r: redis.Redis) -> None:
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(b"TREAD s 0 1 BLOCK 0 GROUP g\r\n")
    wait_blocked(r, 1)
    stays = Reader(srv, "TREAD", "s", 0, 1, "BLOCK", 0, "GROUP", "g")
    stays.start()
    wait_blocked(r, 2)
    sock.close()
    wait_blocked(r, 1)
    twrite(r, "s", "m")
    assert stays.result() == [b"m"]
    assert r.get("g") == b"1"


def test_groupnew_blocker_receives_the_next_write(srv: ServerProcess, r: redis.Redis) -> None:
    twrite(r, "s", "ENTRIES", "old1", "old2")
    reader = Reader(srv, "TREAD", "s", 0, 10, "BLOCK", 0, "GROUPNEW", "g")
    reader.start()
    wait_blocked(r, 1)
    assert r.get("g") == b"2"  # created the moment the reader started waiting
    twrite(r, "s", "new")
    assert reader.result() == [b"new"]
    assert r.get("g") == b"3"


def test_blocked_reader_gets_wrongtype_when_the_key_becomes_a_string(
    srv: ServerProcess, r: redis.Redis
) -> None:
    reader = Reader(srv, "TREAD", "s", 0, 1, "BLOCK", 0)
    reader.start()
    wait_blocked(r, 1)
    r.set("s", "text")
    reply = reader.result()
    assert isinstance(reply, redis.ResponseError) and str(reply) == WRONGTYPE


def test_blocked_reader_sees_resp3_reply(srv: ServerProcess, r: redis.Redis) -> None:
    reader = Reader(srv, "TREAD", "s", 0, 5, "BLOCK", 0, "WITHINFO", protocol=3)
    reader.start()
    wait_blocked(r, 1)
    twrite(r, "s", "ENTRIES", "a", "b")
    r.execute_command("TEVICT", "s", 0)  # after the reply: it already has both
    assert reader.result() == [[0, 1, 0, 2], b"a", b"b"]


# -------------------------------------------------------------- transactions, pipelines


def test_multi_exec_with_twrite_and_tread(rr: redis.Redis) -> None:
    pipe = rr.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s", "ENTRIES", "a", "b")
    pipe.execute_command("TREAD", "s", 0, 10, "BLOCK", 0)  # does not block in MULTI
    pipe.execute_command("TREAD", "s", 0, 1, "GROUP", "g")
    assert pipe.execute() == [0, [b"a", b"b"], [b"a"]]
    assert rr.get("g") == b"1"


def test_watch_aborts_the_transaction_when_the_stream_grows(
    srv: ServerProcess, r: redis.Redis
) -> None:
    other = srv.client()
    try:
        with r.pipeline(transaction=True) as pipe:
            pipe.watch("s")
            other.execute_command("TWRITE", "s", "sneaky")
            pipe.multi()
            pipe.execute_command("TWRITE", "s", "mine")
            with pytest.raises(redis.WatchError):
                pipe.execute()
    finally:
        other.close()
    assert tread(r, "s", 0, 10) == [b"sneaky"]


def test_pipeline_without_transaction(r: redis.Redis, r3: redis.Redis) -> None:
    for client in (r, r3):
        client.delete("s")
        pipe = client.pipeline(transaction=False)
        for n in range(100):
            pipe.execute_command("TWRITE", "s", f"m{n}")
        pipe.execute_command("TREAD", "s", -2, 2, "WITHINFO")
        replies = pipe.execute()
        assert replies[:100] == list(range(100))
        assert replies[100] == [[0, 99, 98, 2], b"m98", b"m99"]


def test_asyncio_pipelines_and_blocking(srv: ServerProcess, r: redis.Redis) -> None:
    async def scenario() -> list[Any]:
        client = redis.asyncio.Redis(port=srv.port, protocol=3)
        waiter = redis.asyncio.Redis(port=srv.port)
        try:
            blocked = asyncio.ensure_future(
                waiter.execute_command("TREAD", "s", 0, 10, "BLOCK", 0, "GROUP", "g")
            )
            while blocked_clients(r) < 1:
                await asyncio.sleep(0.01)
            async with client.pipeline(transaction=True) as pipe:
                pipe.execute_command("TWRITE", "s", "ENTRIES", "x", "y")
                pipe.execute_command("TREAD", "s", 0, 10)
                transaction = await pipe.execute()
            async with client.pipeline(transaction=False) as pipe:
                pipe.execute_command("TWRITE", "s", "z")
                pipe.execute_command("GET", "g")
                plain = await pipe.execute()
            return [transaction, plain, await blocked]
        finally:
            await client.aclose()
            await waiter.aclose()

    transaction, plain, woken = asyncio.run(scenario())
    assert transaction == [0, [b"x", b"y"]]
    assert plain == [2, b"2"]
    assert woken == [b"x", b"y"]


def test_redis_cli_twrite_and_tread(srv: ServerProcess, r: redis.Redis, tmp_path: Path) -> None:
    require("redis-cli")

    def cli(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(srv.port), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert cli("TWRITE", "s", "hello world") == "0\n"
    assert cli("TWRITE", "s", "BACKLOG", "10", "ENTRIES", "b", "c") == "1\n"
    assert cli("TREAD", "s", "0", "10").splitlines() == ["hello world", "b", "c"]
    # Interactive-style input, as typed at the redis-cli prompt.
    out = cli(stdin='TWRITE s "with space"\nTREAD s -1 1 WITHINFO\n')
    assert out.splitlines() == ["3", "0", "3", "3", "1", "with space"]
    assert cli("-3", "TREAD", "s", "5", "1", "BLOCK", "10") == "\n"


@pytest.mark.parametrize(("reason", "expected"), [(None, None), ("ERROR", "UNBLOCKED")])
def test_client_unblock_ends_a_blocked_tread(
    srv: ServerProcess, r: redis.Redis, reason: str | None, expected: str | None
) -> None:
    reader = srv.client(protocol=2)
    outcome: list[Any] = []

    def read() -> None:
        try:
            outcome.append(reader.execute_command("TREAD", "s", 0, 1, "BLOCK", 0))
        except redis.ResponseError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=read)
    thread.start()
    try:
        wait_blocked(r, 1)
        reader_id = next(c["id"] for c in r.client_list() if c["cmd"] == "tread")
        extra = [reason] if reason else []
        assert r.execute_command("CLIENT", "UNBLOCK", reader_id, *extra) == 1
        thread.join(10)
        assert outcome and (outcome[0] if expected is None else outcome[0].split()[0]) == expected
        # Not blocked any more: nothing to unblock, and the reader works on.
        assert r.execute_command("CLIENT", "UNBLOCK", reader_id) == 0
        assert reader.ping() is True
        assert r.info("clients")["blocked_clients"] == 0
    finally:
        reader.close()


def test_client_unblock_arguments(r: redis.Redis) -> None:
    assert r.execute_command("CLIENT", "UNBLOCK", 999999) == 0
    with pytest.raises(redis.ResponseError, match="not an integer"):
        r.execute_command("CLIENT", "UNBLOCK", "abc")
    with pytest.raises(redis.ResponseError, match="reason should be TIMEOUT or ERROR"):
        r.execute_command("CLIENT", "UNBLOCK", 1, "later")
