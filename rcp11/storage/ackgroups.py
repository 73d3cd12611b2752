"""The binding of src/ackgroup.c: the state an acknowledged consumer group
keeps (docs/PROTOCOL.md, "Acknowledged groups").

An :class:`AckGroup` is what a group key holds in acknowledged mode: the
stream it belongs to, its next offset, and the pending ranges (leased,
not acknowledged) with their deadlines, owners and delivery counts. The C
code is shared with the Redis module (src/module_ack.c), so both servers
pick, lease, acknowledge and serialize alike. Like a Stream, a group
belongs to one thread (the server's event loop).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from rcp11.storage.binding import ffi, lib
from rcp11.storage.errors import CorruptDataError, InvalidArgumentError, StorageMemoryError
from rcp11.storage.records import MUTATIONS

MAX_OWNER_BYTES: int = lib.AG_MAX_OWNER_BYTES
MAX_LEASE_MS: int = lib.AG_MAX_LEASE_MS
NO_DEADLINE: int = lib.AG_NO_DEADLINE
# The type name TYPE answers (the Redis module's second data type).
GROUP_TYPE = "rcp11-grp"


@dataclass(frozen=True)
class PendingRange:
    """One pending range: offsets start..start+count-1."""

    start: int
    count: int
    deadline_ms: int
    deliveries: int
    owner: bytes


@dataclass(frozen=True)
class OwnerSummary:
    """One consumer holding leases (TGROUP INFO's consumers)."""

    name: bytes
    pending: int
    expired: int
    latest_deadline_ms: int


@dataclass(frozen=True)
class Totals:
    delivered: int
    redelivered: int
    acked: int
    dropped: int


def _raise(rc: int) -> None:
    if rc == lib.AG_ERR_NOMEM:
        raise StorageMemoryError("out of memory", rc)
    if rc == lib.AG_ERR_CORRUPT:
        raise CorruptDataError("corrupt group data", rc)
    raise InvalidArgumentError("argument out of range", rc)


class AckGroup:
    """An acknowledged group's state (ag_group)."""

    __slots__ = ("__weakref__", "_g", "stream_key")

    def __init__(self, stream_key: bytes, next_offset: int) -> None:
        ptr = lib.ag_new(stream_key, len(stream_key), next_offset)
        if ptr == ffi.NULL:
            raise StorageMemoryError("out of memory", lib.AG_ERR_NOMEM)
        self._g = ffi.gc(ptr, lib.ag_free)
        # The stream it belongs to, fixed for its life (read on every lease).
        self.stream_key = stream_key

    # -- what it holds ----------------------------------------------------

    @property
    def next_offset(self) -> int:
        return lib.ag_next(self._g)

    @property
    def pending(self) -> int:
        return lib.ag_pending(self._g)

    @property
    def num_ranges(self) -> int:
        return lib.ag_num_ranges(self._g)

    @property
    def memory_bytes(self) -> int:
        return lib.ag_memory_bytes(self._g)

    def totals(self) -> Totals:
        out = ffi.new("ag_totals *")
        lib.ag_get_totals(self._g, out)
        return Totals(out.delivered, out.redelivered, out.acked, out.dropped)

    # -- changes (each one counted in storage.MUTATIONS, as stream ones) --

    def floor(self, offset: int) -> int:
        """Drop pending offsets below `offset` (evicted); raise the next
        offset to it. Returns the offsets dropped."""
        MUTATIONS.ticks += 1
        rc = lib.ag_floor(self._g, offset)
        if rc < 0:
            _raise(rc)
        return rc

    def pick(self, now_ms: int, floor: int, end: int, count: int) -> tuple[int, int, int]:
        """What a lease read delivers now from a stream whose readable
        offsets are floor..end-1: (start, count, deliveries); count 0 when
        nothing. Changes nothing: floor() and lease() deliver it."""
        out = _scratch()[0]
        lib.ag_pick(self._g, now_ms, floor, end, count, out)
        return out.start, out.count, out.deliveries

    def take(
        self, now_ms: int, floor: int, end: int, count: int, lease_ms: int, owner: bytes
    ) -> tuple[int, int, int, int]:
        """A lease read's delivery in one C call: pick(), then, if it found
        something, floor(floor) and lease() of it until now_ms + lease_ms.
        (start, count, deliveries, deadline); count 0: nothing changed."""
        MUTATIONS.ticks += 1
        out, deadline = _scratch()
        rc = lib.ag_take(self._g, now_ms, floor, end, count, lease_ms, owner, len(owner), out,
                         deadline)  # fmt: skip
        if rc < 0:
            _raise(rc)
        return out.start, out.count, out.deliveries, deadline[0]

    def lease(
        self, start: int, count: int, deadline_ms: int, deliveries: int, owner: bytes
    ) -> None:
        MUTATIONS.ticks += 1
        rc = lib.ag_lease(self._g, start, count, deadline_ms, deliveries, owner, len(owner))
        if rc < 0:
            _raise(rc)

    def ack(self, start: int, count: int) -> int:
        """Acknowledge offsets start..start+count-1; how many were pending."""
        MUTATIONS.ticks += 1
        rc = lib.ag_ack(self._g, start, count)
        if rc < 0:
            _raise(rc)
        return rc

    # -- inspection -------------------------------------------------------

    def earliest_deadline(self, floor: int, end: int) -> int | None:
        """The first moment (unix ms) a lease of offsets in floor..end-1
        runs out, None when none can."""
        ms = lib.ag_earliest_deadline(self._g, floor, end)
        return None if ms == NO_DEADLINE else ms

    def pending_from(self, floor: int, now_ms: int) -> tuple[int, int, int]:
        """(pending, expired, ranges) over the offsets >= floor."""
        expired = ffi.new("uint64_t *")
        ranges = ffi.new("uint64_t *")
        pending = lib.ag_pending_from(self._g, floor, now_ms, expired, ranges)
        return pending, expired[0], ranges[0]

    def ranges(self, offset: int = 0, limit: int | None = None) -> list[PendingRange]:
        """The pending ranges from the one holding `offset` (or the next) on."""
        g = self._g
        total = lib.ag_num_ranges(g)
        i = lib.ag_range_index(g, offset)
        stop = total if limit is None else min(total, i + limit)
        info = ffi.new("ag_range_info *")
        names: dict[int, bytes] = {}
        found = []
        for k in range(i, stop):
            lib.ag_range_get(g, k, info)
            owner = names.get(info.owner)
            if owner is None:
                owner = names[info.owner] = self._owner(info.owner)
            found.append(
                PendingRange(info.start, info.count, info.deadline_ms, info.deliveries, owner)
            )
        return found

    def owners(self, floor: int, now_ms: int) -> list[OwnerSummary]:
        """Each consumer holding leases at or above floor, in slot order."""
        g = self._g
        n = lib.ag_num_owners(g)
        pending = ffi.new("uint64_t[]", max(n, 1))
        expired = ffi.new("uint64_t[]", max(n, 1))
        latest = ffi.new("int64_t[]", max(n, 1))
        lib.ag_owner_stats(g, floor, now_ms, pending, expired, latest)
        return [
            OwnerSummary(self._owner(k), pending[k], expired[k], latest[k])
            for k in range(n)
            if pending[k]
        ]

    def _owner(self, slot: int) -> bytes:
        size = ffi.new("size_t *")
        name = lib.ag_owner_name(self._g, slot, size)
        return b"" if name == ffi.NULL else ffi.unpack(name, size[0])

    # -- the blob -----------------------------------------------------------

    def dump(self) -> bytes:
        buf = ffi.new("mn_buf *")
        try:
            rc = lib.ag_serialize(self._g, buf)
            if rc < 0:
                _raise(rc)
            return ffi.unpack(buf.data, buf.len)
        finally:
            lib.mn_buf_free(buf)

    @classmethod
    def load(cls, blob: bytes | memoryview) -> AckGroup:
        """A group from dump()'s bytes; CorruptDataError when they fail the
        checks."""
        err = ffi.new("int *")
        data = ffi.from_buffer(blob)
        ptr = lib.ag_load(data, len(data), err)
        if ptr == ffi.NULL:
            _raise(err[0])
        group = cls.__new__(cls)
        group._g = ffi.gc(ptr, lib.ag_free)
        group.stream_key = ffi.unpack(lib.ag_stream_name(ptr), lib.ag_stream_name_len(ptr))
        return group

    def copy(self) -> AckGroup:
        return AckGroup.load(self.dump())


# Out-parameters reused between calls, one set per thread (cffi runs C
# without the GIL): allocating them costs more than a pick.
_local = threading.local()


def _scratch() -> tuple[Any, Any]:
    found = getattr(_local, "out", None)
    if found is None:
        found = _local.out = (ffi.new("ag_choice *"), ffi.new("int64_t *"))
    return found


__all__ = [
    "GROUP_TYPE",
    "MAX_LEASE_MS",
    "MAX_OWNER_BYTES",
    "AckGroup",
    "OwnerSummary",
    "PendingRange",
    "Totals",
]
