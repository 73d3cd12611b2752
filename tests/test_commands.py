"""Generic Redis commands end to end (docs/PROTOCOL.md section 7), checked
against what a Redis user expects: connection commands (HELLO, SELECT, QUIT,
RESET), the keyspace (SCAN, KEYS, EXPIRE on stream keys) and WATCH. Replies
compared byte for byte with a real redis-server: test_commands_vs_redis.py.
"""

from __future__ import annotations

import time

import pytest
import redis
from conftest import (
    RawClient,
    ServerProcess,
    as_str,
    exchange,
    mbulk,
    parse_map,
    parse_reply,
    tw,
    wait_for,
)


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


def test_select_only_db_zero(shared_client_resp: redis.Redis) -> None:
    assert shared_client_resp.execute_command("SELECT", 0) in (b"OK", "OK", True)
    with pytest.raises(redis.ResponseError):
        shared_client_resp.execute_command("SELECT", 1)


@pytest.mark.slow
def test_hello_reply_fields_and_protocol_switch(shared_server: ServerProcess) -> None:
    cl = shared_server.client(protocol=2)
    reply = cl.execute_command("HELLO", 3, "SETNAME", "me")
    fields = {as_str(k): as_str(v) for k, v in (reply.items() if isinstance(reply, dict) else [])}
    if not fields:
        fields = {as_str(reply[i]): as_str(reply[i + 1]) for i in range(0, len(reply), 2)}
    assert fields["server"] == "redis" and fields["proto"] == 3
    assert fields["mode"] == "standalone" and fields["role"] == "master"
    assert fields["id"] == cl.client_id()
    assert as_str(cl.client_getname()) == "me"
    hello3 = mbulk("HELLO", "3")
    out = exchange(
        shared_server.port,
        hello3 + mbulk("TREAD", "nokey", "0", "1", "BLOCK", "10"),
        until=b"_\r\n",
    )
    assert out.startswith(b"%7\r\n") and out.endswith(b"_\r\n")
    out = exchange(
        shared_server.port,
        mbulk("HELLO", "3") + mbulk("HELLO", "2") + mbulk("TREAD", "no", "0", "1", "BLOCK", "10"),
        until=b"*-1\r\n",
    )
    assert out.endswith(b"*-1\r\n")


def test_reset_returns_to_resp2_and_forgets_name_and_multi(shared_server: ServerProcess) -> None:
    out = exchange(
        shared_server.port,
        mbulk("HELLO", "3")
        + mbulk("CLIENT", "SETNAME", "x")
        + mbulk("MULTI")
        + mbulk("RESET")
        + mbulk("CLIENT", "GETNAME")
        + mbulk("TREAD", "nokey", "0", "1", "BLOCK", "10"),
        until=b"*-1\r\n",
    )
    assert out.endswith(b"+OK\r\n+OK\r\n+RESET\r\n$-1\r\n*-1\r\n")


def test_quit_answers_ok_and_closes(shared_server: ServerProcess) -> None:
    with RawClient(shared_server.port, timeout=3) as raw:
        raw.send(b"QUIT\r\nPING\r\n")
        out = raw.read_until_closed()
    assert out == b"+OK\r\n"


