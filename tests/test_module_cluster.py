"""A Redis Cluster of module nodes on loopback: 3 primaries with a replica
each, built with `redis-cli --cluster create`, used through redis-py's
RedisCluster and redis-cli -c; survives a replica promotion with every
acknowledged write in place."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import (
    ModuleCluster,
    in_thread,
    module_server_program,
    require,
    wait_blocked,
    wait_for,
)

pytestmark = pytest.mark.slow

STREAMS = 100


@pytest.fixture
def cluster(module_factory: Any) -> Iterator[ModuleCluster]:
    module_server_program()
    require("redis-cli")
    yield ModuleCluster(module_factory)


def stream_key(n: int) -> str:
    return f"{{events{n}}}"


def group_key(n: int) -> str:
    return f"{{events{n}}}:readers"


def test_cluster_of_module_nodes_routes_blocks_and_survives_failover(
    cluster: ModuleCluster,
) -> None:
    rc = cluster.client()
    # 100 streams over the three primaries, written and read through the
    # cluster client; group keys share their stream's hash tag.
    acknowledged: dict[str, list[bytes]] = {}
    for n in range(STREAMS):
        messages = [b"%d:%d" % (n, i) for i in range(n % 7 + 1)]
        assert rc.execute_command("TWRITE", stream_key(n), "ENTRIES", *messages) == 0
        acknowledged[stream_key(n)] = messages
    owners = {rc.get_node_from_key(stream_key(n)).port for n in range(STREAMS)}
    assert len(owners) == 3
    for n in range(STREAMS):
        key = stream_key(n)
        assert rc.execute_command("TREAD", key, 0, 100) == acknowledged[key]
        first = rc.execute_command("TREAD", key, 0, 1, "GROUP", group_key(n))
        assert first == acknowledged[key][:1]
    # The key specs name the group key: the client sees the two slots, and
    # so does the server.
    with pytest.raises(redis.exceptions.RedisClusterException, match="same key slot"):
        rc.execute_command("TREAD", stream_key(1), 0, 1, "GROUP", "elsewhere")
    owner = cluster.node_client(rc.get_node_from_key(stream_key(1)).port)
    with pytest.raises(redis.ResponseError, match="hash to the same slot"):  # -CROSSSLOT
        owner.execute_command("TREAD", stream_key(1), 0, 1, "GROUPNEW", "elsewhere")
    owner.close()

    # Blocked readers on a stream of each primary, woken by cluster writes.
    by_owner: dict[int, int] = {}
    for n in range(STREAMS):
        by_owner.setdefault(rc.get_node_from_key(stream_key(n)).port, n)
    readers = []
    for port, n in by_owner.items():
        rest = rc.execute_command("TREAD", stream_key(n), 0, 100, "GROUP", group_key(n))
        assert rest == acknowledged[stream_key(n)][1:]
        reader = cluster.client()  # routes the blocking read to the owner itself
        thread, box = in_thread(
            lambda reader=reader, n=n: reader.execute_command(
                "TREAD", stream_key(n), 0, 10, "BLOCK", 20_000, "GROUP", group_key(n)
            )
        )
        owner = cluster.node_client(port)
        wait_blocked(owner, 1)
        owner.close()
        readers.append((n, thread, box, reader))
    for n, _, _, _ in readers:
        rc.execute_command("TWRITE", stream_key(n), "woken")
        acknowledged[stream_key(n)].append(b"woken")
    for _, thread, box, node in readers:
        thread.join(20)
        assert box.get("reply") == [b"woken"], box
        node.close()

    # A write acknowledged by a replica (WAIT on the writer's connection).
    victim = next(iter(by_owner))
    key = stream_key(by_owner[victim])
    direct = cluster.node_client(victim)
    pipe = direct.pipeline(transaction=False)
    pipe.execute_command("TWRITE", key, "before failover")
    pipe.execute_command("WAIT", 1, 10_000)
    offset, replicas = pipe.execute()
    assert replicas == 1 and offset == len(acknowledged[key])
    acknowledged[key].append(b"before failover")
    direct.close()
    wait_for(cluster._replicas_in_sync, 30)

    # Promote the victim's replica; every acknowledged write is there.
    promoted = cluster.replica_of(victim)
    cluster.node_client(promoted).execute_command("CLUSTER", "FAILOVER")
    wait_for(lambda: cluster._role(promoted) == "master", 30)
    wait_for(lambda: cluster._role(victim) == "slave", 30)
    after = cluster.client()
    for n in range(STREAMS):
        key = stream_key(n)
        stored = after.execute_command("TREAD", key, 0, 100)
        assert stored == acknowledged[key], key
    # Groups moved on the old primary continue on the new one.
    n = by_owner[victim]
    assert after.get(group_key(n)) == b"%d" % (len(acknowledged[stream_key(n)]) - 1)
    assert after.execute_command("TWRITE", stream_key(n), "after failover") == len(
        acknowledged[stream_key(n)]
    )
    rc.close()
    after.close()


def test_redis_cli_follows_redirections(cluster: ModuleCluster) -> None:
    port = cluster.servers[0].port

    def cli(*args: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-c", "-p", str(port), *args], capture_output=True, text=True, timeout=20
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    for n in range(10):
        assert cli("TWRITE", stream_key(n), f"via cli {n}") == "0\n"
        assert cli("TREAD", stream_key(n), "0", "1", "GROUP", group_key(n)) == f"via cli {n}\n"
