"""Time inside the module (docs/PROTOCOL.md section 6): TSEEK, and
retention by age and by size applied by the module's timer in bounded
steps, replicated and logged as absolute TEVICT cuts."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, stream_info, tr, tw, wait_for
from helpers_module import state_of, wait_rewrite_done

# What one tick of the module's timer may free (RL_TICK_NODES in module.c).
TICK_NODES = 16


def first_offset(client: redis.Redis, key: str) -> int:
    return client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0][0]


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def next_ms(client: redis.Redis) -> int:
    """Wait until the server's clock has passed the current millisecond:
    messages written from then on are appended at a later time."""
    now = server_ms(client)
    assert wait_for(lambda: server_ms(client) > now)
    return server_ms(client)


# ---------------------------------------------------------------- TSEEK


def test_tseek_finds_the_first_message_at_or_after_a_time(msrv_client: redis.Redis) -> None:
    # Five messages per node: each batch below fills its own nodes, so a
    # batch's first message starts a node and the answer is exact.
    msrv_client.config_set("rcp11.stream-node-max-entries", 5)
    before = next_ms(msrv_client)
    tw(msrv_client, "s", *[b"a%d" % n for n in range(5)])
    middle = next_ms(msrv_client)
    tw(msrv_client, "s", *[b"b%d" % n for n in range(10)])
    after = next_ms(msrv_client)
    assert msrv_client.execute_command("TSEEK", "s", before - 1) == 0
    assert msrv_client.execute_command("TSEEK", "s", middle) == 5
    assert msrv_client.execute_command("TSEEK", "s", after) == 15  # none yet: the next offset
    msrv_client.execute_command("TEVICT", "s", 6)
    # Evicted messages are not readable: the first readable one answers.
    assert msrv_client.execute_command("TSEEK", "s", before - 1) == 7
    assert msrv_client.execute_command("TSEEK", "s", middle) == 7
    assert msrv_client.execute_command("TSEEK", "missing", middle) == 0
    assert msrv_client.execute_command("TSEEK", "s", -5) == 7  # any integer is a time


def test_tseek_never_answers_later_than_the_message(msrv_client: redis.Redis) -> None:
    # One big node: the answer may be early (the sparse index), by at most
    # 63 messages, never late.
    tw(msrv_client, "s", *[b"old"] * 200)
    middle = next_ms(msrv_client)
    tw(msrv_client, "s", *[b"new"] * 200)
    found = msrv_client.execute_command("TSEEK", "s", middle)
    assert 200 - 63 <= found <= 200


def test_tseek_errors(msrv_client: redis.Redis) -> None:
    msrv_client.set("str", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        msrv_client.execute_command("TSEEK", "str", 0)
    with pytest.raises(redis.ResponseError, match="time is not an integer or out of range"):
        msrv_client.execute_command("TSEEK", "s", "soon")
    with pytest.raises(redis.ResponseError, match="time is not an integer or out of range"):
        msrv_client.execute_command("TSEEK", "s", "99999999999999999999")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        msrv_client.execute_command("TSEEK", "s")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        msrv_client.execute_command("TSEEK", "s", 1, 2)
    assert msrv_client.command_getkeys("TSEEK", "s", 0) in ([b"s"], ["s"])


# ---------------------------------------------------------------- retention


def test_retention_configs_are_module_configs(msrv_client: redis.Redis) -> None:
    assert msrv_client.config_get("rcp11.stream-retention-*") == {
        "rcp11.stream-retention-ms": "0",
        "rcp11.stream-retention-bytes": "0",
    }
    msrv_client.config_set("rcp11.stream-retention-bytes", "64mb")  # a memory config, as maxmemory
    assert msrv_client.config_get("rcp11.stream-retention-bytes") == {
        "rcp11.stream-retention-bytes": str(64 * 1024 * 1024)
    }
    with pytest.raises(redis.ResponseError):
        msrv_client.config_set("rcp11.stream-retention-ms", -1)
    with pytest.raises(redis.ResponseError):
        msrv_client.config_set("rcp11.stream-retention-bytes", "lots")


def test_retention_by_size_keeps_whole_nodes_within_the_limit(msrv_client: redis.Redis) -> None:
    msrv_client.config_set("rcp11.stream-node-max-entries", 10)
    payload = b"p" * 100  # a node holds 1000 bytes of payload
    tw(msrv_client, "s", *[payload] * 95)  # 9 full nodes and an active one of 5
    tw(msrv_client, "other", *[payload] * 5)
    msrv_client.config_set("rcp11.stream-retention-bytes", 2000)
    # Whole sealed nodes go, oldest first, while the payload is over the
    # limit: 8 of them, leaving 1500 bytes (a sealed node and the active one).
    assert wait_for(lambda: first_offset(msrv_client, "s") == 80)
    assert tr(msrv_client, "s", 78, 4) == [None, None, payload, payload]
    assert tr(msrv_client, "other", 0, 5) == [payload] * 5  # under the limit
    info = stream_info(msrv_client)
    assert info["retention_evicted_messages"] == 80
    assert info["retention_evicted_bytes"] == 8000
    assert info["retention_runs"] >= 1
    assert info["stream_messages"] == 20
    # Evicted offsets never come back; new writes go on from the next one.
    assert tw(msrv_client, "s", payload) == 95


@pytest.mark.slow
def test_retention_by_age_evicts_what_expired(msrv_client: redis.Redis) -> None:
    msrv_client.config_set("rcp11.stream-node-max-entries", 10)
    tw(msrv_client, "s", *[b"old %d" % n for n in range(25)])
    msrv_client.config_set("rcp11.stream-retention-ms", 1000)
    # Every message expires, the active node's too: the stream stays, empty,
    # with its next offset.
    assert wait_for(lambda: first_offset(msrv_client, "s") == 25)
    assert msrv_client.type("s") == b"rcp11-log"
    assert tw(msrv_client, "s", "fresh") == 25
    assert tr(msrv_client, "s", 24, 2) == [None, b"fresh"]  # younger than the retention
    assert msrv_client.execute_command("TSEEK", "s", 0) == 25
    assert stream_info(msrv_client)["retention_evicted_messages"] >= 25


def test_retention_is_a_change_watchers_and_subscribers_see(
    msrv_client: redis.Redis, msrv: RedisModuleServer
) -> None:
    msrv_client.config_set("rcp11.stream-node-max-entries", 10)
    msrv_client.config_set("notify-keyspace-events", "KA")
    tw(msrv_client, "s", *[b"w" * 10] * 30)
    pubsub = msrv.client().pubsub()
    pubsub.psubscribe("__keyspace@0__:s")
    assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
    watcher = msrv.client()
    with watcher.pipeline(transaction=True) as pipe:
        pipe.watch("s")
        msrv_client.config_set("rcp11.stream-retention-bytes", 100)
        assert wait_for(lambda: first_offset(msrv_client, "s") == 20)
        pipe.multi()
        pipe.execute_command("TWRITE", "s", "late")
        with pytest.raises(redis.WatchError):
            pipe.execute()  # the stream changed under the WATCH
    event = pubsub.get_message(timeout=5)
    assert event is not None and event["data"] == b"tevict"
    pubsub.close()
    watcher.close()
    msrv_client.config_set("notify-keyspace-events", "")


def test_retention_runs_in_bounded_steps(msrv_client: redis.Redis) -> None:
    msrv_client.config_set("rcp11.stream-node-max-entries", 10)
    nodes = 400
    tw(msrv_client, "s", *[b"m"] * (10 * nodes))
    runs_before = stream_info(msrv_client)["retention_runs"]
    msrv_client.config_set("rcp11.stream-retention-bytes", 1)
    assert wait_for(lambda: first_offset(msrv_client, "s") == 10 * (nodes - 1))
    # Never more than one tick's allowance of nodes at a time: the backlog
    # took at least nodes / TICK_NODES timer ticks.
    assert stream_info(msrv_client)["retention_runs"] - runs_before >= (nodes - 1) // TICK_NODES


def test_retention_reaches_every_database(
    msrv_client: redis.Redis, msrv: RedisModuleServer
) -> None:
    msrv_client.config_set("rcp11.stream-node-max-entries", 10)
    other = msrv.client(db=3)
    tw(other, "s", *[b"x" * 10] * 50)
    msrv_client.config_set("rcp11.stream-retention-bytes", 100)
    assert wait_for(lambda: first_offset(other, "s") == 40)
    other.close()


def test_compression_depth_is_conformed_by_the_timer(msrv_client: redis.Redis) -> None:
    msrv_client.config_set("rcp11.stream-node-max-entries", 100)
    msrv_client.config_set("rcp11.stream-compression", "zlib")
    msrv_client.config_set("rcp11.stream-compression-depth", 3)
    tw(msrv_client, "s", *[b"a log line that compresses well %d" % (n % 7) for n in range(1050)])
    # 11 nodes: the active one and the newest 3 sealed ones stay raw.
    info = stream_info(msrv_client)
    assert (info["stream_nodes"], info["stream_compressed_nodes"]) == (11, 7)
    assert info["stream_compression_depth"] == 3
    # No write follows: the module's timer brings the idle stream along.
    msrv_client.config_set("rcp11.stream-compression-depth", 0)
    assert wait_for(lambda: stream_info(msrv_client)["stream_compressed_nodes"] == 10)
    msrv_client.config_set("rcp11.stream-compression", "no")
    assert wait_for(lambda: stream_info(msrv_client)["stream_compressed_nodes"] == 0)
    assert tr(msrv_client, "s", 1049, 1) == [b"a log line that compresses well 6"]
    with pytest.raises(redis.ResponseError):
        msrv_client.config_set("rcp11.stream-compression-depth", 65536)


@pytest.mark.slow
def test_replica_follows_the_primarys_retention_cuts(module_factory: Any) -> None:
    node = {"rcp11.stream-node-max-entries": 10}
    primary_srv = module_factory(repl_diskless_sync_delay=0, **node)
    # The replica's own retention would cut elsewhere: it must never run.
    replica_srv = module_factory(
        replicaof=f"127.0.0.1 {primary_srv.port}",
        **node,
        **{"rcp11.stream-retention-bytes": 1, "rcp11.stream-retention-ms": 1},
    )
    primary, replica = primary_srv.client(), replica_srv.client()
    assert wait_for(lambda: replica.info("replication")["master_link_status"] == "up")
    tw(primary, "s", *[b"y" * 10] * 95)
    tw(primary, "t", *[b"z" * 10] * 30)
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    assert state_of(replica) == state_of(primary)  # nothing evicted on the replica
    primary.config_set("rcp11.stream-retention-bytes", 200)
    assert wait_for(lambda: first_offset(primary, "s") == 80 and first_offset(primary, "t") == 10)
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    assert state_of(replica) == state_of(primary)
    assert stream_info(replica)["retention_runs"] == 0
    primary.close()
    replica.close()


@pytest.mark.parametrize("preamble", ["yes", "no"])
def test_aof_replays_retention_to_the_same_streams(module_factory: Any, preamble: str) -> None:
    srv: RedisModuleServer = module_factory(
        appendonly="yes",
        aof_use_rdb_preamble=preamble,
        **{"rcp11.stream-node-max-entries": 10, "rcp11.stream-retention-bytes": 300},
    )
    client = srv.client()
    for n in range(12):
        tw(client, f"s{n % 3}", *[b"%02d-%02d" % (n, i) for i in range(20)])
    # 400 bytes in nodes of 50 each: two nodes go to bring them to 300.
    assert wait_for(lambda: all(first_offset(client, f"s{n}") == 20 for n in range(3)))
    before = state_of(client)
    client.close()
    # Replayed without retention: the logged cuts alone give the same streams.
    srv.restart(**{"rcp11.stream-retention-bytes": 0})
    client = srv.client()
    assert state_of(client) == before
    client.execute_command("BGREWRITEAOF")
    wait_rewrite_done(client)
    client.close()
    srv.restart()
    client = srv.client()
    assert state_of(client) == before
    client.close()
