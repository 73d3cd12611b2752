"""The binding of src/lane.c: :class:`LaneCall`, one lane_call (its
buffers, the limits it was last given) owned by one server's state.

The lane asks about each key it meets, once per run, through the resolver
its caller passes to :meth:`LaneCall.run` (rcp11/commands/lane.py's):

    resolve(context, key, groups) -> (LANE_KEY_* bits, Stream | AckGroup | None, write limit)

(0 bits: the lane stops before the request; groups: acknowledged groups may
be answered). Here the answer is handed to C, and the keys are kept in the
order C asked about them, so that :meth:`LaneCall.written` can say which
ones the run changed. The C callback finds its LaneCall through the call's
owner field (a cffi handle): two servers in one process, on two threads,
each run their own lane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rcp11.storage.ackgroups import AckGroup
from rcp11.storage.binding import UINT64_MAX, ffi, lib

KEY_READ: int = lib.LANE_KEY_READ
KEY_WRITE: int = lib.LANE_KEY_WRITE
# lane_run()'s flags.
WRITES: int = lib.LANE_WRITES
LOG_WRITES: int = lib.LANE_LOG_WRITES
MEMORY_ROOM: int = lib.LANE_MEMORY_ROOM
FIXED_TIME: int = lib.LANE_FIXED_TIME
# No limit of its own (a parser limit, a reply mark): lengths and replies
# bounded elsewhere.
ANY_SIZE = 2**62
# A buffer of the call is kept from run to run up to this size; past it (a
# transaction's 256 replies of 1 MB, a 100 MB TWRITE) it is freed once the
# run is over, so its peak does not stay in used_memory, which maxmemory is
# held against.
KEEP_BYTES = 8 * 1024 * 1024

# (allowed LANE_KEY_* bits, the stream or group, the highest next offset a
# write may reach)
Answer = tuple[int, Any, int]
Resolver = Callable[[Any, bytes, bool], Answer]


class LaneCall:
    """One lane_call of one server: lane_run() on reads (or a transaction's
    queued requests), and what the last run did."""

    __slots__ = (
        "_call",
        "_context",
        "_handle",
        "_limits",
        "_resolve",
        "_slow_usec",
        "counts",
        "resolved",
    )

    def __init__(self, max_commands: int) -> None:
        call = ffi.new("lane_call *")
        lib.lane_call_init(call)
        call = ffi.gc(call, lib.lane_call_free)
        self._handle = ffi.new_handle(self)
        call.owner = self._handle
        call.resolve = lib.lane_resolve_key
        call.max_commands = max_commands
        self._call = call
        # The call's counters and outputs of the last run (twrite_calls,
        # tread_calls, last_command, ...), read as fields.
        self.counts: Any = call
        # The parser limits (max_bulk_len, max_multibulk_len) and the slow
        # threshold the call was last given: setting a cdata field costs as
        # much as a dict lookup or two, and they change only with CONFIG SET.
        self._limits = (-1, -1)
        self._slow_usec = -1
        # While lane_run() runs: the resolver and what it is given.
        self._resolve: Resolver | None = None
        self._context: Any = None
        # (key, value or None) in the order of the call's keys.
        self.resolved: list[tuple[bytes, Any]] = []

    def run(
        self,
        resolve: Resolver,
        context: Any,
        data: bytes,
        start: int,
        budget: int,
        flags: int,
        room: int,
        memory_room: int,
        fixed_ms: int | None,
        limits: tuple[int, int],
        slow_usec: int,
    ) -> int:
        """lane_run() over data[start:] (in place): budget bytes of reply,
        lane_run()'s flags (fixed_ms: the append time with FIXED_TIME), AOF
        room and memory room, the parser's limits and the slow threshold;
        keys are asked of resolve(context, key, True). Returns the bytes
        consumed."""
        call = self._call
        if limits != self._limits:
            call.max_bulk_len, call.max_multibulk_len = self._limits = limits
        if slow_usec != self._slow_usec:
            call.slow_usec = min(slow_usec, UINT64_MAX)
            self._slow_usec = slow_usec
        if flags & FIXED_TIME:
            call.fixed_ms = fixed_ms
        self._resolve = resolve
        self._context = context
        self.resolved.clear()
        # bytes go to `const char *` as they are, no copy; past their start,
        # through from_buffer, no copy either.
        at = data if not start else ffi.from_buffer(data) + start
        try:
            return lib.lane_run(call, at, len(data) - start, budget, flags, room, memory_room)
        finally:
            self._context = None

    def changes(self) -> tuple[list[tuple[bytes, Any]], list[tuple[int | None, bytes]]]:
        """What the last run changed: the keys it wrote (key, Stream or
        AckGroup: each stream must take up its new next offset,
        Stream.written_in_c()), and its AOF bytes as one (append time in unix
        ms or None, requests verbatim) run, or none. A run of lease reads
        alone logs its TACKs and RCP11.LEASEs undated (append_ms -1: no
        TWRITE ran)."""
        call = self._call
        keys = call.keys
        written = [r for i, r in enumerate(self.resolved) if keys[i].written]
        if not call.aof.len:
            return written, []
        append_ms = call.append_ms if call.append_ms >= 0 else None
        return written, [(append_ms, ffi.unpack(call.aof.data, call.aof.len))]

    def slow(self) -> list[tuple[int, int, int]]:
        """The last run's slow commands: (start, length, microseconds) of
        each request in the data the run was given."""
        call = self._call
        return [(s.start, s.len, s.usec) for s in (call.slow[i] for i in range(call.nslow))]

    def take_reply(self) -> bytes:
        """The replies of the run that just ended; its big buffers freed."""
        call = self._call
        reply = ffi.unpack(call.reply.data, call.reply.len)
        if (
            call.reply.cap > KEEP_BYTES
            or call.aof.cap > KEEP_BYTES
            or call.scratch_entries.cap > KEEP_BYTES
        ):
            lib.lane_call_free(call)  # buffers only: the call stays usable
        return reply


@ffi.def_extern()
def lane_resolve_key(
    call: Any, key: Any, key_len: int, stream_out: Any, group_out: Any, limit_out: Any
) -> int:
    """lane_resolve_fn: may the lane read / write the stream (or the
    acknowledged group) at key? Asks the resolver of the LaneCall running;
    notes the key in its resolved list, in C's order."""
    lane = ffi.from_handle(call.owner)
    name = ffi.unpack(key, key_len)
    answer = lane._resolve(lane._context, name, True)
    return give_answer(lane.resolved, name, answer, stream_out, group_out, limit_out)


def give_answer(
    resolved: list[tuple[bytes, Any]],
    name: bytes,
    answer: Answer,
    stream_out: Any,
    group_out: Any,
    limit_out: Any,
) -> int:
    """A resolver's answer for key name into C's out-parameters (the
    stream and its write limit, or the acknowledged group), noted in
    resolved in C's order; returns its LANE_KEY_* bits (0: none)."""
    allowed, value, limit = answer
    if not allowed:
        resolved.append((name, None))
        return 0
    resolved.append((name, value))
    if type(value) is AckGroup:
        group_out[0] = value._g
    else:
        stream_out[0] = value._s
        limit_out[0] = limit
    return allowed


__all__ = [
    "ANY_SIZE",
    "FIXED_TIME",
    "KEY_READ",
    "KEY_WRITE",
    "LOG_WRITES",
    "MEMORY_ROOM",
    "WRITES",
    "Answer",
    "LaneCall",
    "give_answer",
    "Resolver",
]
