"""Acknowledged groups in the Redis module (docs/MODULE.md): the rcp11-grp
data type through RDB files, DEBUG RELOAD, DUMP/RESTORE, COPY and AOF
rewrites with and without the RDB preamble; replicas holding exactly the
primary's groups (RCP11.LEASE and TACK in the replication stream) and
refusing lease reads; internal commands refused to clients; lease readers
during CLIENT PAUSE."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, error_of, in_thread, tr, tw, wait_blocked, wait_for
from helpers_module import first_write, state_of, wait_rewrite_done

PAUSE_MS = 60_000


def lease(client: redis.Redis, key: str, group: str, count: int, *options: Any) -> list[Any]:
    return tr(client, key, 0, count, "GROUP", group, "LEASE", *options)


def expired(client: redis.Redis, key: str, group: str) -> int:
    """TGROUP INFO's expired (a flat array in RESP2)."""
    info = client.execute_command("TGROUP", "INFO", key, group)
    return int(info[info.index(b"expired") + 1])


def groups_in_use(client: redis.Redis) -> None:
    """A stream and an acknowledged group with several ranges, owners,
    delivery counts, an acknowledgement and a plain group."""
    tw(client, "{s}", *[b"m%d" % i for i in range(50)])
    lease(client, "{s}", "{s}:g", 10, 600_000, "CONSUMER", "w1")
    lease(client, "{s}", "{s}:g", 10, 1, "CONSUMER", "w2")
    wait_for(lambda: expired(client, "{s}", "{s}:g") == 10)
    assert lease(client, "{s}", "{s}:g", 5, 600_000, "CONSUMER", "w3")[0][4] == 2
    client.execute_command("TACK", "{s}:g", 0, 3)
    tr(client, "{s}", 0, 7, "GROUP", "{s}:plain")


def pending(client: redis.Redis) -> Any:
    return client.execute_command("TGROUP", "PENDING", "{s}", "{s}:g", 0, 100)


@pytest.fixture
def srv(module_factory: Any) -> Iterator[RedisModuleServer]:
    yield module_factory()


def test_groups_survive_reload_dump_restore_and_copy(srv: RedisModuleServer) -> None:
    client = srv.client()
    groups_in_use(client)
    before = state_of(client)
    rows = pending(client)
    assert len(rows) == 3
    client.execute_command("DEBUG", "RELOAD")
    assert state_of(client) == before
    assert pending(client) == rows
    payload = client.dump("{s}:g")
    client.restore("{s}:g2", 0, payload)
    client.copy("{s}:g", "{s}:g3")
    for name in ("{s}:g2", "{s}:g3"):
        assert client.execute_command("DEBUG", "DIGEST-VALUE", name) == before[b"{s}:g"]
    # A damaged payload is refused, never loaded.
    damaged = bytearray(payload)
    damaged[len(damaged) // 2] ^= 0x40
    with pytest.raises(redis.ResponseError):
        client.restore("{s}:g4", 0, bytes(damaged))
    assert not client.exists("{s}:g4")
    assert client.type("{s}:g") == b"rcp11-grp"
    client.close()


@pytest.mark.parametrize("preamble", ["yes", "no"])
def test_groups_survive_aof_rewrites(module_factory: Any, preamble: str) -> None:
    srv = module_factory(appendonly="yes", aof_use_rdb_preamble=preamble)
    client = srv.client()
    groups_in_use(client)
    client.execute_command("BGREWRITEAOF")
    wait_rewrite_done(client)
    # Changes after the rewrite are logged commands (TACK, RCP11.LEASE).
    lease(client, "{s}", "{s}:g", 4, 600_000, "CONSUMER", "after", "ACK", 20, 5)
    before = state_of(client)
    client.execute_command("DEBUG", "LOADAOF")
    assert state_of(client) == before
    srv.kill9()
    srv.start()
    client = srv.client()
    assert state_of(client) == before
    client.close()


def test_internal_commands_are_refused_to_clients(srv: RedisModuleServer) -> None:
    client = srv.client()
    groups_in_use(client)
    blob_holder = client.dump("{s}:g")
    for argv in (
        ("RCP11.LEASE", "{s}:g", "{s}", 0, 0, 1, 99, 1, "c"),
        ("RCP11.GROUP", "{s}:g", blob_holder),
    ):
        assert error_of(client, *argv).endswith(
            "is internal: only a primary's replication stream and the AOF may send it"
        )
    with client.pipeline(transaction=True) as tx:
        tx.execute_command("RCP11.LEASE", "{s}:g", "{s}", 0, 0, 1, 99, 1, "c")
        (reply,) = tx.execute(raise_on_error=False)
    assert isinstance(reply, redis.ResponseError)
    client.close()


@pytest.mark.slow
def test_a_replica_holds_the_primarys_groups_and_refuses_lease_reads(module_factory: Any) -> None:
    primary_srv = module_factory(repl_diskless_sync_delay=0)
    primary = primary_srv.client()
    replica_srv = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}")
    replica = replica_srv.client()
    wait_for(lambda: replica.info("replication")["master_link_status"] == "up")
    groups_in_use(primary)  # over the live link: TACK and RCP11.LEASE
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    assert state_of(replica) == state_of(primary)
    assert pending(replica) == pending(primary)
    for argv in (
        ("TREAD", "{s}", 0, 1, "GROUP", "{s}:g", "LEASE", 1000),
        ("TACK", "{s}:g", 5, 1),
    ):
        with pytest.raises(redis.exceptions.ReadOnlyError):
            replica.execute_command(*argv)
    # A full sync carries the groups as RDB values.
    late_srv = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}")
    late = late_srv.client()
    wait_for(lambda: late.info("replication")["master_link_status"] == "up")
    assert primary.execute_command("WAIT", 2, 10_000) == 2
    assert state_of(late) == state_of(primary)
    for c in (primary, replica, late):
        c.close()


