"""The module while Redis pauses clients (CLIENT PAUSE WRITE, FAILOVER,
CLUSTER FAILOVER): nothing the module does on its own (the retention and
compression timer, a blocked group reader woken by a write queued in a
transaction) may reach the AOF or a replica then, or Redis aborts. The work
waits for the end of the pause, and the copy stays exact."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from conftest import (
    RedisModuleServer,
    free_cluster_port,
    in_thread,
    tr,
    tw,
    wait_blocked,
    wait_for,
)
from helpers_module import state_of

PAUSE_MS = 60_000  # ended by CLIENT UNPAUSE, never by its timeout


def info(client: redis.Redis, field: str) -> int:
    return int(client.info("rcp11")[f"rcp11_{field}"])


def first_offset(client: redis.Redis, key: str) -> int:
    return client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0][0]


@dataclass
class Primary:
    """A primary whose writes reach a copy: its AOF, or a replica."""

    srv: RedisModuleServer
    client: redis.Redis
    check_copy: Callable[[], None]


@pytest.fixture(params=["aof", "replica"])
def primary(request: pytest.FixtureRequest, module_factory: Any) -> Iterator[Primary]:
    """With AOF on, or with a replica attached: either makes Redis
    propagate, which is what a pause forbids."""
    options = {"rcp11.stream-node-max-entries": 10, "repl_diskless_sync_delay": 0}
    if request.param == "aof":
        srv = module_factory(appendonly="yes", **options)
        client = srv.client()

        def check_copy() -> None:
            # The AOF replayed into the same server gives the same keyspace.
            before = state_of(client)
            client.execute_command("DEBUG", "LOADAOF")
            assert state_of(client) == before

    else:
        srv = module_factory(**options)
        client = srv.client()
        replica_srv = module_factory(replicaof=f"127.0.0.1 {srv.port}")
        replica = replica_srv.client()
        wait_for(lambda: replica.info("replication")["master_link_status"] == "up")

        def check_copy() -> None:
            assert client.execute_command("WAIT", 1, 10_000) == 1
            assert state_of(replica) == state_of(client)

    yield Primary(srv, client, check_copy)
    client.close()


def wait_paused_ticks(client: redis.Redis, before: int) -> None:
    """Until two housekeeping ticks with work have waited on the pause
    (the server must be alive to say so)."""
    wait_for(lambda: info(client, "paused_housekeeping_ticks") >= before + 2)


@pytest.mark.parametrize(
    "config",
    [
        ("rcp11.stream-retention-bytes", "100"),
        ("rcp11.stream-retention-ms", "1"),
        ("rcp11.stream-compression", "zlib"),
    ],
    ids=["retention-bytes", "retention-ms", "compression"],
)
def test_housekeeping_waits_for_the_end_of_a_pause(
    primary: Primary, config: tuple[str, str]
) -> None:
    client = primary.client
    tw(client, "s", *[b"message %d" % n for n in range(300)])
    tr(client, "s", 0, 5, "GROUP", "s:g")
    ticks = info(client, "paused_housekeeping_ticks")
    client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    client.config_set(*config)  # the reproduction, one config at a time
    wait_paused_ticks(client, ticks)
    # (TREAD may replicate, so Redis holds it back during the pause: INFO
    # tells what the streams hold.)
    assert info(client, "stream_messages") == 300
    assert info(client, "stream_compressed_nodes") == 0
    client.execute_command("CLIENT", "UNPAUSE")
    if config[0] == "rcp11.stream-compression":
        wait_for(lambda: info(client, "stream_compressed_nodes") == 29)
    else:
        wait_for(lambda: first_offset(client, "s") >= 290)
    primary.check_copy()


@pytest.mark.parametrize("trigger", ["twrite", "set-group-key", "del-group-key"])
def test_group_reader_woken_during_a_pause_is_served_after_it(
    primary: Primary, trigger: str
) -> None:
    client = primary.client
    tw(client, "jobs", "j1", "j2")
    assert tr(client, "jobs", 0, 5, "GROUP", "jobs:g") == [b"j1", b"j2"]
    group_reader = primary.srv.client()
    grouped, group_box = in_thread(
        lambda: tr(group_reader, "jobs", 0, 5, "BLOCK", 0, "GROUP", "jobs:g")
    )
    wait_blocked(client, 1)
    plain_reader = primary.srv.client()
    plain, plain_box = in_thread(lambda: tr(plain_reader, "jobs", 2, 5, "BLOCK", 0))
    wait_blocked(client, 2)
    wakes = info(client, "paused_group_wakes")
    # A transaction may pause clients and then write: Redis runs the rest of
    # it, and wakes the blocked readers after EXEC, with writes paused.
    with client.pipeline(transaction=True) as tx:
        tx.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        if trigger == "twrite":
            tx.execute_command("TWRITE", "jobs", "j3")
        elif trigger == "set-group-key":
            tx.set("jobs:g", 0)
        else:
            tx.delete("jobs:g")
        tx.execute()
    wait_for(lambda: info(client, "paused_group_wakes") > wakes)
    group_key = client.get("jobs:g")
    assert grouped.is_alive() and int(client.info("clients")["blocked_clients"]) >= 1
    if trigger == "twrite":
        # A plain reader writes nothing: it is served during the pause.
        plain.join(10)
        assert plain_box.get("reply") == [b"j3"]
    else:
        assert plain.is_alive()
    client.execute_command("CLIENT", "UNPAUSE")
    grouped.join(10)
    expected = {
        "twrite": ([b"j3"], b"3"),
        "set-group-key": ([b"j1", b"j2"], b"2"),
        "del-group-key": ([b"j1", b"j2"], b"2"),
    }[trigger]
    assert (group_box.get("reply"), client.get("jobs:g")) == expected
    assert group_key == {"twrite": b"2", "set-group-key": b"0", "del-group-key": None}[trigger]
    if trigger != "twrite":
        tw(client, "jobs", "j3")
        plain.join(10)
        assert plain_box.get("reply") == [b"j3"]
    primary.check_copy()
    group_reader.close()
    plain_reader.close()


# ---------------------------------------------------------------- failovers

BACKLOG = 20_000  # messages of 10 per node: ~1,250 ticks of eviction work
RETAIN = {"rcp11.stream-node-max-entries": 10, "repl_diskless_sync_delay": 0}
RETAIN_BYTES = 1000


def fill_backlog(client: redis.Redis) -> None:
    for start in range(0, BACKLOG, 1000):
        tw(client, "events", *[b"event %d" % n for n in range(start, start + 1000)])


def start_retention(primary: redis.Redis, replica: redis.Redis) -> None:
    """Keep the newest ~90 messages: the primary's timer cuts 16 nodes per
    tick for over a second, each cut a TEVICT to the replica. Returns once
    the first cuts went out, so a failover's pause falls in the middle."""
    for client in (replica, primary):
        client.config_set("rcp11.stream-retention-bytes", RETAIN_BYTES)
    wait_for(lambda: info(primary, "retention_runs") > 0)


