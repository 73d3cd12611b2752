"""The Spark source and sink on a Redis Cluster of module nodes (3 primaries
with a replica each, on loopback): the cluster is found from any node, each
stream range is read on its owner, staging and bookkeeping keys share their
target's slot so the commit's transaction runs on one node, every row lands
exactly once, and a query carries on across a replica promotion.

(tests/test_spark_cluster.py is Spark's own standalone cluster.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import ModuleCluster, RedisModuleServer, module_server_program, require, wait_for
from helpers_spark import failing_once
from redis.crc import key_slot

from rcp11.client import ClusterClient
from rcp11.spark.cluster import Router
from rcp11.spark.options import Endpoint, OptionError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.module,  # its cluster's nodes are module servers
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]

# Streams spread over the three primaries (hash tags pick their slots).
SOURCES = [f"{{src{n}}}" for n in range(9)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleCluster]:
    module_server_program()
    require("redis-cli")
    started: list[RedisModuleServer] = []

    def node(**directives: object) -> RedisModuleServer:
        srv = RedisModuleServer(tmp_path_factory.mktemp("cluster-node"), **directives)
        started.append(srv)
        srv.start()
        return srv

    try:
        yield ModuleCluster(node)
    finally:
        for srv in started:
            srv.kill9()


@pytest.fixture
def rc(cluster: ModuleCluster) -> Iterator[ClusterClient]:
    """rcp11's cluster client (redis-py's RedisCluster with the stream commands)."""
    client = ClusterClient(host="127.0.0.1", port=cluster.primaries()[0])
    client.flushall(target_nodes=client.PRIMARIES)
    yield client
    client.close()


def seed(cluster: ModuleCluster, rc: Any, key: str | None = None) -> int:
    """A node's port for the host/port options: one that does not own
    ``key`` when given (so routing, not luck, finds it)."""
    primaries = cluster.primaries()
    if key is None:
        return primaries[0]
    owner = rc.get_node_from_key(key).port
    return next(port for port in primaries if port != owner)


def fill(rc: Any, key: str, count: int) -> list[bytes]:
    values = [b"%s-%d" % (key.encode(), i) for i in range(count)]
    end = rc.tread(key, 0, 0, withinfo=True).next_offset
    # At the stream's end (after a failover: at its reservation mark).
    assert rc.twrite(key, *values) >= end
    return values


def messages(rc: Any, key: str) -> list[bytes]:
    return [m for m in rc.tread(key, 0, 1_000_000) if m is not None]


def offsets(rc: Any, key: str) -> list[int]:
    """The offsets holding a message (a failover leaves a gap of nulls)."""
    return [i for i, m in enumerate(rc.tread(key, 0, 1_000_000)) if m is not None]


def sink_keys(rc: Any) -> list[bytes]:
    return sorted(rc.keys("rcp11-sink:*", target_nodes=rc.PRIMARIES))


def test_the_cluster_mode_is_found_or_required(cluster, server_factory) -> None:
    router = Router(Endpoint(port=cluster.primaries()[0]))
    router.resolve()
    assert router.clustered and len(router.topology.primaries()) == 3
    plain = server_factory()  # rcp11-server: no CLUSTER command
    router = Router(Endpoint(port=plain.port))
    router.resolve()
    assert not router.clustered
    with pytest.raises(OptionError, match="is not a Redis Cluster node"):
        Router(Endpoint(port=plain.port, cluster="true")).resolve()
    # cluster=false never asks: a cluster node is then used as one server.
    router = Router(Endpoint(port=cluster.primaries()[0], cluster="false"))
    router.resolve()
    assert not router.clustered


def test_batch_read_plans_one_partition_per_stream_on_its_owner(cluster, spark, rc) -> None:
    from rcp11.spark.datasource import RCP11DataSource

    written = {key: fill(rc, key, 50 + n) for n, key in enumerate(SOURCES)}
    owners = {key: f"127.0.0.1:{rc.get_node_from_key(key).port}" for key in SOURCES}
    assert len(set(owners.values())) == 3
    options = {"port": str(seed(cluster, rc)), "subscribe": ",".join(SOURCES)}
    parts = RCP11DataSource(options).reader(None).partitions()
    assert sorted((p.stream, p.node) for p in parts) == sorted(owners.items())
    df = spark.read.format("rcp11").options(**options).load()
    found = {(r.stream, r.offset, bytes(r.value)) for r in df.collect()}
    assert found == {(k, i, v) for k, vs in written.items() for i, v in enumerate(vs)}
    # A pattern scans every primary.
    pattern = spark.read.format("rcp11").option("port", seed(cluster, rc))
    assert pattern.option("subscribePattern", "{src*").load().count() == len(found)


def test_batch_write_by_column_is_exactly_once_on_each_owner(cluster, spark, rc) -> None:
    targets = [f"{{dst{n}}}" for n in range(6)]
    assert len({rc.get_node_from_key(t).port for t in targets}) == 3
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        values = spark.range(0, 6000, numPartitions=2).selectExpr(
            f"element_at(array({', '.join(repr(t) for t in targets)}), "
            f"CAST(id % {len(targets)} + 1 AS INT)) AS stream",
            "CAST(id AS STRING) AS value",
        )
        # Partition 0's first attempt dies after staging rows on every node:
        # its retry's staging streams are committed, the dead ones dropped.
        failing = values.mapInArrow(failing_once(), values.schema)
        failing.write.format("rcp11").option("port", seed(cluster, rc)).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    for n, target in enumerate(targets):
        expected = Counter(b"%d" % i for i in range(6000) if i % len(targets) == n)
        assert Counter(messages(rc, target)) == expected
    assert sink_keys(rc) == []  # a batch write leaves nothing behind


def test_a_streaming_copy_across_nodes_carries_on_through_failovers(
    cluster, spark, rc, tmp_path: Path
) -> None:
    target = "{copy}"
    for key in SOURCES:
        fill(rc, key, 200)
    port = seed(cluster, rc, target)
    df = (
        spark.readStream.format("rcp11")
        .option("port", port)
        .option("subscribe", ",".join(SOURCES))
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 700)
        .load()
        .selectExpr("CONCAT(stream, ':', CAST(offset AS STRING)) AS value")
    )
    query = (
        df.writeStream.format("rcp11")
        .option("port", port)
        .option("stream", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )

    def expected() -> Counter:
        return Counter(f"{key}:{offset}".encode() for key in SOURCES for offset in offsets(rc, key))

    try:
        query.processAllAvailable()
        assert Counter(messages(rc, target)) == expected()
        # The sink's keys live in the target's slot (so its commit is one
        # transaction on one node): its progress key and registry.
        keys = sink_keys(rc)
        assert [k.split(b":")[-1] for k in keys] == [b"progress", b"staged"]
        assert {key_slot(k) for k in keys} == {key_slot(target.encode())}

        # Promote the replicas of the target's node and of a source's node
        # while the query runs: its planning, its tasks and its commits meet
        # MOVED on the old primaries and follow the slots to the new ones.
        victims = {rc.get_node_from_key(target).port, rc.get_node_from_key(SOURCES[0]).port}
        for victim in victims:
            promoted = cluster.replica_of(victim)
            redis.Redis(port=promoted).execute_command("CLUSTER", "FAILOVER")
            wait_for(lambda promoted=promoted: cluster._role(promoted) == "master", 30)
            wait_for(lambda victim=victim: cluster._role(victim) == "slave", 30)
        for key in SOURCES:
            fill(rc, key, 100)
        query.processAllAvailable()
        assert Counter(messages(rc, target)) == expected()
    finally:
        query.stop()
    assert query.exception() is None
    wait_for(cluster._replicas_in_sync, 30)


def test_tasks_with_a_stale_slot_map_follow_moved(cluster, rc) -> None:
    """A task whose slot map is out of date (a failover or a resharding
    since the driver planned) is told MOVED by the node it asks, and
    reads or stages on the owner instead."""
    import pyarrow as pa

    from rcp11.spark.cluster import Topology
    from rcp11.spark.columns import Projection, WriteLayout
    from rcp11.spark.options import WriteOptions, parse_read_options
    from rcp11.spark.planning import ReadRange
    from rcp11.spark.sink import TaskWriter
    from rcp11.spark.source import read_range

    key = "{moved}"
    wrong = seed(cluster, rc, key)
    endpoint = Endpoint(port=wrong, retry_backoff_ms=1)
    stale = Router(endpoint, Topology(((0, 16383, "127.0.0.1", wrong),)), resolved=True)
    values = [b"m%d" % i for i in range(100)]
    options = WriteOptions(endpoint, key, batch_size=7)
    writer = TaskWriter(options, WriteLayout(0, None, None), "j", router=stale)
    writer.add(pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"]))
    (staged,) = writer.finish().staged
    assert staged.rows == 100 and messages(rc, staged.key) == values

    rc.twrite(key, *values)
    read = parse_read_options({"port": str(wrong), "subscribe": key, "batchSize": "9"})
    part = ReadRange(key, 0, 100, 0, f"127.0.0.1:{wrong}")
    offsets = [
        o for batch in read_range(read, Projection(), part) for o in batch.column(1).to_pylist()
    ]
    assert offsets == list(range(100))
