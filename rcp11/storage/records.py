"""What the storage layer reports besides messages: what a retention call
evicted (:class:`Evicted`), one macronode (:class:`NodeInfo`), and the clock
that counts every change of every stream and group (:data:`MUTATIONS`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Evicted:
    """What one retention call evicted (mn_evicted), and whether it stopped
    at its node budget with more to evict."""

    messages: int = 0
    bytes: int = 0
    nodes: int = 0
    memory: int = 0
    more: bool = False


@dataclass(frozen=True)
class NodeInfo:
    """One macronode (mn_node_info): for tests, DEBUG and INFO."""

    first: int
    count: int
    compressed: bool
    zlevel: int
    first_ms: int
    last_ms: int
    memory: int
    time_width: int  # bytes per message of its time deltas (0, 1, 2, 4, 8)


class MutationClock:
    """Counts every mutation of every stream. Dispatch reads it around a
    command handler that raised, to know whether the handler had already
    changed a stream (so that the change is logged, never left half done)."""

    __slots__ = ("ticks",)

    def __init__(self) -> None:
        self.ticks = 0


MUTATIONS = MutationClock()


__all__ = ["MUTATIONS", "Evicted", "MutationClock", "NodeInfo"]