def sleep_without_reply(srv: RedisModuleServer, seconds: float) -> Any:
    """DEBUG SLEEP on srv, reply left unread: the server is busy for that
    long, which holds a failover's pause open on the other side."""
    raw = srv.raw()
    raw.send(b"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$3\r\n%.1f\r\n" % seconds)
    return raw


def settled(client: redis.Redis) -> bool:
    """Retention has nothing left to cut."""
    return info(client, "stream_payload_bytes") <= RETAIN_BYTES


@pytest.mark.slow
def test_failover_while_retention_runs(module_factory: Any) -> None:
    old_srv = module_factory(**RETAIN)
    old = old_srv.client()
    fill_backlog(old)
    new_srv = module_factory(replicaof=f"127.0.0.1 {old_srv.port}", **RETAIN)
    new = new_srv.client()
    wait_for(lambda: new.info("replication")["master_link_status"] == "up")
    assert old.execute_command("WAIT", 1, 10_000) == 1
    ticks = info(old, "paused_housekeeping_ticks")
    start_retention(old, new)
    # FAILOVER pauses writes until the replica acknowledges all it was
    # sent; a busy replica holds that pause open while retention has work.
    busy = sleep_without_reply(new_srv, 1.0)
    assert old.execute_command("FAILOVER") == b"OK"
    check_swapped(old, new, old, busy, ticks)
    # The new primary takes writes, past every offset the old one gave
    # (at the stream's reservation mark: module_reserve.c).
    assert tw(new, "events", "after") >= BACKLOG


def check_swapped(
    old: redis.Redis, new: redis.Redis, old_reader: redis.Redis, busy: Any, ticks: int
) -> None:
    """After the failover: the roles swapped, the old primary lived through
    its pause with work waiting, the new one finished retention, and the
    old one (read through old_reader) holds exactly what the new one does."""
    wait_for(lambda: new.info("replication")["role"] == "master")
    wait_for(lambda: old.info("replication")["master_link_status"] == "up")
    busy.close()
    assert info(old, "paused_housekeeping_ticks") > ticks
    wait_for(lambda: settled(new))
    assert new.execute_command("WAIT", 1, 10_000) == 1
    assert state_of(old_reader) == state_of(new)


def small_cluster(module_factory: Any) -> tuple[RedisModuleServer, RedisModuleServer]:
    """Two module nodes: a primary with every slot and its replica."""
    nodes = [
        module_factory(
            port=free_cluster_port(),
            cluster_enabled="yes",
            cluster_config_file="nodes.conf",
            cluster_node_timeout=3000,
            **RETAIN,
        )
        for _ in range(2)
    ]
    first, second = (node.client() for node in nodes)
    first.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    second.execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port)
    first_id = first.execute_command("CLUSTER", "MYID").decode()
    wait_for(lambda: len(second.execute_command("CLUSTER", "NODES").splitlines()) == 2)
    wait_for(lambda: first_id.encode() in second.execute_command("CLUSTER", "NODES"))
    second.execute_command("CLUSTER", "REPLICATE", first_id)
    wait_for(lambda: second.info("replication")["master_link_status"] == "up")
    wait_for(lambda: first.cluster("info")["cluster_state"] == "ok")
    return nodes[0], nodes[1]


@pytest.mark.slow
def test_cluster_failover_while_retention_runs(module_factory: Any) -> None:
    old_srv, new_srv = small_cluster(module_factory)
    old, new = old_srv.client(), new_srv.client()
    fill_backlog(old)
    assert old.execute_command("WAIT", 1, 10_000) == 1
    ticks = info(old, "paused_housekeeping_ticks")
    start_retention(old, new)
    assert new.execute_command("CLUSTER", "FAILOVER") == b"OK"
    # The old primary pauses writes until the replica has caught up and
    # won the election; a busy replica holds that pause open.
    busy = sleep_without_reply(new_srv, 0.5)
    replica = old_srv.client(single_connection_client=True)
    replica.execute_command("READONLY")  # a cluster replica serves reads after it
    check_swapped(old, new, replica, busy, ticks)
    done = subprocess.run(
        ["redis-cli", "-c", "-p", str(old_srv.port), "TWRITE", "events", "after"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 0 and int(done.stdout) >= BACKLOG, done.stdout + done.stderr
