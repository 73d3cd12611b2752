"""A Redis Cluster of module servers on loopback (ModuleCluster), on port
pairs whose cluster bus port is free too."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
from types import ModuleType
from typing import Any

import redis

from harness import REPO
from harness.servers import RedisModuleServer
from harness.waiting import wait_for

RUN_CLUSTER = REPO / "examples" / "cluster" / "run_cluster.py"


@functools.cache
def _run_cluster_example() -> ModuleType:
    """examples/cluster/run_cluster.py, loaded as a module (it is a script,
    not a package)."""
    spec = importlib.util.spec_from_file_location("run_cluster", RUN_CLUSTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_cluster_port() -> int:
    """A port whose cluster bus port (+10000) is free too: the cluster
    example's finder, one copy for the example and the tests."""
    return _run_cluster_example().free_node_port()


class ModuleCluster:
    """Six redis-servers with the module, joined into a cluster of three
    primaries with one replica each (`redis-cli --cluster create`), on
    loopback. ``module_factory(port=..., **directives)`` starts one node
    (the module_factory fixture, or a longer-lived one)."""

    def __init__(self, module_factory: Any, nodes: int = 6) -> None:
        self.servers: list[RedisModuleServer] = []
        for _ in range(nodes):
            srv: RedisModuleServer = module_factory(
                port=free_cluster_port(),
                cluster_enabled="yes",
                cluster_config_file="nodes.conf",
                cluster_node_timeout=3000,
                repl_diskless_sync_delay=0,
            )
            self.servers.append(srv)
        addresses = [f"127.0.0.1:{srv.port}" for srv in self.servers]
        done = subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1"]
            + ["--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        for srv in self.servers:
            client = srv.client()
            wait_for(lambda client=client: client.cluster("info")["cluster_state"] == "ok", 60)
            client.close()
        wait_for(self._replicas_in_sync, 60)

    def client(self) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.servers[0].port)

    def node_client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port)

    def primaries(self) -> list[int]:
        return [srv.port for srv in self.servers if self._role(srv.port) == "master"]

    def replica_of(self, primary_port: int) -> int:
        for srv in self.servers:
            info = redis.Redis(port=srv.port).info("replication")
            if info["role"] == "slave" and info["master_port"] == primary_port:
                return srv.port
        raise AssertionError(f"no replica of {primary_port}")

    def _role(self, port: int) -> str:
        client = redis.Redis(port=port)
        try:
            return client.info("replication")["role"]
        finally:
            client.close()

    def _replicas_in_sync(self) -> bool:
        """Every replica has everything its primary sent (what WAIT waits
        for): the offsets match and the link is up."""
        for port in self.primaries():
            info = redis.Redis(port=port).info("replication")
            replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            if len(replicas) != 1:
                return False
            if (
                replicas[0]["state"] != "online"
                or replicas[0]["offset"] != info["master_repl_offset"]
            ):
                return False
        return True
