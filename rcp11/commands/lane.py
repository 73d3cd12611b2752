"""The C lane's Python side (src/lane.c): the hot stream commands run
straight from a connection's read, in front of run_pipeline().

    consumed, out_bytes = run_lane(state, client, parser, data, out, out_bytes, mark)

The connection calls this first with every read that starts at a request
boundary; the lane runs TWRITE (both forms) and TREAD without GROUP in C,
appends their replies to `out`, and returns how many bytes of `data` it
consumed. The connection's parser and run_pipeline() take the rest.
A `TREAD ... BLOCK ms` runs in the lane only when it answers at once (its
start offset is below the stream's next offset: then the general path
neither waits nor counts anything a plain read does not); one that would
wait stops the lane, and run_pipeline() blocks the client as before.

Here is decided, once per read, what no request of the read can change:
the lane runs nothing during loading, inside MULTI, with MONITOR clients,
with rename-command, for an unauthenticated client or a RESP3 one, while
blocked clients wait to be served or under CLIENT PAUSE ALL; and no TWRITE
while writes are refused (MISCONF) or paused (CLIENT PAUSE WRITE), nor,
with maxmemory, past what the memory left allows (the lane adds up what
its writes grow and stops before the one the general path would refuse). What the parser holds runs here too (run_buffered), and so
do the TWRITEs and TREADs EXEC runs (run_queued). Per key, the resolver below decides (a missing key, a string, a
TTL stop the lane; a waiter or a WATCH stops writes). Afterwards the
counters the general path keeps are brought up to date, the AOF gets the
TWRITE requests verbatim, and written keys are touched.

Every request the lane runs is one the general path would have run the same
way: tests/test_dispatch_lane.py checks it on random pipelines.
"""

from __future__ import annotations

import logging
from typing import Any

import hiredis

from rcp11 import errors
from rcp11.commands.core import command_stats, requirepass_set
from rcp11.commands.diagnostics import note_slow
from rcp11.commands.table import RENAMED, lookup_original
from rcp11.limits import LANE_MAX_CARRY, LANE_RUN_REPLY_BYTES
from rcp11.pause import ALL
from rcp11.resp import RequestParser
from rcp11.state import ClientState, ServerState
from rcp11.storage import MUTATIONS, Stream
from rcp11.storage.ackgroups import AckGroup
from rcp11.storage.lane import (
    ANY_SIZE,
    FIXED_TIME,
    KEY_READ,
    KEY_WRITE,
    LOG_WRITES,
    MEMORY_ROOM,
    WRITES,
    Answer,
    LaneCall,
)

log = logging.getLogger("rcp11")

_NO_ANSWER: Answer = (0, None, 0)
# EXEC's queued requests: every argument passed the parser's limits already.
_NO_LIMITS = (ANY_SIZE, ANY_SIZE)
_READ_ONLY = KEY_READ
_READ_WRITE = KEY_READ | KEY_WRITE

# A read smaller than this is not worth the lane's fixed cost (one cffi
# call and the checks): it cannot hold a whole TWRITE.
_MIN_READ = 16


def resolve_key(state: ServerState, name: bytes, groups: bool) -> Answer:
    """What the lane may do with the stream or acknowledged group at key
    name: (LANE_KEY_* bits, 0: nothing; the stream or group; the highest
    next offset a write may reach). The resolver of the state's LaneCall;
    the C lane's event loop (rcp11/server/netloop.py) asks it too, with
    groups False: it leaves acknowledged groups to the general path."""
    keyspace = state.keyspace
    value = keyspace.data.get(name)
    kind = type(value)
    if (kind is not Stream and (kind is not AckGroup or not groups)) or name in keyspace.expires:
        return _NO_ANSWER
    writable = not keyspace.watchers.get(name) and not state.blocking.involves(name)
    if kind is AckGroup:
        return (_READ_WRITE if writable else _READ_ONLY), value, 0
    if not writable:
        return _READ_ONLY, value, 0
    limit = state.persistence.reserved_next_offset(name)
    if limit < 0:
        return _READ_ONLY, value, 0
    return _READ_WRITE, value, limit


def lane_open(state: ServerState, client: ClientState, in_exec: bool = False) -> bool:
    """Whether the lane may run anything for client now. in_exec: for the
    transaction EXEC is running, whose woken readers are served after it
    anyway (between the commands of a read, they must be served first)."""
    return lane_open_to_all(state, in_exec) and lane_open_to(state, client)


def lane_open_to_all(state: ServerState, in_exec: bool = False) -> bool:
    """lane_open()'s part that holds for every client alike."""
    return not (
        state.loading
        or state.monitors
        or RENAMED
        or (state.blocking.ready and not in_exec)
        or state.pause.mode == ALL
    )


