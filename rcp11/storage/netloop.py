"""The binding of src/netloop.c, the C lane's event loop: :class:`CLoop`
(one nl_loop: its epoll descriptor, its batch of what the lane ran) and
:class:`CConnection` (one nl_conn: a socket the loop reads, runs through
the lane and answers). What the server does with them is
rcp11/server/netloop.py's.

The loop's callbacks reach Python objects through cffi handles: the
loop's reach its CLoop, whose owner answers ``resolve(key)`` (as
LaneCall.run's resolver answers: a stream, an acknowledged group or
nothing) and ``on_data(transport, data)``
(bytes the lane did not run; transport: the connection's owner); each
connection's reach its owner, which answers ``on_closed(err)`` and
``on_water(over)``.
"""

from __future__ import annotations

import errno
from typing import Any, Protocol

from rcp11.storage.binding import UINT64_MAX, ffi, lib
from rcp11.storage.lane import FIXED_TIME, Answer, give_answer

_NL_LANE: int = lib.NL_LANE


class LoopUser(Protocol):
    """What a CLoop asks of its owner (server/netloop.py's NetLoop)."""

    def resolve(self, key: bytes) -> Answer:
        """What the lane may do with key (LaneCall's resolver's answer)."""

    def on_data(self, transport: Any, data: bytes) -> None:
        """Bytes the lane did not run, of the CConnection whose owner is
        transport."""


class ConnectionUser(Protocol):
    """What a CConnection's C callbacks ask of its owner."""

    def on_closed(self, err: int) -> None:
        """The socket is closed (err: 0, or the errno that broke it)."""

    def on_water(self, over: int) -> None:
        """Pending output went over (1) or back to (0) the water mark, or a
        flush would have taken it past the hard limit (2)."""


class CLoop:
    """One C loop (nl_loop) and the batch of what its lane ran."""

    def __init__(self, owner: LoopUser) -> None:
        cloop = lib.nl_loop_new()
        if cloop == ffi.NULL:
            raise OSError("the C lane's event loop could not start (epoll refused?)")
        self.cloop: Any = ffi.gc(cloop, lib.nl_loop_free)
        self.owner = owner
        # False once closed: its callbacks then do nothing.
        self.open = True
        # (key, Stream or None) in the order C asked about them this batch.
        self.resolved: list[tuple[bytes, Any]] = []
        self._handle = ffi.new_handle(self)
        self._data = ffi.new("const char **")
        self._len = ffi.new("size_t *")
        self._owners_n = ffi.new("size_t *")
        self._slow_owner = ffi.new("void **")
        # CConnection.activity()'s out-parameter, one per loop (the loop's
        # thread alone uses it).
        self.read_us = ffi.new("int64_t *")
        lib.nl_set_callbacks(
            self.cloop,
            self._handle,
            lib.nl_resolve_key,
            lib.nl_on_data,
            lib.nl_on_closed,
            lib.nl_on_water,
        )

    def fd(self) -> int:
        """The epoll descriptor: readable when poll() has something to do."""
        return lib.nl_loop_fd(self.cloop)

    def close(self) -> None:
        self.open = False

    def set_limits(
        self, max_bulk_len: int, max_multibulk_len: int, max_commands: int, poll_reply_bytes: int
    ) -> None:
        """Parser limits, requests per lane run, and the lane replies one
        poll builds at most (0: no cap)."""
        lib.nl_set_limits(
            self.cloop, max_bulk_len, max_multibulk_len, max_commands, poll_reply_bytes
        )

    def set_hard_limit(self, size: int) -> None:
        """client-output-buffer-limit normal's hard bytes."""
        lib.nl_set_hard_limit(self.cloop, size)

    def lane_on(
        self, flags: int, room: int, memory_room: int, slow_usec: int, fixed_ms: int | None
    ) -> None:
        """The lane runs, with lane_run()'s flags, AOF and memory room and
        slow threshold; fixed_ms: the append time TWRITEs take (None: the
        clock's)."""
        if fixed_ms is not None:
            flags |= FIXED_TIME
            lib.nl_set_fixed_ms(self.cloop, fixed_ms)
        slow = min(slow_usec, UINT64_MAX)
        lib.nl_set_switches(self.cloop, _NL_LANE | flags, room, memory_room, slow)

    def lane_off(self) -> None:
        lib.nl_set_switches(self.cloop, 0, 0, 0, UINT64_MAX)

    def run(self, rounds: int, budget_us: int) -> None:
        """Each ready connection read once and run through the lane; then,
        while Python is not needed (nothing handed over, no AOF bytes),
        flush and do it again: up to rounds polls, started within
        budget_us."""
        lib.nl_run(self.cloop, rounds, budget_us)

    def set_coalesce(self, usec: int) -> None:
        """After a poll of run() that found many ready connections, a poll
        that finds few first waits usec for more (0: never)."""
        lib.nl_set_coalesce(self.cloop, usec)

    def batch_pending(self) -> bool:
        return bool(lib.nl_batch_pending(self.cloop))

    def dirty(self) -> bool:
        """Output waits to be flushed."""
        return bool(lib.nl_dirty(self.cloop))

    def flush(self) -> None:
        """Write every connection's output (after the AOF took the batch)."""
        lib.nl_flush(self.cloop)

    # -- the batch: what the lane ran since the last reset ----------------------

    def counts(self) -> Any:
        """The batch's nl_counts (calls, microseconds and messages of TWRITE
        and TREAD, network bytes, aof_failed), read as fields."""
        return lib.nl_batch_counts(self.cloop)

    def written(self) -> list[tuple[bytes, Any]]:
        """The keys the batch changed (key, Stream or AckGroup): each stream
        must take up its new next offset (Stream.written_in_c())."""
        cloop = self.cloop
        return [r for i, r in enumerate(self.resolved) if lib.nl_batch_key_written(cloop, i)]

    def aof_runs(self) -> list[tuple[int | None, bytes]]:
        """The batch's AOF bytes: (append time in unix ms, requests verbatim)
        runs. A run of lease reads and TACKs alone is undated (None: C's -1,
        no TWRITE ran), as LaneCall.changes() gives it: -1 written as a date
        would be a record the AOF loader refuses."""
        cloop = self.cloop
        data, size = self._data, self._len
        runs: list[tuple[int | None, bytes]] = []
        for i in range(lib.nl_batch_aof_runs(cloop)):
            ms = lib.nl_batch_aof_run(cloop, i, data, size)
            runs.append((ms if ms >= 0 else None, ffi.unpack(data[0], size[0])))
        return runs

    def slow(self) -> list[tuple[Any, bytes, int]]:
        """The batch's slow commands: (connection owner or None, request,
        microseconds)."""
        cloop = self.cloop
        found = []
        for i in range(lib.nl_batch_slow_count(cloop)):
            usec = lib.nl_batch_slow(cloop, i, self._slow_owner, self._data, self._len)
            owner = self._slow_owner[0]
            request = ffi.unpack(self._data[0], self._len[0])
            found.append((ffi.from_handle(owner) if owner != ffi.NULL else None, request, usec))
        return found

    def reset_batch(self) -> None:
        lib.nl_batch_reset(self.cloop)
        self.resolved.clear()

    def drop_unflushed(self) -> tuple[int, list[Any]]:
        """No reply of the batch leaves; those clients are closed. Returns
        how many were closed and their connections' owners."""
        cloop = self.cloop
        closed = lib.nl_drop_unflushed(cloop)
        owners = lib.nl_batch_owners(cloop, self._owners_n)
        return closed, [ffi.from_handle(owners[i]) for i in range(self._owners_n[0])]


