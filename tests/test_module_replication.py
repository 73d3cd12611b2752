"""The module's streams on a primary and its replica (redis-server
--replicaof): full sync, the live command stream (cuts and group moves as
absolute commands), refused writes, blocked readers on the replica."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, in_thread, tr, tw, wait_blocked, wait_for
from helpers_module import populate, state_of

READONLY = "You can't write against a read only replica."


@pytest.fixture
def pair(module_factory: Any) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """A primary with data already in it, then a replica that syncs fully."""
    primary_srv: RedisModuleServer = module_factory(
        repl_diskless_sync_delay=0, **{"rcp11.stream-compression": "zlib"}
    )
    primary = primary_srv.client()
    populate(primary)
    replica_srv: RedisModuleServer = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}")
    replica = replica_srv.client()
    wait_for(lambda: replica.info("replication")["master_link_status"] == "up")
    sync(primary)
    yield primary, replica
    primary.close()
    replica.close()


def sync(primary: redis.Redis) -> None:
    assert primary.execute_command("WAIT", 1, 10_000) == 1


def test_full_sync_copies_every_stream(pair: tuple[redis.Redis, redis.Redis]) -> None:
    primary, replica = pair
    assert state_of(replica) == state_of(primary)


def test_live_commands_keep_the_replica_exact(pair: tuple[redis.Redis, redis.Redis]) -> None:
    primary, replica = pair
    tw(primary, "plain", *[b"more %d" % n for n in range(500)])
    primary.execute_command("TEVICT", "plain", -100)
    primary.execute_command("TWRITE", "tail", "BACKLOG", 1, "ENTRIES", "v1", "v2")
    primary.execute_command("TCONCAT", "joined", "binary", "tail")
    tr(primary, "plain", 0, 30, "GROUP", "plain:g")
    tr(primary, "plain", 0, 30, "GROUPNEW", "new:g")
    with primary.pipeline(transaction=True) as pipe:
        pipe.execute_command("TWRITE", "tx", "a")
        pipe.execute_command("TREAD", "tx", 0, 1, "GROUP", "tx:g")
        pipe.execute()
    sync(primary)
    assert state_of(replica) == state_of(primary)
    assert replica.get("plain:g") == primary.get("plain:g")


def test_replica_refuses_writes_and_group_reads_but_serves_reads(
    pair: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = pair
    for argv in (
        ["TWRITE", "plain", "x"],
        ["TEVICT", "plain", 5],
        ["TCONCAT", "plain", "tail"],
        ["TREAD", "plain", 0, 1, "GROUP", "plain:g"],
        ["TREAD", "plain", 0, 1, "GROUPNEW", "other:g"],
    ):
        with pytest.raises(redis.ReadOnlyError, match=READONLY):
            replica.execute_command(*argv)
    assert tr(replica, "plain", -1, 1) == tr(primary, "plain", -1, 1)
    assert replica.exists("other:g") == 0


def test_blocked_reader_on_the_replica_wakes_on_a_replicated_write(
    pair: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = pair
    port = replica.connection_pool.connection_kwargs["port"]
    reader = redis.Redis(port=port)
    thread, box = in_thread(lambda: tr(reader, "fresh", 0, 10, "BLOCK", 10_000))
    wait_blocked(replica, 1)
    tw(primary, "fresh", "hello", "world")
    thread.join(10)
    assert box.get("reply") == [b"hello", b"world"]
    reader.close()


def test_group_reader_woken_on_the_primary_replicates_its_group_key(
    pair: tuple[redis.Redis, redis.Redis],
) -> None:
    primary, replica = pair
    port = primary.connection_pool.connection_kwargs["port"]
    readers = [redis.Redis(port=port) for _ in range(2)]
    boxes = []
    for n, reader in enumerate(readers):
        thread, box = in_thread(
            lambda reader=reader: tr(reader, "jobs", 0, 2, "BLOCK", 10_000, "GROUPNEW", "jobs:g")
        )
        wait_blocked(primary, n + 1)
        boxes.append((thread, box))
    tw(primary, "jobs", "j1", "j2", "j3")
    for thread, _ in boxes:
        thread.join(10)
    assert [box.get("reply") for _, box in boxes] == [[b"j1", b"j2"], [b"j3"]]
    sync(primary)
    assert replica.get("jobs:g") == b"3" == primary.get("jobs:g")
    for reader in readers:
        reader.close()