def lane_open_to(state: ServerState, client: ClientState) -> bool:
    """lane_open()'s part that is the client's own (it changes only with
    the client's own commands)."""
    return not (
        client.queued is not None
        or client.resp != 2
        or (not client.authenticated and requirepass_set(state))
    )


def lane_writes(state: ServerState) -> tuple[int, int, int]:
    """lane_run()'s write flags, AOF room and memory room for what no
    request of one read (or one batch of the C loop) changes: no TWRITE
    while writes are refused (MISCONF); with maxmemory, no TWRITE past what
    the memory left allows (the lane adds up what its writes grow and stops
    before the one the general path's OOM check, core.write_refusal, would
    refuse)."""
    persistence = state.persistence
    if state.writes_refused or persistence.write_refused() or state.pause.writes_paused:
        return 0, 0, 0
    flags = WRITES
    room = 0
    memory_room = 0
    if persistence.aof_state != "off":
        flags |= LOG_WRITES
        room = persistence.aof_room()
    limit = state.config.get("maxmemory")
    if limit:
        flags |= MEMORY_ROOM
        memory_room = int(limit) - state.used_memory()
    return flags, room, memory_room


# How many queued commands EXEC hands to the lane at most per call: a
# window that the lane stops early in is joined again from there, so it is
# kept short.
EXEC_WINDOW = 256


def run_queued(
    state: ServerState, client: ClientState, data: bytes, mark: int | None
) -> tuple[int, bytes]:
    """EXEC's share of the lane: run what the lane can of these queued
    TWRITEs and TREADs (data: their requests, encoded), from the first,
    inside the transaction being run (their append time is the
    transaction's, the AOF gets them between its MULTI and EXEC), stopping
    once their replies passed mark bytes (None: no mark). Returns how many
    ran and their replies; the general path runs the rest."""
    flags = FIXED_TIME
    room = 0
    if not (state.writes_refused or state.persistence.write_refused()):
        flags |= WRITES
        if state.persistence.aof_state != "off":
            flags |= LOG_WRITES
            room = state.persistence.aof_room()
    lane = state.lane
    reply_mark = ANY_SIZE if mark is None else max(mark, 0)
    # Every queued argument was within the parser's limits when it was parsed.
    consumed = lane.run(resolve_key, state, data, 0, reply_mark, flags, room, 0,
                        state.write_time(), _NO_LIMITS, state.slow_usec)  # fmt: skip
    if not consumed:
        return 0, b""
    _account(state, client, lane, data, 0)
    counts = lane.counts
    return counts.twrite_calls + counts.tread_calls, lane.take_reply()


def run_lane(
    state: ServerState,
    client: ClientState,
    parser: RequestParser,
    data: bytes,
    out: list[bytes],
    out_bytes: int,
    mark: int,
) -> tuple[int, int]:
    """Run what the lane can of data (a read) for client, whose requests
    `parser` reads (the lane runs when it holds nothing, or only the start
    of a request, and within its limits; it then consumes those bytes from
    the parser), appending the replies to out (out_bytes: what
    out holds; mark: as for run_pipeline). Returns (bytes of data
    consumed, out_bytes now)."""
    if (
        type(data) is not bytes
        or out_bytes > mark
        or parser.unauthenticated
        or not lane_open(state, client)
    ):
        return 0, out_bytes
    carried = b""
    if not parser.idle():
        # A request split across reads: its start, buffered, is read again
        # with this read (a pipeline streamed in big reads would otherwise
        # never reach the lane after its first split request).
        unparsed = parser.unparsed(LANE_MAX_CARRY)
        if unparsed is None:
            return 0, out_bytes
        carried = unparsed
        data = carried + data
    if len(data) < _MIN_READ or len(data) > parser.query_buffer_limit > 0:
        return 0, out_bytes  # too small to hold a TWRITE; or the parser refuses it
    consumed = _run(state, client, parser, data, 0, mark - out_bytes)
    if not consumed:
        return 0, out_bytes
    reply = state.lane.take_reply()
    out.append(reply)
    out_bytes += len(reply)
    if consumed < len(carried):  # requests the parser held whole, not this read
        parser.skip(consumed)
        return 0, out_bytes
    if carried:
        parser.skip(len(carried))
    return consumed - len(carried), out_bytes


def run_buffered(
    state: ServerState,
    client: ClientState,
    parser: RequestParser,
    out: list[bytes],
    out_bytes: int,
    mark: int,
) -> tuple[int, int]:
    """Run what the lane can of the requests `parser` holds unparsed (the
    rest of a read the lane stopped in for its budget, or a pipeline that
    waited for its turn), in place, as run_lane() runs a read; the parser
    drops what ran. Returns (bytes consumed, out_bytes now)."""
    if out_bytes > mark or parser.unauthenticated or not lane_open(state, client):
        return 0, out_bytes
    buffered = parser.raw()
    if buffered is None:
        return 0, out_bytes
    buf, start = buffered
    size = len(buf) - start
    if size < _MIN_READ:
        return 0, out_bytes
    consumed = _run(state, client, parser, buf, start, mark - out_bytes)
    if not consumed:
        return 0, out_bytes
    reply = state.lane.take_reply()
    out.append(reply)
    parser.skip(consumed)
    return consumed, out_bytes + len(reply)