class CConnection:
    """One socket of a CLoop (nl_conn): C reads it, runs the lane on it and
    writes its output; owner hears when it closes or its output passes
    the water mark."""

    __slots__ = ("_conn", "_handle", "_read_us")

    def __init__(self, loop: CLoop, fd: int, owner: ConnectionUser) -> None:
        self._read_us = loop.read_us
        self._handle = ffi.new_handle(owner)
        self._conn: Any = lib.nl_conn_new(loop.cloop, fd, self._handle)
        if self._conn == ffi.NULL:
            raise OSError(errno.ENOMEM, "the C loop refused the connection")

    def write(self, data: bytes) -> None:
        lib.nl_conn_write(self._conn, data, len(data))

    def pending(self) -> int:
        """Output bytes not written yet."""
        return lib.nl_conn_pending(self._conn)

    def set_water(self, high: int) -> None:
        lib.nl_conn_set_water(self._conn, high)

    def pause_reading(self, paused: bool) -> None:
        lib.nl_conn_pause_reading(self._conn, int(paused))

    def close(self, abort: bool) -> None:
        """Close once the output is written (abort: at once)."""
        lib.nl_conn_close(self._conn, int(abort))

    def carry(self, held: bytes) -> bool:
        """Hand C the start of an unfinished request; False if it refused."""
        return not lib.nl_conn_carry(self._conn, held, len(held))

    def set_lane(self, ok: bool, output_mark: int, carry_limit: int) -> None:
        """Whether the lane may run the next read, the output mark past
        which it stops, and the most bytes of one request C holds."""
        lib.nl_conn_set_lane(self._conn, ok, output_mark, carry_limit)

    def carried(self) -> int:
        """Bytes of an unfinished request C holds."""
        return lib.nl_conn_carried(self._conn)

    def activity(self) -> tuple[int, int]:
        """(the lane's last command here: 0 none, 1 TWRITE, 2 TREAD; the
        time of its last read in unix microseconds)."""
        read_us = self._read_us
        last = lib.nl_conn_activity(self._conn, read_us)
        return last, read_us[0]

    def free(self) -> None:
        lib.nl_conn_free(self._conn)


# -- the C loop's callbacks ------------------------------------------------------


@ffi.def_extern()
def nl_resolve_key(
    cloop: Any, key: Any, key_len: int, stream_out: Any, group_out: Any, limit_out: Any
) -> int:
    """nl_resolve_fn: may the lane read / write the stream (or the
    acknowledged group) at key? Asks the loop's owner; notes the key in the
    loop's resolved list, in C's order."""
    loop = ffi.from_handle(lib.nl_loop_owner(cloop))
    if not loop.open:
        return 0
    name = ffi.unpack(key, key_len)
    answer = loop.owner.resolve(name)
    return give_answer(loop.resolved, name, answer, stream_out, group_out, limit_out)


@ffi.def_extern()
def nl_on_data(cloop: Any, owner: Any, data: Any, size: int) -> None:
    """Bytes the lane did not run: the general path's, in order."""
    loop = ffi.from_handle(lib.nl_loop_owner(cloop))
    if loop.open:
        loop.owner.on_data(ffi.from_handle(owner), ffi.unpack(data, size))


@ffi.def_extern()
def nl_on_closed(owner: Any, err: int) -> None:
    ffi.from_handle(owner).on_closed(err)


@ffi.def_extern()
def nl_on_water(owner: Any, over: int) -> None:
    ffi.from_handle(owner).on_water(over)


__all__ = ["CConnection", "CLoop", "ConnectionUser", "LoopUser"]
