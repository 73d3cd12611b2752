"""Generic commands end to end (SPEC.md section 5).

Where rcp11 promises Redis's behaviour, the same commands run against a
real redis-server 7 and the raw reply bytes must be identical; the rest is
checked against what a Redis user expects.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from conftest import (
    RawClient,
    RedisServer,
    ServerProcess,
    parse_map,
    parse_reply,
    wait_for,
)


def same_as_redis(srv: ServerProcess, real_port: int, script: list[list[Any]]) -> None:
    """Run script on both servers (each starting empty) and compare every reply."""
    ours, theirs = RawClient(srv.port), RawClient(real_port)
    try:
        for conn in (ours, theirs):
            conn.call("FLUSHALL")
        for argv in script:
            mine, real = ours.call(*argv), theirs.call(*argv)
            if argv[0] == "KEYS" and mine.startswith(b"*"):
                # Redis lists keys in hash-table order; only the set matters.
                mine, real = sorted(parse_reply(mine)), sorted(parse_reply(real))
            if argv[0] == "PTTL" and mine.startswith(b":") and real.startswith(b":"):
                # Each server's clock may have crossed a millisecond since
                # the key was set: a positive PTTL may differ by a few ms.
                ms_mine, ms_real = int(mine[1:]), int(real[1:])
                if ms_mine > 0 and ms_real > 0 and abs(ms_mine - ms_real) <= 50:
                    mine = real
            assert mine == real, f"reply to {argv} differs"
    finally:
        ours.close()
        theirs.close()


COMPARED_SCRIPTS = {
    "ping_echo": [["PING"], ["PING", "hi"], ["PING", "a", "b"], ["ECHO", "x"], ["ECHO"]],
    "unknown": [["NOSUCH"], ["NOSUCH", "a", "b c"], ["nosuch"]],
    "set_options": [
        ["SET", "a", "1"],
        ["SET", "a", "2", "NX"],
        ["SET", "a", "3", "XX"],
        ["SET", "b", "3", "XX"],
        ["SET", "a", "4", "GET"],
        ["SET", "new", "4", "GET"],
        ["SET", "a", "b", "NX", "XX"],
        ["SET", "a", "b", "EX", "0"],
        ["SET", "a", "b", "EX", "-1"],
        ["SET", "a", "b", "EX", "x"],
        ["SET", "a", "b", "EX", "10", "PX", "10"],
        ["SET", "a", "b", "KEEPTTL", "EX", "10"],
        ["SET", "a", "b", "EX"],
        ["SET", "a", "b", "FOO"],
        ["SET", "a"],
        ["GET", "a"],
        ["GET", "missing"],
    ],
    "counters": [
        ["INCR", "n"],
        ["INCRBY", "n", "41"],
        ["DECR", "n"],
        ["DECRBY", "n", "10"],
        ["INCRBY", "n", "x"],
        ["SET", "s", "abc"],
        ["INCR", "s"],
        ["SET", "s", "01"],
        ["INCR", "s"],
        ["SET", "big", "9223372036854775807"],
        ["INCR", "big"],
        ["SET", "small", "-9223372036854775808"],
        ["DECR", "small"],
        ["GET", "n"],
    ],
    "multi_keys": [
        ["MSET", "a", "1", "b", "2"],
        ["MSET", "a"],
        ["MSET", "a", "1", "b"],
        ["MGET", "a", "b", "c"],
        ["EXISTS", "a", "a", "c"],
        ["DEL", "a", "c"],
        ["UNLINK", "b", "b"],
        ["DBSIZE"],
        ["MSETNX", "x", "1", "y", "2"],
        ["MSETNX", "y", "3", "z", "4"],
        ["MGET", "x", "y", "z"],
    ],
    "strings_more": [
        ["APPEND", "a", "hello"],
        ["APPEND", "a", " world"],
        ["STRLEN", "a"],
        ["STRLEN", "nope"],
        ["SETNX", "a", "x"],
        ["SETNX", "b", "x"],
        ["GETDEL", "b"],
        ["GETDEL", "b"],
        ["SETEX", "t", "100", "v"],
        ["TTL", "t"],
        ["SETEX", "t", "0", "v"],
        ["SETEX", "t", "x", "v"],
        ["PSETEX", "t", "100000", "w"],
        ["PTTL", "t"],
        ["PSETEX", "t", "-5", "w"],
        ["GETSET", "t", "z"],
        ["TTL", "t"],
        ["GETSET", "new", "z"],
    ],
    "type_rename": [
        ["TYPE", "a"],
        ["SET", "a", "1"],
        ["TYPE", "a"],
        ["RENAME", "nosuch", "b"],
        ["RENAMENX", "nosuch", "b"],
        ["RENAME", "a", "b"],
        ["GET", "b"],
        ["SET", "c", "3"],
        ["RENAMENX", "b", "c"],
        ["RENAMENX", "b", "d"],
        ["RENAME", "d", "d"],
        ["KEYS", "*"],
    ],
    "expiry": [
        ["SET", "a", "1"],
        ["TTL", "a"],
        ["TTL", "missing"],
        ["PTTL", "missing"],
        ["EXPIRE", "a", "100"],
        ["TTL", "a"],
        ["EXPIRE", "a", "200", "NX"],
        ["EXPIRE", "a", "50", "GT"],
        ["EXPIRE", "a", "500", "GT"],
        ["TTL", "a"],
        ["PERSIST", "a"],
        ["PERSIST", "a"],
        ["TTL", "a"],
        ["EXPIRE", "missing", "10"],
        ["EXPIRE", "a", "x"],
        ["EXPIRE", "a", "10", "NX", "XX"],
        ["EXPIRE", "a", "-1"],
        ["EXISTS", "a"],
        ["SET", "b", "1", "EX", "100"],
        ["SET", "b", "2"],
        ["TTL", "b"],
        ["SET", "b", "2", "EX", "100"],
        ["SET", "b", "3", "KEEPTTL"],
        ["TTL", "b"],
        ["INCR", "b"],
        ["TTL", "b"],
    ],
    "transactions": [
        ["EXEC"],
        ["DISCARD"],
        ["MULTI"],
        ["MULTI"],
        ["WATCH", "a"],
        ["SET", "a", "1"],
        ["INCR", "a"],
        ["GET", "a"],
        ["EXEC"],
        ["MULTI"],
        ["GET"],
        ["SET", "a", "2"],
        ["EXEC"],
        ["GET", "a"],
        ["MULTI"],
        ["SET", "a", "x"],
        ["DISCARD"],
        ["GET", "a"],
        ["WATCH"],
        ["UNWATCH"],
        ["MULTI"],
        ["SET", "s", "str"],
        ["INCR", "s"],
        ["EXEC"],
    ],
    "keys_patterns": [
        ["MSET", "user:1", "a", "user:2", "b", "user:10", "c", "h*llo", "d", "hello", "e"],
        ["KEYS", "user:?"],
        ["KEYS", "user:[1-2]"],
        ["KEYS", "user:[^1]"],
        ["KEYS", "h\\*llo"],
        ["KEYS", "nomatch*"],
        ["KEYS"],
    ],
    "scan_errors": [
        ["SCAN", "x"],
        ["SCAN", "0", "COUNT", "0"],
        ["SCAN", "0", "COUNT", "x"],
        ["SCAN", "0", "FOO", "1"],
        ["SCAN", "0", "MATCH"],
        ["SCAN"],
    ],
    "server_errors": [
        ["SELECT", "0"],
        ["SELECT", "x"],
        ["SELECT", "0", "1"],
        ["FLUSHALL", "x"],
        ["FLUSHDB", "ASYNC"],
        ["FLUSHALL", "SYNC"],
        ["DBSIZE", "x"],
        ["TIME", "x"],
        ["AUTH", "x"],
        ["AUTH", "a", "b", "c"],
        ["AUTH", "default", "anything"],
        ["AUTH", "someone", "x"],
        ["HELLO", "4"],
        ["HELLO", "x"],
        ["HELLO", "3", "AUTH"],
        ["HELLO", "2", "SETNAME"],
        ["HELLO", "3", "FOO"],
    ],
    "client_errors": [
        ["CLIENT"],
        ["CLIENT", "FOO"],
        ["CLIENT", "SETNAME"],
        ["CLIENT", "SETNAME", "a b"],
        ["CLIENT", "GETNAME"],
        ["CLIENT", "SETNAME", "worker-1"],
        ["CLIENT", "GETNAME"],
        ["CLIENT", "SETNAME", ""],
        ["CLIENT", "GETNAME"],
        ["CLIENT", "KILL", "1.2.3.4:5"],
        ["CLIENT", "KILL", "ID", "x"],
        ["CLIENT", "KILL", "ID", "0"],
        ["CLIENT", "KILL", "ID", "999999"],
        ["CLIENT", "KILL", "FOO", "bar"],
        ["CLIENT", "KILL", "ADDR", "1.2.3.4:5", "SKIPME"],
        ["CLIENT", "KILL", "USER", "nobody"],
        ["CLIENT", "NO-EVICT", "on"],
        ["CLIENT", "NO-EVICT", "maybe"],
    ],
    "config_object_memory": [
        ["CONFIG"],
        ["CONFIG", "FOO"],
        ["CONFIG", "GET"],
        ["CONFIG", "SET", "nosuchdirective", "1"],
        ["CONFIG", "SET", "maxmemory", "abc"],
        ["CONFIG", "SET", "maxmemory"],
        ["CONFIG", "GET", "maxmemory"],
        ["SET", "i", "12345"],
        ["SET", "e", "short string"],
        ["SET", "w", "x" * 60],
        ["OBJECT", "ENCODING", "i"],
        ["OBJECT", "ENCODING", "e"],
        ["OBJECT", "ENCODING", "w"],
        ["OBJECT", "ENCODING", "nosuch"],
        ["OBJECT", "FOO", "i"],
        ["OBJECT"],
        ["MEMORY", "USAGE", "nosuch"],
        ["MEMORY", "FOO"],
        ["MEMORY", "USAGE", "i", "SAMPLES", "x"],
        ["COMMAND", "COUNT", "x"],
        ["COMMAND", "FOO"],
        ["COMMAND", "INFO", "nosuchcommand"],
        ["COMMAND", "GETKEYS", "nosuchcommand", "a"],
        ["COMMAND", "GETKEYS", "get", "a"],
        ["COMMAND", "GETKEYS", "mset", "a", "1", "b", "2"],
        ["COMMAND", "GETKEYS", "ping"],
        ["SHUTDOWN", "FOO"],
        ["MULTI"],
        ["SHUTDOWN", "NOSAVE"],
        ["CLIENT", "ID"],
        ["EXEC"],
    ],
}


@pytest.mark.parametrize("name", sorted(COMPARED_SCRIPTS))
def test_replies_are_byte_identical_to_redis(
    shared_server: ServerProcess, redis_reference: RedisServer, name: str
) -> None:
    same_as_redis(shared_server, redis_reference.port, COMPARED_SCRIPTS[name])


def test_scan_walks_every_key_once_with_match_count_and_type(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    names = {f"key:{n}".encode() for n in range(250)}
    shared_client.mset({name: "v" for name in names})
    shared_client.execute_command("TWRITE", "key:stream", "m")
    seen: list[bytes] = []
    cursor = 0
    calls = 0
    while True:
        cursor, keys = shared_client.scan(cursor, count=7)
        seen += keys
        calls += 1
        if cursor == 0:
            break
    assert sorted(seen) == sorted(names | {b"key:stream"})
    assert calls > 250 // 7
    assert set(shared_client.scan_iter(match="key:1?", count=20)) == {
        f"key:1{d}".encode() for d in range(10)
    }
    assert list(shared_client.scan_iter(_type="rcp11-log")) == [b"key:stream"]


def test_scan_keeps_keys_present_for_the_whole_scan_when_others_are_deleted(
    shared_client: redis.Redis,
) -> None:
    shared_client.mset({f"k{n}": n for n in range(100)})
    cursor, first = shared_client.scan(0, count=10)
    shared_client.delete(*[f"k{n}" for n in range(0, 100, 2)])
    seen = set(first)
    while cursor != 0:
        cursor, keys = shared_client.scan(cursor, count=10)
        seen.update(keys)
    assert {f"k{n}".encode() for n in range(1, 100, 2)} <= seen


# ---------------------------------------------------------------- connection


def test_hello_switches_protocol_and_describes_the_server(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    try:
        reply = conn.call("HELLO", "3", "SETNAME", "me")
        assert reply.startswith(b"%7\r\n")
        fields = parse_map(reply)
        assert fields[b"proto"] == 3 and fields[b"role"] == b"master"
        assert fields[b"mode"] == b"standalone" and fields[b"modules"] == []
        assert fields[b"id"] == parse_reply(conn.call("CLIENT", "ID"))
        assert parse_reply(conn.call("CLIENT", "GETNAME")) == b"me"
        assert conn.call("PING") == b"+PONG\r\n"
        assert conn.call("GET", "missing") == b"_\r\n"
        assert conn.call("HELLO", "2").startswith(b"*14\r\n")
        assert conn.call("GET", "missing") == b"$-1\r\n"
    finally:
        conn.close()


def test_hello_map_keys_in_resp2_flat_array(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    try:
        raw = conn.call("HELLO", "2")
    finally:
        conn.close()
    assert raw.startswith(b"*14\r\n$6\r\nserver\r\n")
    for field in (b"version", b"proto", b"id", b"mode", b"role", b"modules"):
        assert b"$%d\r\n%b\r\n" % (len(field), field) in raw


def test_select_only_database_zero(shared_client: redis.Redis) -> None:
    assert shared_client.execute_command("SELECT", 0) is True
    with pytest.raises(redis.ResponseError, match="DB index is out of range"):
        shared_client.execute_command("SELECT", 1)


def test_quit_closes_after_ok(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    try:
        assert conn.call("QUIT") == b"+OK\r\n"
        assert conn.read_until_closed() == b""
    finally:
        conn.close()


def test_reset_leaves_transaction_and_protocol(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    try:
        conn.call("HELLO", "3")
        conn.call("MULTI")
        assert conn.call("RESET") == b"+RESET\r\n"
        assert conn.call("EXEC") == b"-ERR EXEC without MULTI\r\n"
        assert conn.call("HELLO").startswith(b"*14\r\n")
    finally:
        conn.close()


# ---------------------------------------------------------------- server


def test_keys_expire_lazily_and_actively(shared_client: redis.Redis) -> None:
    shared_client.set("lazy", "v", px=1)
    shared_client.set("active", "v", px=1)
    shared_client.set("stays", "v", ex=1000)
    time.sleep(0.01)  # past the 1 ms TTLs: nothing shows it without touching the keys
    assert shared_client.get("lazy") is None  # expired on access
    # Nobody touches "active": the server cron must remove it by itself.
    wait_for(lambda: shared_client.dbsize() == 1, timeout=10)
    assert shared_client.keys("*") == [b"stays"]
    assert shared_client.info("stats")["expired_keys"] >= 2
