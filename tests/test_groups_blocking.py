"""Consumer groups (GROUP, GROUPNEW: docs/PROTOCOL.md section 3, "Consumer
groups") and blocking reads (BLOCK: section 3, "BLOCK"): the group key,
the order waiters are served in, what wakes a waiter and what does not,
timeouts, disconnects, CLIENT UNBLOCK, and blocking inside pipelines and
transactions. Tests that take stream_server run against both servers.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import (
    WRONGTYPE,
    RawClient,
    Reader,
    ServerProcess,
    error_of,
    exchange,
    in_thread,
    mbulk,
    raw_pipeline,
    tr,
    tw,
    twrite,
    wait_blocked,
    wait_for,
)

# -------------------------------------------------------------------- groups


def test_group_starts_at_first_readable_offset_and_advances(
    stream_client_resp: redis.Redis,
) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", *"abcde")
    stream_client_resp.execute_command("TEVICT", "s", 0)
    # The offset argument is ignored in a group read.
    assert tr(stream_client_resp, "s", 99, 2, "GROUP", "g") == [b"b", b"c"]
    assert stream_client_resp.get("g") == b"3"
    assert tr(stream_client_resp, "s", 0, 10, "GROUP", "g", "WITHINFO") == [
        [1, 4, 3, 2],
        b"d",
        b"e",
    ]
    assert stream_client_resp.get("g") == b"5"
    assert tr(stream_client_resp, "s", 0, 10, "GROUP", "g") == []
    assert stream_client_resp.get("g") == b"5"


def test_group_key_is_written_also_when_nothing_is_read(stream_client_resp: redis.Redis) -> None:
    assert tr(stream_client_resp, "s", 0, 10, "GROUP", "g") == []
    assert stream_client_resp.get("g") == b"0"
    twrite(stream_client_resp, "s", "ENTRIES", "a", "b")
    assert tr(stream_client_resp, "s", 0, 10, "GROUPNEW", "h") == []
    assert stream_client_resp.get("h") == b"2"
    twrite(stream_client_resp, "s", "c")
    assert tr(stream_client_resp, "s", 0, 10, "GROUPNEW", "h") == [b"c"]
    assert tr(stream_client_resp, "s", 0, 10, "GROUP", "g") == [b"a", b"b", b"c"]


def test_group_key_is_an_ordinary_string(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "ENTRIES", *"abcd")
    tr(stream_client_resp, "s", 0, 10, "GROUP", "g")
    stream_client_resp.set("g", 1)  # rewind
    assert tr(stream_client_resp, "s", 0, 2, "GROUP", "g") == [b"b", b"c"]
    stream_client_resp.delete("g")  # reset
    assert tr(stream_client_resp, "s", 0, 1, "GROUP", "g") == [b"a"]
    assert stream_client_resp.type("g") == b"string"


def test_group_key_errors(stream_client_resp: redis.Redis) -> None:
    twrite(stream_client_resp, "s", "a")
    stream_client_resp.set("g", "not-a-number")
    message = error_of(stream_client_resp, "TREAD", "s", 0, 1, "GROUP", "g")
    assert message.startswith("group key 'g'")
    stream_client_resp.set("g", "-3")
    assert error_of(stream_client_resp, "TREAD", "s", 0, 1, "GROUP", "g").startswith(
        "group key 'g'"
    )
    assert "group key" in error_of(stream_client_resp, "TREAD", "s", 0, 1, "GROUP", "s")
    twrite(stream_client_resp, "other", "x")
    assert error_of(stream_client_resp, "TREAD", "s", 0, 1, "GROUP", "other") == WRONGTYPE
    assert stream_client_resp.get("g") == b"-3"


def test_group_ignores_offset_and_starts_at_first_readable(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b", "c", "d")
    stream_client_resp.execute_command("TEVICT", "s", 0)
    assert tr(stream_client_resp, "s", 99, 2, "GROUP", "g") == [b"b", b"c"]
    assert stream_client_resp.get("g") == b"3"
    assert tr(stream_client_resp, "s", 0, 10, "GROUP", "g") == [b"d"]
    assert stream_client_resp.get("g") == b"4"


def test_empty_group_read_writes_the_group_key(stream_client_resp: redis.Redis) -> None:
    assert tr(stream_client_resp, "nos", 0, 10, "GROUP", "g") == []
    assert stream_client_resp.get("g") == b"0"
    tw(stream_client_resp, "s", "a", "b")
    assert tr(stream_client_resp, "s", 0, 10, "GROUPNEW", "n") == []
    assert stream_client_resp.get("n") == b"2"
    tw(stream_client_resp, "s", "c")
    assert tr(stream_client_resp, "s", 0, 10, "GROUPNEW", "n") == [b"c"]


def test_group_key_set_rewinds_and_del_resets(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a", "b", "c")
    tr(stream_client_resp, "s", 0, 10, "GROUP", "g")
    stream_client_resp.set("g", 1)
    assert tr(stream_client_resp, "s", 0, 10, "GROUP", "g") == [b"b", b"c"]
    stream_client_resp.delete("g")
    assert tr(stream_client_resp, "s", 0, 1, "GROUP", "g") == [b"a"]


def test_group_withinfo_counts_nulls_and_advances_past_them(
    stream_client_resp: redis.Redis,
) -> None:
    tw(stream_client_resp, "s", "a", "b", "c")
    stream_client_resp.set("g", 0)
    stream_client_resp.execute_command("TEVICT", "s", 0)
    assert tr(stream_client_resp, "s", 0, 2, "GROUP", "g", "WITHINFO") == [[1, 2, 0, 2], None, b"b"]
    assert stream_client_resp.get("g") == b"2"


def test_group_key_not_integer_error_names_it(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a")
    stream_client_resp.set("badgroup", "abc")
    with pytest.raises(redis.ResponseError, match="badgroup"):
        tr(stream_client_resp, "s", 0, 1, "GROUP", "badgroup")
    assert stream_client_resp.get("badgroup") == b"abc"


def test_group_key_equal_to_stream_key_is_error(stream_client_resp: redis.Redis) -> None:
    tw(stream_client_resp, "s", "a")
    with pytest.raises(redis.ResponseError):
        tr(stream_client_resp, "s", 0, 1, "GROUP", "s")
    with pytest.raises(redis.ResponseError):
        tr(stream_client_resp, "s", 0, 1, "GROUPNEW", "s")


def test_group_read_still_parses_the_offset(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a")
    with pytest.raises(redis.ResponseError):
        tr(shared_client_resp, "s", "x", 1, "GROUP", "g")
    assert shared_client_resp.exists("g") == 0


@pytest.mark.parametrize("value", ["-3", " 1", "1 ", "abc", "1.5", ""])
def test_group_key_not_a_valid_offset_is_err_naming_it(
    shared_client_resp: redis.Redis, value: str
) -> None:
    tw(shared_client_resp, "s", "a", "b")
    shared_client_resp.set("grp", value)
    with pytest.raises(redis.ResponseError, match="grp"):
        tr(shared_client_resp, "s", 0, 1, "GROUP", "grp")
    assert shared_client_resp.get("grp") == value.encode()


def test_group_key_holding_a_stream_is_wrongtype(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a")
    tw(shared_client_resp, "other", "b")
    with pytest.raises(redis.ResponseError, match=WRONGTYPE):
        tr(shared_client_resp, "s", 0, 1, "GROUP", "other")
    assert tr(shared_client_resp, "other", 0, 5) == [b"b"]


def test_group_key_beyond_the_end_reads_nothing_and_stays(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a", "b")
    shared_client_resp.set("g", 10)
    assert tr(shared_client_resp, "s", 0, 5, "GROUP", "g", "WITHINFO") == [[0, 1, 10, 0]]
    assert shared_client_resp.get("g") == b"10"
    tw(shared_client_resp, "s", *[f"m{i}" for i in range(2, 12)])
    assert tr(shared_client_resp, "s", 0, 1, "GROUP", "g") == [b"m10"]
    assert shared_client_resp.get("g") == b"11"


def test_group_read_of_count_zero_writes_the_start(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a", "b", "c")
    shared_client_resp.execute_command("TEVICT", "s", 0)
    assert tr(shared_client_resp, "s", 0, 0, "GROUP", "g") == []
    assert shared_client_resp.get("g") == b"1"
    assert tr(shared_client_resp, "s", 0, 0, "GROUPNEW", "n", "WITHINFO") == [[1, 2, 3, 0]]
    assert shared_client_resp.get("n") == b"3"


def test_groupnew_on_an_existing_group_continues_it(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a", "b", "c")
    shared_client_resp.set("g", 1)
    assert tr(shared_client_resp, "s", 0, 5, "GROUPNEW", "g") == [b"b", b"c"]
    assert shared_client_resp.get("g") == b"3"


def test_group_key_with_expiry_resets_the_group_when_it_expires(
    shared_client_resp: redis.Redis,
) -> None:
    tw(shared_client_resp, "s", "a", "b", "c")
    shared_client_resp.set("g", 2, px=100)
    wait_for(lambda: shared_client_resp.exists("g") == 0, timeout=3)
    assert tr(shared_client_resp, "s", 0, 1, "GROUP", "g") == [b"a"]


def test_group_reads_inside_multi(shared_client_resp: redis.Redis) -> None:
    pipe = shared_client_resp.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s", "ENTRIES", "a", "b")
    pipe.execute_command("TREAD", "s", 0, 1, "GROUP", "g")
    pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g", "BLOCK", 0)
    pipe.execute_command("TREAD", "s", 0, 5, "GROUPNEW", "n", "BLOCK", 0, "WITHINFO")
    assert pipe.execute() == [0, [b"a"], [b"b"], [[0, 1, 2, 0]]]
    assert shared_client_resp.mget("g", "n") == [b"2", b"2"]


# ------------------------------------------------------------ blocking reads


def blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


def test_blocked_reader_wakes_on_write(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    twrite(stream_client, "s", "old")
    reader = Reader(stream_server, "TREAD", "s", 1, 10, "BLOCK", 0)
    reader.start()
    wait_blocked(stream_client, 1)
    twrite(stream_client, "s", "ENTRIES", "new1", "new2")
    assert reader.result() == [b"new1", b"new2"]
    assert blocked_clients(stream_client) == 0


def test_pipelined_writes_wake_a_blocked_reader_after_the_first(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    # As in Redis, a reader is served right after the command that fed it,
    # not after the whole pipeline: it gets one message, not three.
    twrite(stream_client, "s", "old")
    reader = Reader(stream_server, "TREAD", "s", 1, 10, "BLOCK", 0)
    reader.start()
    wait_blocked(stream_client, 1)
    pipe = stream_client.pipeline(transaction=False)
    for n in range(3):
        pipe.execute_command("TWRITE", "s", f"new{n}")
    assert pipe.execute() == [1, 2, 3]
    assert reader.result() == [b"new0"]
    assert tr(stream_client, "s", 0, 10) == [b"old", b"new0", b"new1", b"new2"]


def test_block_with_data_available_answers_at_once(stream_client: redis.Redis) -> None:
    twrite(stream_client, "s", "a")
    assert tr(stream_client, "s", 0, 10, "BLOCK", 0) == [b"a"]


@pytest.mark.parametrize("protocol", [2, 3])
def test_block_timeout_is_a_null_array(
    stream_server: ServerProcess, stream_client: redis.Redis, protocol: int
) -> None:
    client = stream_server.client(protocol=protocol)
    try:
        assert tr(client, "s", 0, 10, "BLOCK", 30) is None
        assert tr(client, "s", 0, 10, "BLOCK", 30, "WITHINFO") is None
    finally:
        client.close()


def test_block_timeout_wire_format_resp2(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    with stream_server.raw() as raw:
        raw.send(b"TREAD s 0 1 BLOCK 20\r\nPING\r\n")
        assert raw.read_until(b"+PONG\r\n") == b"*-1\r\n+PONG\r\n"


def test_reader_beyond_next_offset_waits_until_the_stream_reaches_it(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    reader = Reader(stream_server, "TREAD", "s", 3, 10, "BLOCK", 0, "WITHINFO")
    reader.start()
    wait_blocked(stream_client, 1)
    twrite(stream_client, "s", "ENTRIES", "a", "b")
    twrite(stream_client, "s", "c")
    assert reader.is_alive()
    twrite(stream_client, "s", "ENTRIES", "d", "e")
    assert reader.result() == [[0, 4, 3, 2], b"d", b"e"]


def test_blocked_reader_gets_wrongtype_when_the_key_becomes_a_string(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    reader = Reader(stream_server, "TREAD", "s", 0, 1, "BLOCK", 0)
    reader.start()
    wait_blocked(stream_client, 1)
    stream_client.set("s", "text")
    reply = reader.result()
    assert isinstance(reply, redis.ResponseError) and str(reply) == WRONGTYPE


def test_blocked_reader_sees_resp3_reply(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    reader = Reader(stream_server, "TREAD", "s", 0, 5, "BLOCK", 0, "WITHINFO", protocol=3)
    reader.start()
    wait_blocked(stream_client, 1)
    twrite(stream_client, "s", "ENTRIES", "a", "b")
    stream_client.execute_command("TEVICT", "s", 0)  # after the reply: it already has both
    assert reader.result() == [[0, 1, 0, 2], b"a", b"b"]


def test_disconnected_blocked_reader_is_forgotten(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    sock = stream_server.raw()
    sock.send(b"TREAD s 0 1 BLOCK 0 GROUP g\r\n")
    wait_blocked(stream_client, 1)
    stays = Reader(stream_server, "TREAD", "s", 0, 1, "BLOCK", 0, "GROUP", "g")
    stays.start()
    wait_blocked(stream_client, 2)
    sock.close()
    wait_blocked(stream_client, 1)
    twrite(stream_client, "s", "m")
    assert stays.result() == [b"m"]
    assert stream_client.get("g") == b"1"


def test_twrite_is_atomic_for_readers(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    """A reader blocked on the stream gets all entries of one TWRITE at once."""
    reader = stream_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 100, "BLOCK", 5000))
    wait_blocked(stream_client, 1)
    tw(stream_client, "s", *[f"m{i}" for i in range(50)])
    thread.join(5)
    assert box["reply"] == [f"m{i}".encode() for i in range(50)]
    reader.close()


def test_block_timeout_is_null_array_resp2(stream_server: ServerProcess) -> None:
    assert exchange(stream_server.port, b"TREAD nothing 0 10 BLOCK 50\r\n", lines=1) == b"*-1\r\n"


def test_block_timeout_is_null_resp3(stream_server: ServerProcess) -> None:
    reply = exchange(
        stream_server.port,
        b"HELLO 3\r\nTREAD nothing 0 10 BLOCK 50 WITHINFO\r\nPING\r\n",
        until=b"+PONG\r\n",
    )
    assert reply.endswith(b"\r\n_\r\n+PONG\r\n")


def test_block_timeout_redis_py(stream_client_resp: redis.Redis) -> None:
    assert tr(stream_client_resp, "s", 0, 10, "BLOCK", 30) is None


def test_block_wakes_on_write(stream_client: redis.Redis, stream_server: ServerProcess) -> None:
    reader = stream_server.client(protocol=3)
    thread, box = in_thread(lambda: tr(reader, "s", 0, 10, "BLOCK", 0, "WITHINFO"))
    wait_blocked(stream_client, 1)
    tw(stream_client, "s", "a", "b")
    thread.join(5)
    assert box["reply"] == [[0, 1, 0, 2], b"a", b"b"]
    reader.close()


def test_block_beyond_next_offset_waits_until_reached(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    tw(stream_client, "s", "m0")
    reader = stream_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 3, 10, "BLOCK", 5000))
    wait_blocked(stream_client, 1)
    tw(stream_client, "s", "m1")
    tw(stream_client, "s", "m2")
    assert stream_client.info("clients")["blocked_clients"] == 1
    tw(stream_client, "s", "m3", "m4")
    thread.join(5)
    assert box["reply"] == [b"m3", b"m4"]
    reader.close()


def test_disconnected_blocked_client_is_forgotten(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    sock = socket.create_connection(("127.0.0.1", stream_server.port))
    sock.sendall(b"TREAD s 0 5 GROUP g BLOCK 0\r\n")
    wait_blocked(stream_client, 1)
    sock.close()
    wait_blocked(stream_client, 0)
    tw(stream_client, "s", "a", "b")
    assert tr(stream_client, "s", 0, 5, "GROUP", "g") == [b"a", b"b"]


def test_block_inside_multi_does_not_block(stream_client_resp: redis.Redis) -> None:
    pipe = stream_client_resp.pipeline(transaction=True)
    pipe.execute_command("TREAD", "s", 0, 5, "BLOCK", 0)
    pipe.execute_command("TREAD", "s", 0, 5, "BLOCK", 0, "WITHINFO")
    assert pipe.execute() == [[], [[0, -1, 0, 0]]]


def test_pipelined_commands_wait_behind_a_blocked_read(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    with stream_server.raw(timeout=5) as raw:
        raw.send(b"TREAD ord 0 5 BLOCK 5000\r\nPING\r\n")
        wait_blocked(stream_client, 1)
        tw(stream_client, "ord", "x")
        out = raw.read_until(b"+PONG\r\n")  # or what came before the server closed
    assert out == b"*1\r\n$1\r\nx\r\n+PONG\r\n"


def test_every_plain_blocked_reader_gets_the_same_messages(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    readers = [shared_server.client(protocol=2 + n % 2) for n in range(3)]
    jobs = [in_thread(lambda cl=cl: tr(cl, "s", 0, 5, "BLOCK", 5000)) for cl in readers]
    wait_blocked(shared_client, 3)
    tw(shared_client, "s", "a", "b")
    for thread, _ in jobs:
        thread.join(5)
    assert [box["reply"] for _, box in jobs] == [[b"a", b"b"]] * 3
    for cl in readers:
        cl.close()


def test_blocked_reader_is_not_woken_by_other_keys(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "BLOCK", 5000))
    wait_blocked(shared_client, 1)
    tw(shared_client, "other", "x")
    shared_client.set("s2", "y")
    shared_client.ping()
    assert shared_client.info("clients")["blocked_clients"] == 1
    tw(shared_client, "s", "mine")
    thread.join(5)
    assert box["reply"] == [b"mine"]
    reader.close()


def test_blocked_reader_woken_by_backlog_write_sees_evicted_as_null(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "BLOCK", 5000, "WITHINFO"))
    wait_blocked(shared_client, 1)
    shared_client.execute_command("TWRITE", "s", "BACKLOG", 1, "ENTRIES", "a", "b", "c")
    thread.join(5)
    assert box["reply"] == [[2, 2, 0, 3], None, None, b"c"]
    reader.close()


def test_blocked_negative_offset_on_empty_stream_gets_first_write(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", -1, 5, "BLOCK", 5000))
    wait_blocked(shared_client, 1)
    tw(shared_client, "s", "a", "b")
    thread.join(5)
    assert box["reply"] == [b"a", b"b"]
    reader.close()


def test_exec_wakes_blocked_reader_with_the_whole_transaction(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 10, "BLOCK", 5000))
    wait_blocked(shared_client, 1)
    pipe = shared_client.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s", "a")
    pipe.execute_command("TWRITE", "s", "ENTRIES", "b", "c")
    assert pipe.execute() == [0, 1]
    thread.join(5)
    assert box["reply"] == [b"a", b"b", b"c"]
    reader.close()


def test_rename_onto_an_awaited_key_wakes_the_reader(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    # redis-server 7 serves a blocked XREAD when RENAME brings a stream to its key.
    tw(shared_client, "src", "x", "y")
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "dst", 0, 5, "BLOCK", 3000))
    wait_blocked(shared_client, 1)
    shared_client.rename("src", "dst")
    thread.join(5)
    assert box["reply"] == [b"x", b"y"]
    reader.close()


def test_client_kill_of_a_blocked_reader_forgets_it(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    with RawClient(shared_server.port, timeout=5) as victim:
        victim.send(b"CLIENT SETNAME victim\r\nTREAD s 0 5 GROUP g BLOCK 0\r\n")
        wait_blocked(shared_client, 1)
        entry = next(cl for cl in shared_client.client_list() if cl["name"] == "victim")
        assert "b" in entry["flags"] and entry["cmd"] == "tread"
        assert shared_client.execute_command("CLIENT", "KILL", "ID", entry["id"]) == 1
        wait_blocked(shared_client, 0)
        assert victim.closed(timeout=3)
    tw(shared_client, "s", "a", "b")
    assert tr(shared_client, "s", 0, 5, "GROUP", "g") == [b"a", b"b"]


def test_pipeline_mixing_blocking_and_plain_commands(shared_client_resp: redis.Redis) -> None:
    pipe = shared_client_resp.pipeline(transaction=False)
    pipe.execute_command("TWRITE", "s", "a")
    pipe.execute_command("TREAD", "s", 5, 1, "BLOCK", 30)  # times out
    pipe.execute_command("TREAD", "s", 0, 1, "BLOCK", 0)  # data there: no wait
    pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g", "BLOCK", 0)
    pipe.execute_command("TWRITE", "s", "b")
    pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g", "BLOCK", 1000)
    pipe.ping()
    assert pipe.execute() == [0, None, [b"a"], [b"a"], 1, [b"b"], True]


@pytest.mark.slow
def test_blocked_reader_survives_idle_timeout(server_factory: Any) -> None:
    # redis-server never closes a blocked client for `timeout`, only idle ones.
    srv = server_factory(timeout=1)
    admin = srv.client()
    reader = srv.client()
    idle = srv.raw()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "BLOCK", 0))
    wait_blocked(admin, 1)
    assert idle.closed(timeout=6)  # the idle one goes within ~1-2 s

    idle.close()
    assert admin.info("clients")["blocked_clients"] == 1
    tw(admin, "s", "late")
    thread.join(5)
    assert box["reply"] == [b"late"]


def test_wait_beyond_next_is_served_by_a_write_whose_entries_are_evicted_at_once(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    tw(shared_client, "s", "a", "b", "c")
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 5, 5, "BLOCK", 5000, "WITHINFO"))
    wait_blocked(shared_client, 1)
    shared_client.execute_command("TWRITE", "s", "BACKLOG", 0, "ENTRIES", "x", "y", "z")
    thread.join(5)
    assert box["reply"] == [[6, 5, 5, 1], None]


def test_tevict_does_not_wake_waiters(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    tw(shared_client, "s", "a", "b", "c")
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 3, 5, "BLOCK", 5000))
    wait_blocked(shared_client, 1)
    assert shared_client.execute_command("TEVICT", "s", 100) == 3
    shared_client.ping()
    assert shared_client.info("clients")["blocked_clients"] == 1
    tw(shared_client, "s", "d")
    thread.join(5)
    assert box["reply"] == [b"d"]


def test_blocked_client_resumes_its_pipeline(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    reader = RawClient(shared_server.port)
    reader.send(mbulk(b"TREAD", b"b", b"0", b"10", b"BLOCK", b"0") + mbulk(b"ECHO", b"after"))
    writer = shared_server.client()
    wait_blocked(writer, 1)
    assert writer.execute_command("TWRITE", "b", "x") == 0
    assert reader.reply() == [b"x"]
    assert reader.reply() == b"after"


def test_disconnect_while_blocked_is_forgotten(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    conn = RawClient(shared_server.port)
    conn.send(mbulk(b"TREAD", b"gone", b"0", b"10", b"BLOCK", b"0"))
    r = shared_server.client()
    wait_blocked(r, 1)
    conn.close()
    assert wait_for(lambda: int(r.info("clients")["blocked_clients"]) == 0)
    assert r.execute_command("TWRITE", "gone", "x") == 0


def test_block_timeout_and_stats(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    conn.send(mbulk(b"TREAD", b"never", b"0", b"1", b"BLOCK", b"50") + mbulk(b"PING"))
    assert conn.reply() is None  # the null array of a timed-out BLOCK
    assert conn.reply() == b"PONG"
    info = shared_server.client().info()
    assert info["tcp_port"] == shared_server.port
    assert info["total_connections_received"] >= 2
    assert info["total_net_input_bytes"] > 0
    assert info["total_net_output_bytes"] > 0


# ----------------------------------------------------- blocked group readers


def test_group_spreads_messages_over_three_blocked_readers(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    readers = []
    for n in range(3):
        reader = Reader(stream_server, "TREAD", "s", 0, 2, "BLOCK", 0, "GROUP", "g")
        reader.start()
        wait_blocked(stream_client, n + 1)  # fixes the order in which they blocked
        readers.append(reader)
    twrite(stream_client, "s", "ENTRIES", "a", "b", "c", "d", "e")
    assert [reader.result() for reader in readers] == [[b"a", b"b"], [b"c", b"d"], [b"e"]]
    assert stream_client.get("g") == b"5"


def test_group_reader_that_got_nothing_keeps_its_place(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    first = Reader(stream_server, "TREAD", "s", 0, 5, "BLOCK", 0, "GROUP", "g")
    first.start()
    wait_blocked(stream_client, 1)
    second = Reader(stream_server, "TREAD", "s", 0, 5, "BLOCK", 0, "GROUP", "g")
    second.start()
    wait_blocked(stream_client, 2)
    twrite(stream_client, "s", "a")
    assert first.result() == [b"a"]
    third = Reader(stream_server, "TREAD", "s", 0, 5, "BLOCK", 0, "GROUP", "g")
    third.start()
    wait_blocked(stream_client, 2)
    twrite(stream_client, "s", "b")
    assert second.result() == [b"b"]
    twrite(stream_client, "s", "c")
    assert third.result() == [b"c"]


def test_groupnew_blocker_receives_the_next_write(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    twrite(stream_client, "s", "ENTRIES", "old1", "old2")
    reader = Reader(stream_server, "TREAD", "s", 0, 10, "BLOCK", 0, "GROUPNEW", "g")
    reader.start()
    wait_blocked(stream_client, 1)
    assert stream_client.get("g") == b"2"  # created the moment the reader started waiting
    twrite(stream_client, "s", "new")
    assert reader.result() == [b"new"]
    assert stream_client.get("g") == b"3"


def test_blocked_groupnew_creates_key_and_gets_next_write(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    tw(stream_client, "s", "old1", "old2")
    reader = stream_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 10, "GROUPNEW", "g", "BLOCK", 5000))
    wait_blocked(stream_client, 1)
    assert stream_client.get("g") == b"2"
    tw(stream_client, "s", "new")
    thread.join(5)
    assert box["reply"] == [b"new"]
    assert stream_client.get("g") == b"3"
    reader.close()


def test_blocked_group_readers_served_in_order_and_split(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    stream_client.set("g", 0)
    readers = [stream_server.client() for _ in range(3)]
    jobs = []
    for n, reader in enumerate(readers):
        jobs.append(in_thread(lambda c=reader: tr(c, "s", 0, 2, "GROUP", "g", "BLOCK", 5000)))
        wait_blocked(stream_client, n + 1)
    tw(stream_client, "s", "1", "2", "3", "4", "5")
    for thread, _ in jobs:
        thread.join(5)
    assert [box["reply"] for _, box in jobs] == [[b"1", b"2"], [b"3", b"4"], [b"5"]]
    assert stream_client.get("g") == b"5"
    for reader in readers:
        reader.close()


def test_served_group_reader_rejoins_at_the_end(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    stream_client.set("g", 0)
    first, second = stream_server.client(), stream_server.client()
    job1 = in_thread(lambda: tr(first, "s", 0, 1, "GROUP", "g", "BLOCK", 5000))
    wait_blocked(stream_client, 1)
    job2 = in_thread(lambda: tr(second, "s", 0, 1, "GROUP", "g", "BLOCK", 5000))
    wait_blocked(stream_client, 2)
    tw(stream_client, "s", "a")
    job1[0].join(5)
    assert job1[1]["reply"] == [b"a"]
    assert (
        stream_client.info("clients")["blocked_clients"] == 1
    )  # second got nothing, keeps its place
    job3 = in_thread(lambda: tr(first, "s", 0, 1, "GROUP", "g", "BLOCK", 5000))
    wait_blocked(stream_client, 2)
    tw(stream_client, "s", "b")
    job2[0].join(5)
    assert job2[1]["reply"] == [b"b"]
    tw(stream_client, "s", "c")
    job3[0].join(5)
    assert job3[1]["reply"] == [b"c"]
    first.close()
    second.close()


def test_blocked_groupnew_reader_gets_next_write_after_group_reset(
    stream_client: redis.Redis, stream_server: ServerProcess
) -> None:
    tw(stream_client, "s", "old")
    reader = stream_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 10, "GROUPNEW", "g", "BLOCK", 1500))
    wait_blocked(stream_client, 1)
    stream_client.flushall()  # resets the group and the stream
    tw(stream_client, "s", "new")
    thread.join(5)
    assert box.get("reply") == [b"new"]
    reader.close()


def test_blocked_group_reader_creates_group_key_at_first_offset(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    tw(shared_client, "s", "a", "b")
    shared_client.execute_command("TEVICT", "s", 1)
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "GROUP", "g", "BLOCK", 2000))
    wait_blocked(shared_client, 1)
    assert shared_client.get("g") == b"2"
    tw(shared_client, "s", "c")
    thread.join(5)
    assert box["reply"] == [b"c"]
    assert shared_client.get("g") == b"3"
    reader.close()


def test_blocked_group_timeout_leaves_group_key_at_start(shared_client: redis.Redis) -> None:
    assert tr(shared_client, "s", 0, 5, "GROUP", "g", "BLOCK", 30) is None
    assert shared_client.get("g") == b"0"
    tw(shared_client, "s", "a")
    assert tr(shared_client, "s", 0, 5, "GROUP", "g", "BLOCK", 30) == [b"a"]


def test_group_queue_splits_by_each_count_and_withinfo_is_per_client(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    shared_client.set("g", 0)
    a, b, cc = shared_server.client(), shared_server.client(protocol=3), shared_server.client()
    job_a = in_thread(lambda: tr(a, "s", 0, 2, "GROUP", "g", "BLOCK", 5000))
    wait_blocked(shared_client, 1)
    job_b = in_thread(lambda: tr(b, "s", 0, 5, "GROUP", "g", "BLOCK", 5000, "WITHINFO"))
    wait_blocked(shared_client, 2)
    job_c = in_thread(lambda: tr(cc, "s", 0, 1, "GROUP", "g", "BLOCK", 5000))
    wait_blocked(shared_client, 3)
    tw(shared_client, "s", "a", "b", "c", "d")
    job_a[0].join(5)
    job_b[0].join(5)
    assert job_a[1]["reply"] == [b"a", b"b"]
    assert job_b[1]["reply"] == [[0, 3, 2, 2], b"c", b"d"]
    wait_blocked(shared_client, 1)  # c got nothing and keeps waiting
    assert shared_client.get("g") == b"4"
    tw(shared_client, "s", "e")
    job_c[0].join(5)
    assert job_c[1]["reply"] == [b"e"]
    assert shared_client.get("g") == b"5"


def test_group_waiter_that_times_out_leaves_the_queue(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    shared_client.set("g", 0)
    a, b = shared_server.client(), shared_server.client()
    job_a = in_thread(lambda: tr(a, "s", 0, 2, "GROUP", "g", "BLOCK", 100))
    wait_blocked(shared_client, 1)
    job_b = in_thread(lambda: tr(b, "s", 0, 2, "GROUP", "g", "BLOCK", 5000))
    job_a[0].join(5)
    assert job_a[1]["reply"] is None
    wait_blocked(shared_client, 1)
    tw(shared_client, "s", "x")
    job_b[0].join(5)
    assert job_b[1]["reply"] == [b"x"]


def test_plain_and_group_waiters_on_one_stream_are_all_served(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    plain, g1, g2 = shared_server.client(), shared_server.client(), shared_server.client()
    jobs = [
        in_thread(lambda: tr(plain, "s", 0, 5, "BLOCK", 5000)),
        in_thread(lambda: tr(g1, "s", 0, 5, "GROUP", "g1", "BLOCK", 5000)),
        in_thread(lambda: tr(g2, "s", 0, 5, "GROUPNEW", "g2", "BLOCK", 5000)),
    ]
    wait_blocked(shared_client, 3)
    tw(shared_client, "s", "a", "b")
    for thread, _ in jobs:
        thread.join(5)
    assert [box["reply"] for _, box in jobs] == [[b"a", b"b"]] * 3
    assert shared_client.mget("g1", "g2") == [b"2", b"2"]


def test_setting_the_group_key_while_a_reader_waits_moves_its_start(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    tw(shared_client, "s", "a", "b")
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "GROUPNEW", "g", "BLOCK", 5000))
    wait_blocked(shared_client, 1)
    shared_client.set("g", 0)  # rewind: the group's next message now exists
    tw(shared_client, "s", "c")  # at the latest this write serves the reader
    thread.join(5)
    assert box["reply"][:2] == [b"a", b"b"]
    assert shared_client.get("g") == b"%d" % (len(box["reply"]))


def test_group_waiters_served_during_a_pipelined_run(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    shared_client.set("g", 0)
    readers = [shared_server.client() for _ in range(3)]
    jobs = []
    for n, reader in enumerate(readers):
        jobs.append(in_thread(lambda cl=reader: tr(cl, "s", 0, 1, "GROUP", "g", "BLOCK", 5000)))
        wait_blocked(shared_client, n + 1)
    out = raw_pipeline(shared_server.port, [["TWRITE", "s", m] for m in "abcd"])
    assert out == b":0\r\n:1\r\n:2\r\n:3\r\n"
    for thread, _ in jobs:
        thread.join(5)
    assert [box["reply"] for _, box in jobs] == [[b"a"], [b"b"], [b"c"]]
    assert shared_client.get("g") == b"3"
    assert tr(shared_client, "s", 0, 5, "GROUP", "g") == [b"d"]


def test_group_key_moved_by_a_served_waiter_aborts_a_watching_exec(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    tw(shared_client, "s", "x")
    tr(shared_client, "s", 0, 5, "GROUP", "g")
    waiter, writer = shared_server.client(), shared_server.client()
    thread, box = in_thread(lambda: tr(waiter, "s", 0, 5, "GROUP", "g", "BLOCK", 5000))
    wait_blocked(shared_client, 1)
    pipe = shared_client.pipeline(transaction=True)
    pipe.watch("g")
    pipe.multi()
    pipe.get("g")
    tw(writer, "unrelated", "y")
    tw(writer, "s", "z")  # serves the waiter, which moves g
    thread.join(5)
    assert box["reply"] == [b"z"]
    with pytest.raises(redis.WatchError):
        pipe.execute()


def test_asyncio_cancelled_group_waiter_swallows_nothing(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    import asyncio

    import redis.asyncio

    async def scenario() -> None:
        client = redis.asyncio.Redis(port=shared_server.port, protocol=3)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                client.execute_command("TREAD", "s", 0, 5, "GROUPNEW", "g", "BLOCK", 0), 0.3
            )
        await client.aclose()

    asyncio.run(scenario())
    wait_blocked(shared_client, 0)
    assert shared_client.get("g") == b"0"  # created when it started waiting
    tw(shared_client, "s", "a", "b")
    assert tr(shared_client, "s", 0, 5, "GROUP", "g") == [b"a", b"b"]


def test_asyncio_pipelines_and_blocking(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    async def scenario() -> list[Any]:
        client = redis.asyncio.Redis(port=stream_server.port, protocol=3)
        waiter = redis.asyncio.Redis(port=stream_server.port)
        try:
            blocked = asyncio.ensure_future(
                waiter.execute_command("TREAD", "s", 0, 10, "BLOCK", 0, "GROUP", "g")
            )
            deadline = time.monotonic() + 10
            while blocked_clients(stream_client) < 1:
                assert time.monotonic() < deadline, "the reader never blocked"
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


def test_first_blocked_reader_of_a_group_is_served_first_across_streams(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    # Readers of one group are served in the order they blocked, also when
    # they wait on different streams (docs/PROTOCOL.md, Consumer groups),
    # whatever order the streams are written in. rcp11-server only: inside
    # redis-server, Redis serves the module's readers stream by stream.
    first_client, second_client = shared_server.client(), shared_server.client()
    first, first_box = in_thread(lambda: tr(first_client, "s1", 0, 5, "GROUP", "g", "BLOCK", 0))
    wait_blocked(shared_client, 1)
    second, second_box = in_thread(lambda: tr(second_client, "s2", 0, 5, "GROUP", "g", "BLOCK", 0))
    wait_blocked(shared_client, 2)
    # One transaction writes s2 first, then s1: the reader of s1 blocked
    # first, so it is served first (from g = 0), then the reader of s2 from
    # where it stopped.
    pipe = shared_client.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s2", "ENTRIES", "x", "y")
    pipe.execute_command("TWRITE", "s1", "a")
    pipe.execute()
    first.join(10)
    second.join(10)
    assert first_box == {"reply": [b"a"]}
    assert second_box == {"reply": [b"y"]}
    assert shared_client.get("g") == b"2"


# ------------------------------------------------------------ CLIENT UNBLOCK


@pytest.mark.parametrize(("reason", "expected"), [(None, None), ("ERROR", "UNBLOCKED")])
def test_client_unblock_ends_a_blocked_tread(
    stream_server: ServerProcess,
    stream_client: redis.Redis,
    reason: str | None,
    expected: str | None,
) -> None:
    reader = stream_server.client(protocol=2)
    outcome: list[Any] = []

    def read() -> None:
        try:
            outcome.append(reader.execute_command("TREAD", "s", 0, 1, "BLOCK", 0))
        except redis.ResponseError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=read)
    thread.start()
    try:
        wait_blocked(stream_client, 1)
        reader_id = next(c["id"] for c in stream_client.client_list() if c["cmd"] == "tread")
        extra = [reason] if reason else []
        assert stream_client.execute_command("CLIENT", "UNBLOCK", reader_id, *extra) == 1
        thread.join(10)
        assert outcome and (outcome[0] if expected is None else outcome[0].split()[0]) == expected
        # Not blocked any more: nothing to unblock, and the reader works on.
        assert stream_client.execute_command("CLIENT", "UNBLOCK", reader_id) == 0
        assert reader.ping() is True
        assert stream_client.info("clients")["blocked_clients"] == 0
    finally:
        reader.close()


def test_client_unblock_arguments(stream_client: redis.Redis) -> None:
    assert stream_client.execute_command("CLIENT", "UNBLOCK", 999999) == 0
    with pytest.raises(redis.ResponseError, match="not an integer"):
        stream_client.execute_command("CLIENT", "UNBLOCK", "abc")
    with pytest.raises(redis.ResponseError, match="reason should be TIMEOUT or ERROR"):
        stream_client.execute_command("CLIENT", "UNBLOCK", 1, "later")


def test_client_unblock_ends_a_blocked_tread_like_a_timeout(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    waiter = shared_server.client()
    thread, box = in_thread(lambda: tr(waiter, "s", 0, 5, "GROUPNEW", "g", "BLOCK", 0))
    wait_blocked(shared_client, 1)
    waiter_id = next(cl["id"] for cl in shared_client.client_list() if "b" in cl["flags"])
    assert shared_client.execute_command("CLIENT", "UNBLOCK", waiter_id) == 1
    thread.join(5)
    assert box.get("reply", "missing") is None
    assert shared_client.execute_command("CLIENT", "UNBLOCK", waiter_id) == 0
    thread, box = in_thread(lambda: tr(waiter, "s", 0, 5, "BLOCK", 0))
    wait_blocked(shared_client, 1)
    assert shared_client.execute_command("CLIENT", "UNBLOCK", waiter_id, "ERROR") == 1
    thread.join(5)
    assert str(box.get("error", "")) == "UNBLOCKED client unblocked via CLIENT UNBLOCK"