def _run(
    state: ServerState,
    client: ClientState,
    parser: RequestParser,
    data: bytes,
    start: int,
    budget: int,
) -> int:
    """lane_run() over data[start:] (in place) with the parser's limits,
    what MISCONF, the AOF and maxmemory allow, and budget bytes of reply
    (at most LANE_RUN_REPLY_BYTES: the caller reads the clock between
    runs); accounts for what ran. Returns the bytes consumed."""
    flags, room, memory_room = lane_writes(state)
    # A pinned append time (tests pin it; a transaction pins it for its
    # EXEC) holds in the lane as on the general path.
    fixed_ms = state.append_ms
    if fixed_ms is not None:
        flags |= FIXED_TIME
    budget = min(budget, LANE_RUN_REPLY_BYTES)
    lane = state.lane
    consumed = lane.run(resolve_key, state, data, start, budget, flags, room, memory_room,
                        fixed_ms, (parser.max_bulk_len, parser.max_multibulk_len),
                        state.slow_usec)  # fmt: skip
    if consumed or lane.counts.group_changes:
        # (A run may change a group and consume nothing: a lease read out
        # of memory after its ACK, logged, then run again by the caller.)
        _account(state, client, lane, data, start)
    return consumed


def note_lane_slow(state: ServerState, client: ClientState, request: bytes, usec: int) -> None:
    """A slow command the lane ran, noted as call() notes one (its request
    is canonical RESP: hiredis reads it back into arguments)."""
    reader = hiredis.Reader()
    reader.feed(request)
    argv = reader.gets()
    note_slow(state, client, lookup_original(argv[0]), argv, usec)


def _account(
    state: ServerState, client: ClientState, lane: LaneCall, data: bytes, start: int
) -> None:
    """What call() and the handlers would have done for the requests the
    lane ran over data[start:]: log, touch, count, note the slow ones."""
    counts = lane.counts
    group_changes = counts.group_changes
    if counts.twrite_calls + group_changes:
        written, aof = lane.changes()
        count_lane(state, counts, written, aof, group_changes)
    else:
        count_lane(state, counts, [], [], 0)
    client.last_command = "twrite" if counts.last_command == 1 else "tread"
    if counts.nslow:
        for at, size, usec in lane.slow():
            note_lane_slow(state, client, data[start + at : start + at + size], usec)


def count_lane(
    state: ServerState,
    counts: Any,
    written: list[tuple[bytes, Any]],
    aof: list[tuple[int | None, bytes]],
    group_changes: int = 0,
) -> None:
    """Bring the server's state up to date with requests the C lane ran:
    counts (a lane_call or nl_counts: calls, microseconds and messages of
    TWRITE and TREAD), the keys written (key, Stream or AckGroup), the AOF
    bytes as (append time in unix ms or None, requests verbatim) runs, and
    the changes of lease reads and TACKs to acknowledged groups."""
    writes = counts.twrite_calls
    changes = writes + group_changes
    stats = state.stats
    if changes:
        keyspace = state.keyspace
        for name, value in written:
            if type(value) is Stream:
                value.written_in_c()
            keyspace.touch(name)
        MUTATIONS.ticks += changes
        state.dirty += changes
        if aof:
            try:
                for ms, data in aof:
                    state.propagate_encoded(data, ms)
            except Exception:
                # Changed, but how much of it is logged is unknown: as
                # call() does when it cannot log a change, refuse every
                # write from now on.
                log.exception("%d changes of the C lane ran but could not be logged", changes)
                state.writes_refused = errors.UNLOGGED_CHANGE
    if writes:
        row = stats.commands.get("twrite") or command_stats(state, "twrite")
        row[0] += writes
        row[1] += counts.twrite_usec
        stats.total_messages_written += counts.messages_written
        stats.total_messages_evicted += counts.messages_evicted
    reads = counts.tread_calls
    if reads:
        row = stats.commands.get("tread") or command_stats(state, "tread")
        row[0] += reads
        row[1] += counts.tread_usec
        stats.total_messages_read += counts.messages_read
    stats.total_commands_processed += writes + reads


__all__ = [
    "EXEC_WINDOW",
    "count_lane",
    "lane_open",
    "lane_open_to",
    "lane_open_to_all",
    "lane_writes",
    "note_lane_slow",
    "resolve_key",
    "run_buffered",
    "run_lane",
    "run_queued",
]
