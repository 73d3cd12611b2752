"""TSEEK, the retention directives, streams-oldest and their INFO fields
against a running rcp11-server (docs/PROTOCOL.md section 6). Time is driven
by short retentions (tens of ms) and waited on with wait_for, never slept."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from conftest import ServerProcess, in_thread, wait_blocked, wait_for


def tw(client: redis.Redis, key: str, *entries: Any) -> int:
    if len(entries) == 1:
        return client.execute_command("TWRITE", key, entries[0])
    return client.execute_command("TWRITE", key, "ENTRIES", *entries)


def streams_info(client: redis.Redis) -> dict[str, Any]:
    return client.info("streams")


def clock_after(ms: int) -> int:
    """Wait until the wall clock (the server's too: same machine) passes
    ms; return the time then."""
    wait_for(lambda: time.time_ns() // 1_000_000 > ms, timeout=5)
    return time.time_ns() // 1_000_000


# -- TSEEK -------------------------------------------------------------------


def test_tseek_finds_the_first_message_appended_at_or_after_a_time(server_factory) -> None:
    srv = server_factory(stream_node_max_entries=100)
    c = srv.client()
    before = time.time_ns() // 1_000_000 - 1
    tw(c, "s", *[b"a%d" % i for i in range(10)])
    mark = clock_after(time.time_ns() // 1_000_000)
    tw(c, "s", *[b"b%d" % i for i in range(7)])
    assert c.execute_command("TSEEK", "s", before) == 0
    # Exact to the message: offsets 9 and 10 share a node.
    assert c.execute_command("TSEEK", "s", mark) == 10
    assert c.execute_command("TSEEK", "s", mark + 60_000) == 17  # the next offset
    assert c.execute_command("TSEEK", "missing", mark) == 0
    # Evicted messages are never the answer.
    c.execute_command("TEVICT", "s", 12)
    assert c.execute_command("TSEEK", "s", before) == 13
    assert c.execute_command("TSEEK", "s", -(2**63)) == 13


def test_tseek_errors(fresh_server: ServerProcess) -> None:
    c = fresh_server.client()
    c.set("str", "x")
    cases = [
        (("TSEEK", "s"), "wrong number of arguments for 'tseek' command"),
        (("TSEEK", "s", 1, 2), "wrong number of arguments for 'tseek' command"),
        (("TSEEK", "s", "soon"), "time is not an integer or out of range"),
        (("TSEEK", "s", "1.5"), "time is not an integer or out of range"),
        (("TSEEK", "s", str(2**63)), "time is not an integer or out of range"),
        (("TSEEK", "str", 1), "WRONGTYPE Operation against a key holding the wrong kind"),
    ]
    for argv, message in cases:
        with pytest.raises(redis.ResponseError, match=message):
            c.execute_command(*argv)
    assert c.get("str") == b"x" and not c.exists("s")


def test_tseek_in_command_introspection(fresh_server: ServerProcess) -> None:
    c = fresh_server.client()
    info = c.execute_command("COMMAND", "INFO", "tseek")["tseek"]
    assert info["arity"] == 3 and "readonly" in info["flags"] and "write" not in info["flags"]
    assert (info["first_key_pos"], info["last_key_pos"], info["step_count"]) == (1, 1, 1)
    # As redis-server 7 answers COMMAND INFO GET (RESP2: flat lists).
    assert info["key_specifications"] == [
        [b"flags", [b"RO", b"access"]]
        + [b"begin_search", [b"type", b"index", b"spec", [b"index", 1]]]
        + [b"find_keys", [b"type", b"range", b"spec", [b"lastkey", 0, b"keystep", 1, b"limit", 0]]]
    ]
    assert c.command_getkeys("TSEEK", "k", "5") == ["k"]
    tread = c.execute_command("COMMAND", "INFO", "tread")["tread"]["key_specifications"]
    assert [spec[3][1] for spec in tread] == [b"index", b"keyword", b"keyword"]
    assert [spec[3][3][1] for spec in tread[1:]] == [b"GROUP", b"GROUPNEW"]


# -- the directives ----------------------------------------------------------


def test_retention_directives_from_argv_config_set_get_and_rewrite(server_factory) -> None:
    srv = server_factory(stream_retention_ms=60000, stream_retention_bytes="1mb")
    c = srv.client()
    assert c.config_get("stream-retention-*") == {
        "stream-retention-ms": "60000",
        "stream-retention-bytes": "1048576",
    }
    c.config_set("stream-retention-ms", 0)
    c.config_set("stream-retention-bytes", "2gb")
    assert c.config_get("stream-retention-bytes") == {"stream-retention-bytes": "2147483648"}
    for name, bad in (("stream-retention-ms", "-1"), ("stream-retention-ms", "soon")):
        with pytest.raises(redis.ResponseError, match="CONFIG SET failed"):
            c.config_set(name, bad)
    with pytest.raises(redis.ResponseError, match="CONFIG SET failed"):
        c.config_set("stream-retention-bytes", "lots")
    assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    c.config_set("maxmemory-policy", "streams-oldest")
    with pytest.raises(redis.ResponseError, match="CONFIG SET failed"):
        c.config_set("maxmemory-policy", "allkeys-lru")
    assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "streams-oldest"}


@pytest.mark.slow
def test_config_rewrite_keeps_retention(server_factory, tmp_path) -> None:
    conf = tmp_path / "redis.conf"
    conf.write_text("stream-retention-ms 0\n")
    srv = server_factory(conf=conf)
    c = srv.client()
    c.config_set("stream-retention-ms", 1500)
    c.config_set("stream-retention-bytes", "64mb")
    c.config_set("maxmemory-policy", "streams-oldest")
    assert c.config_rewrite()
    text = conf.read_text()
    assert "stream-retention-ms 1500" in text and "stream-retention-bytes 64mb" in text
    assert "maxmemory-policy streams-oldest" in text
    srv.restart()
    assert srv.client().config_get("stream-retention-ms") == {"stream-retention-ms": "1500"}


def test_a_bad_retention_value_refuses_to_start(server_factory) -> None:
    srv = server_factory(start=False, stream_retention_ms="never")
    srv.start(wait=False)
    assert srv.proc is not None and srv.proc.wait(20) != 0
    assert "stream-retention-ms" in srv.output()


# -- retention at work -------------------------------------------------------


def test_retention_by_age_evicts_in_the_background_and_info_reports_it(server_factory) -> None:
    srv = server_factory(stream_node_max_entries=10)
    c = srv.client()
    tw(c, "s", *[b"m%d" % i for i in range(35)])
    assert streams_info(c)["retention_runs"] == 0
    c.config_set("stream-retention-ms", 30)
    # Everything is older than 30 ms soon: the three full nodes and then
    # the active node go, without any command touching the stream.
    assert wait_for(lambda: streams_info(c)["stream_messages"] == 0, timeout=10)
    info = streams_info(c)
    assert info["retention_evicted_messages"] == 35
    assert info["retention_evicted_bytes"] == sum(len(b"m%d" % i) for i in range(35))
    assert info["retention_runs"] >= 1
    assert c.execute_command("TREAD", "s", 0, 35) == [None] * 35
    assert tw(c, "s", "again") == 35  # offsets never come back
    c.config_resetstat()
    assert streams_info(c)["retention_evicted_messages"] == 0


def test_retention_by_size_keeps_the_newest_nodes(server_factory) -> None:
    srv = server_factory(stream_node_max_entries=10, stream_retention_bytes=200)
    c = srv.client()
    tw(c, "s", *[b"x" * 10 for _ in range(95)])
    # 950 bytes in nodes of 100 (the active one 50): whole nodes go while
    # the payload is over 200, which leaves 150.
    assert wait_for(lambda: c.execute_command("TREAD", "s", 0, 0, "WITHINFO")[0][0] == 80)
    reply = c.execute_command("TREAD", "s", 0, 95)
    assert reply[:80] == [None] * 80 and reply[80:] == [b"x" * 10] * 15


def test_a_blocked_reader_keeps_waiting_through_retention(server_factory) -> None:
    srv = server_factory(stream_node_max_entries=5, stream_retention_ms=20)
    c = srv.client()
    tw(c, "s", *[b"m%d" % i for i in range(12)])
    reader = srv.client()
    thread, box = in_thread(lambda: reader.execute_command("TREAD", "s", 12, 5, "BLOCK", 0))
    wait_blocked(c, 1)
    assert wait_for(lambda: streams_info(c)["stream_messages"] == 0, timeout=10)
    assert thread.is_alive()
    assert tw(c, "s", "new") == 12
    thread.join(10)
    assert box["reply"] == [b"new"]


@pytest.mark.slow
def test_kill9_replay_gives_the_same_streams_and_new_offsets(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always", stream_node_max_entries=10)
    c = srv.client()
    tw(c, "a", *[b"a%d" % i for i in range(57)])
    tw(c, "b", *[b"b%d" % i for i in range(23)])
    # a: nodes of 20, 30, 30, 30, 30 bytes and 21 in the active node; b:
    # 20, 30 and 9. At most 50 bytes (plus the active node) stay.
    c.config_set("stream-retention-bytes", 50)
    assert wait_for(lambda: c.execute_command("TREAD", "a", 0, 0, "WITHINFO")[0][0] == 50)
    assert wait_for(lambda: c.execute_command("TREAD", "b", 0, 0, "WITHINFO")[0][0] == 10)
    before = {key: c.execute_command("TREAD", key, 0, 100) for key in ("a", "b")}
    srv.kill9()
    srv.directives["stream-retention-bytes"] = "0"  # replay alone must cut them
    srv.start()
    c = srv.client()
    for key, messages in before.items():
        assert c.execute_command("TREAD", key, 0, len(messages)) == messages
    assert tw(c, "a", "new") >= 57 and tw(c, "b", "new") >= 23


# -- maxmemory-policy streams-oldest -------------------------------------------


def test_streams_oldest_makes_the_server_a_ring_buffer(server_factory) -> None:
    srv = server_factory(stream_node_max_entries=100)
    c = srv.client()
    payload = b"p" * 1000
    for _ in range(10):
        tw(c, "old", *[payload] * 100)
    used = c.info("memory")["used_memory"]
    c.config_set("maxmemory", used + 300_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for _ in range(10):
            tw(c, "new", *[payload] * 100)
    c.config_set("maxmemory-policy", "streams-oldest")
    for _ in range(20):
        tw(c, "new", *[payload] * 100)  # never refused
    info = streams_info(c)
    assert info["retention_evicted_messages"] > 0
    assert c.info("memory")["used_memory"] <= used + 300_000 + 200_000
    # The oldest went first: "old" lost nodes from its start, "new" kept its newest.
    old_first = c.execute_command("TREAD", "old", 0, 0, "WITHINFO")[0][0]
    assert old_first > 0
    assert c.execute_command("TREAD", "new", -1, 1) == [payload]


# -- compression by the cron ----------------------------------------------------


def test_compression_change_reaches_existing_nodes_without_new_writes(server_factory) -> None:
    srv = server_factory(stream_node_max_entries=10)
    c = srv.client()
    tw(c, "s", *[b"compressible " * 20 for _ in range(105)])
    assert streams_info(c)["stream_compressed_nodes"] == 0
    c.config_set("stream-compression", "zlib")
    # No node is sealed from now on: only the cron can conform the ten.
    assert wait_for(lambda: streams_info(c)["stream_compressed_nodes"] == 10, timeout=10)
    assert c.execute_command("TREAD", "s", 0, 1) == [b"compressible " * 20]