def test_quit_closes_after_reply(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    conn.send(mbulk(b"QUIT") + mbulk(b"PING"))
    assert conn.reply() == b"OK"
    assert conn.closed()


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


def test_scan_type_and_keys_patterns_see_streams(shared_client: redis.Redis) -> None:
    tw(shared_client, "s1", "a")
    tw(shared_client, "s2", "a")
    shared_client.set("k1", "v")
    assert sorted(shared_client.scan_iter(_type="rcp11-log")) == [b"s1", b"s2"]
    assert sorted(shared_client.scan_iter(_type="string")) == [b"k1"]
    assert sorted(shared_client.keys("s?")) == [b"s1", b"s2"]
    assert shared_client.exists("s1", "s1", "k1", "nokey") == 3
    assert shared_client.delete("s1", "k1", "nokey") == 2
    assert shared_client.unlink("s2") == 1
    assert shared_client.dbsize() == 0


def test_expire_on_a_stream_key_removes_it(shared_client: redis.Redis) -> None:
    tw(shared_client, "s", "a", "b")
    assert shared_client.pexpire("s", 100)
    wait_for(lambda: shared_client.exists("s") == 0, timeout=3)
    assert shared_client.info("streams")["streams"] == 0
    assert tw(shared_client, "s", "n") == 0


def test_scan_returns_every_key_once(shared_client: redis.Redis) -> None:
    pipe = shared_client.pipeline(transaction=False)
    for n in range(600):
        if n % 2:
            pipe.execute_command("TWRITE", f"stream:{n}", "x")
        else:
            pipe.set(f"string:{n}", n)
    pipe.execute()
    seen: list[bytes] = []
    cursor = 0
    while True:
        cursor, keys = shared_client.scan(cursor, count=25)
        seen.extend(keys)
        if cursor == 0:
            break
    # SCAN may repeat a key, but must return every key present all along.
    assert len(set(seen)) == 600 and len(seen) < 1200
    streams = list(shared_client.scan_iter(match="stream:*", _type="rcp11-log", count=50))
    assert len(streams) == 300


# -------------------------------------------------------------- transactions


@pytest.mark.parametrize(
    "touch",
    ["flushall", "flushdb", "rename", "expire", "set", "unlink"],
)
def test_watch_is_touched_like_redis(
    shared_client: redis.Redis, shared_server: ServerProcess, touch: str
) -> None:
    other = shared_server.client()
    tw(shared_client, "s", "x")
    shared_client.set("k", "v")
    actions = {
        "flushall": lambda: other.flushall(),
        "flushdb": lambda: other.flushdb(),
        "rename": lambda: other.rename("s", "t"),
        # Expired but not yet deleted at EXEC: nothing shows that without
        # touching the key, so the 1 ms TTL gets a moment to pass.
        "expire": lambda: other.pexpire("s", 1) and time.sleep(0.05),
        "set": lambda: other.set("k", "v2"),
        "unlink": lambda: other.unlink("s"),
    }
    pipe = shared_client.pipeline(transaction=True)
    pipe.watch("s", "k")
    pipe.multi()
    pipe.get("k")
    actions[touch]()
    with pytest.raises(redis.WatchError):
        pipe.execute()
    other.close()


def test_interleaved_scans_each_return_every_key_once(shared_client: redis.Redis) -> None:
    """Each scan keeps its own place: three scans started one after the
    other and advanced in turn each see every key exactly once."""
    names = {f"i{n}".encode() for n in range(300)}
    shared_client.mset(dict.fromkeys(names, "v"))
    cursors = [0, 0, 0]
    seen: list[list[bytes]] = [[], [], []]
    started = [False, False, False]
    while not all(started[i] and cursors[i] == 0 for i in range(3)):
        for i in range(3):
            if started[i] and cursors[i] == 0:
                continue
            cursors[i], keys = shared_client.scan(cursors[i], count=13)
            started[i] = True
            seen[i] += keys
    for keys in seen:
        assert sorted(keys) == sorted(names)


def test_a_cursor_the_server_does_not_know_starts_the_scan_over(
    shared_client: redis.Redis,
) -> None:
    """A cursor from before a restart (or a made-up one) is not an error:
    the scan starts again from the beginning, as Redis may return keys
    twice."""
    names = {f"u{n}".encode() for n in range(40)}
    shared_client.mset(dict.fromkeys(names, "v"))
    seen: list[bytes] = []
    cursor = (987654 << 32) | 5
    while True:
        cursor, keys = shared_client.scan(cursor, count=7)
        seen += keys
        if cursor == 0:
            break
    assert sorted(seen) == sorted(names)
