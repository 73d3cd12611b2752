"""A Redis Cluster of module nodes on loopback: 3 primaries with a replica
each, built with `redis-cli --cluster create`, used through redis-py's
RedisCluster and redis-cli -c; survives a replica promotion with every
acknowledged write in place; and rounds of kill -9 (a replica lagging) and
CLUSTER FAILOVER while writers run hand out no offset twice and lose no
write a replica acknowledged (WAIT)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import (
    ModuleCluster,
    RedisModuleServer,
    in_thread,
    module_server_program,
    require,
    tr,
    wait_blocked,
    wait_for,
)
from helpers_module import Ledger

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
    # (Asked again if Redis drops it after its 5 s, as a loaded machine
    # may make it: CI saw it once.)
    promoted = cluster.replica_of(victim)
    manual_failover(cluster, victim)
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
    # The new primary continues at the stream's reservation mark: no offset
    # the old one handed out is given again (a gap of nulls between).
    acked = len(acknowledged[stream_key(n)])
    offset = after.execute_command("TWRITE", stream_key(n), "after failover")
    assert offset >= acked
    assert after.execute_command("TREAD", stream_key(n), acked, offset - acked + 1) == [None] * (
        offset - acked
    ) + [b"after failover"]
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


# ---------------------------------------------------------------- failovers under writes

# Rounds of the failover test; the default keeps it CI-sized, a soak sets
# RCP11_CLUSTER_ROUNDS (tests/README.md).
ROUNDS = int(os.environ.get("RCP11_CLUSTER_ROUNDS", "4"))
CHAOS_KEYS = [f"{{chaos{n}}}".encode() for n in range(12)]
CHAOS_KEEP = 300


class Writers:
    """Writer threads on the cluster: each TWRITE's reply goes into the
    ledger; every 10th write is followed by WAIT 1 on its connection and is
    confirmed when a replica acknowledged it. Refusals, redirections and
    dead nodes are expected: the writer refreshes its view and goes on.
    Messages are 8 KB, as in the issue's failover: more than loopback's
    socket buffers hold while a replica lags, so a failover loses some. Each
    stream keeps its newest CHAOS_KEEP offsets (TEVICT), so a long soak
    stays small."""

    def __init__(self, ports: list[int], threads: int = 3) -> None:
        self.ports = ports
        self.ledger = Ledger()
        self.confirmed: dict[tuple[bytes, int], bytes] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(n,)) for n in range(threads)]
        for thread in self.threads:
            thread.start()

    def run(self, number: int) -> None:
        from redis.cluster import ClusterNode, RedisCluster

        rc = RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", port) for port in self.ports],
            socket_timeout=5,
        )
        n = 0
        while not self.stop.is_set():
            key = CHAOS_KEYS[(n * 7 + number) % len(CHAOS_KEYS)]
            payload = b"w%d:%d:" % (number, n) + b"p" * 8192
            confirm = n % 10 == 0
            trim = n % 100 == 99
            n += 1
            try:
                pipe = rc.get_redis_connection(rc.get_node_from_key(key)).pipeline(
                    transaction=False
                )
                pipe.execute_command("TWRITE", key, payload)
                if confirm:
                    pipe.execute_command("WAIT", 1, 1000)
                if trim:
                    pipe.execute_command("TEVICT", key, -CHAOS_KEEP)
                replies = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                self.refresh(rc)
                continue
            if isinstance(replies[0], Exception):
                self.ledger.refused += 1
                self.refresh(rc)  # -MOVED after a failover, -NOREPLICAS, -READONLY
                continue
            self.ledger.record(key, replies[0], payload)
            if confirm and isinstance(replies[1], int) and replies[1] >= 1:
                self.confirmed[(key, replies[0])] = payload
        rc.close()

    def refresh(self, rc: Any) -> None:
        time.sleep(0.02)
        with contextlib.suppress(Exception):
            rc.nodes_manager.initialize()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def healthy(cluster: ModuleCluster) -> bool:
    """Every node answers and sees the cluster ok; three primaries, each with
    one online replica."""
    try:
        primaries = cluster.primaries()
        for srv in cluster.servers:
            client = cluster.node_client(srv.port)
            ok = client.cluster("info")["cluster_state"] == "ok"
            client.close()
            if not ok:
                return False
        for port in primaries:
            client = cluster.node_client(port)
            info = client.info("replication")
            client.close()
            replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            if len(replicas) != 1 or replicas[0]["state"] != "online":
                return False
        return len(primaries) == 3
    except redis.ConnectionError:
        return False


def role(cluster: ModuleCluster, port: int) -> str | None:
    try:
        return cluster._role(port)
    except redis.ConnectionError:
        return None


def kill_primary(cluster: ModuleCluster, victim: RedisModuleServer, lag: str) -> None:
    """kill -9 a primary while its replica lags (`stop`: SIGSTOP for 1.5 s,
    `sleep`: DEBUG SLEEP 1.5 on it, `none`); once the replica took over,
    the old primary restarts and rejoins as its replica."""
    replica = next(s for s in cluster.servers if s.port == cluster.replica_of(victim.port))
    assert replica.proc is not None
    if lag == "stop":
        os.kill(replica.proc.pid, signal.SIGSTOP)
        time.sleep(1.5)
    elif lag == "sleep":
        sleeper = cluster.node_client(replica.port)
        thread, _ = in_thread(lambda: sleeper.execute_command("DEBUG", "SLEEP", "1.5"))
        time.sleep(0.5)
    victim.kill9()
    if lag == "stop":
        os.kill(replica.proc.pid, signal.SIGCONT)
    elif lag == "sleep":
        thread.join(10)
        sleeper.close()
    wait_for(lambda: role(cluster, replica.port) == "master", 60)
    victim.start()
    wait_for(lambda: healthy(cluster), 90)


def manual_failover(cluster: ModuleCluster, primary: int) -> None:
    """CLUSTER FAILOVER on the primary's replica. Redis gives a manual
    failover 5 s for the replica to reach the paused primary's offset and
    then drops it ("Manual failover timed out"), as a busy machine may make
    it: the operator asks again, and so does this, three times at most."""
    replica = cluster.replica_of(primary)
    client = cluster.node_client(replica)
    for attempt in range(3):
        client.execute_command("CLUSTER", "FAILOVER")
        try:
            wait_for(lambda: role(cluster, replica) == "master", 20)
            break
        except AssertionError:
            if attempt == 2:
                raise
    client.close()
    wait_for(lambda: healthy(cluster), 90)


def test_failovers_under_writes_hand_out_no_offset_twice(cluster: ModuleCluster) -> None:
    by_port = {srv.port: srv for srv in cluster.servers}
    writers = Writers([srv.port for srv in cluster.servers])
    kinds = ["stop", "failover", "sleep", "none"]
    rounds = []
    try:
        wait_for(lambda: len(writers.ledger.acked) > 500, 60)
        for n in range(ROUNDS):
            kind = kinds[n % len(kinds)]
            before = len(writers.ledger.acked)
            primary = sorted(cluster.primaries())[n % 3]
            if kind == "failover":
                manual_failover(cluster, primary)
            else:
                kill_primary(cluster, by_port[primary], kind)
            # Writes went on through the round.
            wait_for(lambda before=before: len(writers.ledger.acked) > before + 200, 60)
            rounds.append(kind)
    finally:
        writers.finish()
    ledger = writers.ledger
    check = cluster.client()
    ledger.check_stored(check)  # every acknowledged offset: its message or null
    first = {key: tr(check, key, 0, 0, "WITHINFO")[0][0] for key in CHAOS_KEYS}
    kept = {key: tr(check, key, first[key], 1 << 30) for key in CHAOS_KEYS}
    # Lost in failovers: acknowledged, not evicted since, and null.
    lost = sum(
        1
        for key, offset in ledger.acked
        if offset >= first[key]
        and (offset - first[key] >= len(kept[key]) or kept[key][offset - first[key]] is None)
    )
    missing = [
        (key, offset)
        for (key, offset), message in writers.confirmed.items()
        if offset >= first[key] and tr(check, key, offset, 1) != [message]
    ]
    # The figures of the run (the report quotes them).
    print(
        f"\nrounds {rounds}: {len(ledger.acked)} acknowledged writes checked, "
        f"{len(writers.confirmed)} confirmed by WAIT, {lost} lost in failovers, "
        f"{ledger.refused} refused, {len(ledger.reused)} offsets handed out twice"
    )
    assert ledger.reused == [], f"{len(ledger.reused)} offsets handed out twice"
    assert missing == [], f"{len(missing)} writes confirmed by WAIT were lost"
    assert len(rounds) == ROUNDS and len(ledger.acked) > 1000
    check.close()
