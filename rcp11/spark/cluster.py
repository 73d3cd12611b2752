"""Redis Cluster: where each key lives, for the source and the sink.

Option ``cluster``: ``auto`` (the default) asks the server ``CLUSTER
SLOTS`` and uses the cluster when it answers with slots (rcp11-server, and
redis-server without cluster mode, answer with an error: one server);
``true`` requires a cluster; ``false`` never asks.

On a cluster every key is read and written on the primary that owns its
hash slot, found from the slot map (``Router``); the driver plans one Spark
partition per stream range, tagged with its owner, and talks to every
primary it needs (``Fleet``). A ``MOVED`` reply (a slot that moved, or a
failover) or a lost node makes the caller ask the cluster for the slot map
again and go to the new owner; the callers' own retry rules (connection.py)
say what is sent again. The sink's keys share their target's hash tag
(commit.sink_key), so a commit's WATCH/MULTI/EXEC runs on one node.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import redis
from redis.crc import key_slot
from redis.exceptions import ClusterDownError, MovedError

from rcp11 import errors
from rcp11.spark.connection import REDIRECTS, RETRYABLE, Outage, new_client
from rcp11.spark.options import Endpoint, OptionError

if TYPE_CHECKING:
    from rcp11.client import Client

T = TypeVar("T")

# Errors after which a cluster caller re-reads the slot map and tries again.
REROUTE = RETRYABLE + REDIRECTS


@dataclass(frozen=True)
class Topology:
    """The slot map: (first slot, last slot, host, port) of each primary's ranges."""

    ranges: tuple[tuple[int, int, str, int], ...]

    def owner(self, key: str | bytes) -> tuple[str, int]:
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        index = bisect.bisect_right([r[0] for r in self.ranges], slot) - 1
        first, last, host, port = self.ranges[max(index, 0)]
        if not first <= slot <= last:
            raise ClusterDownError(f"CLUSTERDOWN hash slot {slot} is not served")
        return host, port

    def primaries(self) -> list[tuple[str, int]]:
        return sorted({(host, port) for _, _, host, port in self.ranges})


def read_topology(client: Client, seed_host: str) -> Topology | None:
    """The slot map from CLUSTER SLOTS, or None when the server is no cluster
    node (an error reply: unknown command, or cluster support disabled)."""
    try:
        reply = client.execute_command("CLUSTER SLOTS")
    except redis.ResponseError as exc:
        if isinstance(exc, REDIRECTS):
            raise
        return None
    ranges = []
    for entry in reply:
        first, last, primary = int(entry[0]), int(entry[1]), entry[2]
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        # A node that announces no address is reached where the seed is.
        ranges.append((first, last, host or seed_host, int(primary[1])))
    return Topology(tuple(sorted(ranges))) if ranges else None


@dataclass
class Router:
    """Where keys live. Picklable (no socket): the driver resolves it and
    Spark ships it to tasks, which refresh it when the cluster changes."""

    endpoint: Endpoint  # the seed: the host and port options
    topology: Topology | None = None
    resolved: bool = False

    @property
    def clustered(self) -> bool:
        return self.topology is not None

    def node(self, host: str, port: int) -> Endpoint:
        return dataclasses.replace(self.endpoint, host=host, port=port)

    def endpoint_for(self, key: str | bytes) -> Endpoint:
        self.resolve()
        if self.topology is None:
            return self.endpoint
        return self.node(*self.topology.owner(key))

    def nodes(self) -> list[Endpoint]:
        self.resolve()
        if self.topology is None:
            return [self.endpoint]
        return [self.node(host, port) for host, port in self.topology.primaries()]

    def resolve(self) -> None:
        if not self.resolved:
            self.refresh()

    def refresh(self) -> None:
        """Read the slot map again: from the seed, else from any node known
        before (the seed may be the node that failed). Raises a connection
        error when none answers (callers wait and try again)."""
        mode = self.endpoint.cluster
        if mode == "false":
            self.topology, self.resolved = None, True
            return
        known = [self.endpoint] + [
            self.node(host, port) for host, port in (self.topology or Topology(())).primaries()
        ]
        failure: BaseException | None = None
        for endpoint in known:
            client = new_client(endpoint)
            try:
                topology = read_topology(client, self.endpoint.host)
            except REROUTE as exc:
                failure = exc
                continue
            finally:
                client.close()
            if topology is None and mode == "true":
                raise OptionError(errors.spark_not_a_cluster(endpoint.address))
            self.topology, self.resolved = topology, True
            return
        assert failure is not None
        raise failure

    def after(self, exc: BaseException, key: str | bytes) -> Endpoint:
        """Where to try ``key`` again after ``exc`` (MOVED names the node)."""
        if isinstance(exc, MovedError) and self.topology is not None:
            self.resolved = False  # the rest of the map may have changed too
            return self.node(exc.host or self.endpoint.host, int(exc.port))
        self.refresh()
        return self.endpoint_for(key)


class Fleet:
    """The driver's clients for one operation: the one server, or one per
    primary of the cluster; keys go to the client of their owner."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._clients: dict[str, Client] = {}

    def client(self, endpoint: Endpoint) -> Client:
        if endpoint.address not in self._clients:
            self._clients[endpoint.address] = new_client(endpoint)
        return self._clients[endpoint.address]

    def client_for(self, key: str) -> Client:
        return self.client(self.router.endpoint_for(key))

    def primaries(self) -> list[Client]:
        return [self.client(endpoint) for endpoint in self.router.nodes()]

    def by_owner(self, keys: Iterable[str]) -> Iterator[tuple[Client, list[str]]]:
        groups: dict[str, list[str]] = {}
        endpoints: dict[str, Endpoint] = {}
        for key in keys:
            endpoint = self.router.endpoint_for(key)
            endpoints[endpoint.address] = endpoint
            groups.setdefault(endpoint.address, []).append(key)
        for address, group in groups.items():
            yield self.client(endpoints[address]), group

    def close(self) -> None:
        """Close every connection; the fleet opens new ones when used again."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, doing: str, operation: Callable[[Fleet], T]) -> T:
        """Run ``operation(self)``; through lost connections and cluster
        redirections wait (as connection.Session does), re-read the slot map
        and run it again, until retryTimeoutMs has passed."""
        outage = Outage(self.router.endpoint, doing)
        while True:
            try:
                return operation(self)
            except REROUTE as exc:
                self.close()
                outage.wait(exc)
                self.router.resolved = False