def test_a_lease_running_out_during_a_pause_is_served_after_it(module_factory: Any) -> None:
    srv = module_factory(appendonly="yes")
    client = srv.client()
    tw(client, "jobs", "a", "b")
    lease(client, "jobs", "g", 2, 300, "CONSUMER", "dies")
    reader = srv.client()
    thread, box = in_thread(lambda: lease(reader, "jobs", "g", 5, 60_000, "BLOCK", 0))
    wait_blocked(client, 1)
    client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    # The lease runs out while writes are paused: the reader must wait
    # (serving it would replicate) and the server must not abort.
    wait_for(lambda: expired(client, "jobs", "g") == 2)
    assert thread.is_alive()
    client.execute_command("CLIENT", "UNPAUSE")
    thread.join(10)
    assert box["reply"][0][2:5] == [0, 2, 2]
    assert box["reply"][1:] == [b"a", b"b"]
    before = state_of(client)
    client.execute_command("DEBUG", "LOADAOF")
    assert state_of(client) == before
    reader.close()
    client.close()


@pytest.mark.slow
def test_lease_reads_see_only_what_replicas_acknowledged_with_read_committed(
    module_factory: Any,
) -> None:
    options = {"rcp11.read-committed": "yes", "repl_diskless_sync_delay": 0}
    primary_srv = module_factory(**options)
    replica_srv = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}", **options)
    primary = primary_srv.client()
    wait_for(lambda: primary.info("replication").get("slave0", {}).get("state") == "online")
    # Right after the replica came online, a loaded machine may keep it from
    # acknowledging the first reservation in time: NOREPLICAS, nothing
    # written (docs/MODULE.md); this test is about reads, so it writes again.
    wait_for(lambda: first_write(primary, "jobs", "a1", "a2"))
    wait_for(lambda: tr(primary, "jobs", 0, 10) == [b"a1", b"a2"])
    assert replica_srv.proc is not None
    os.kill(replica_srv.proc.pid, signal.SIGSTOP)  # a replica that lags
    try:
        tw(primary, "jobs", "b1")  # written, not acknowledged by the replica
        got = lease(primary, "jobs", "g", 10, 60_000)
        assert (got[0][1], got[1:]) == (1, [b"a1", b"a2"])  # last_offset: the acknowledged
        reader = primary_srv.client()
        thread, box = in_thread(lambda: lease(reader, "jobs", "g", 10, 60_000, "BLOCK", 10_000))
        wait_blocked(primary, 1)
    finally:
        os.kill(replica_srv.proc.pid, signal.SIGCONT)
    thread.join(10)
    assert box["reply"][1:] == [b"b1"]
    primary.config_set("rcp11.read-committed", "no")
    reader.close()
    primary.close()
