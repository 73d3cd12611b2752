"""Retention and the `streams-oldest` memory policy (docs/PROTOCOL.md section 6).

Data leaves a stream without a command asking for it in two ways:

- `stream-retention-ms` / `stream-retention-bytes`: the server cron calls
  Retention.cron(), which walks the streams a few at a time, evicting
  through the core (Stream.evict_older_than, evict_over_bytes): by size
  whole macronodes, by age every message past it (whole macronodes, then
  the expired messages of the first one left: its memory goes with its
  last message).
- `maxmemory-policy streams-oldest`: when used memory is over `maxmemory`,
  evict_for_memory() evicts the oldest macronode of all streams (oldest
  append time first), again and again, until the server fits; the write
  path calls it where it would answer -OOM, and the cron finishes what a
  write left. OldestIndex finds that node in O(log streams): the first
  eviction makes it, and then it follows the keys the keyspace reports
  changed.

Both log what they did as `TEVICT key <offset>` with an absolute offset
(the stream's new first offset - 1) through state.propagate(), as a TEVICT
command would be logged: replaying the AOF cuts each stream at exactly the
same place, whatever the clock says at replay time, and offsets are never
given again (eviction never lowers a stream's next offset).

No client waits on a large expiry: a cron step stops after STEP_SECONDS or
STEP_NODES nodes and, when it was evicting, continues in the next event
loop iteration (call_soon), after the clients that are ready have been
served. Streams are visited in passes: a pass takes the list of keys once
and then resumes where the last step stopped.

The same walk calls Stream.compress_step() for streams whose compression
level or depth changed (CONFIG SET) or that were loaded from disk, so they
reach their form even when no new node is sealed.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

from rcp11.state import ServerState
from rcp11.storage import Evicted, Stream

# Nodes one core call may free. Freeing a node is one free() of its blob
# (a 1,000-message node of 1 KB messages is 1 MB, which glibc returns with
# one munmap): tens of microseconds, so a call stays far below STEP_SECONDS.
NODES_PER_CALL = 32
# What one cron step (or one continuation) may spend before it gives the
# event loop back: the worst extra latency a client sees from retention.
STEP_SECONDS = 0.002
# And at most this many nodes per step, whatever the clock says.
STEP_NODES = 1024
# Nodes one write may evict under streams-oldest before it goes ahead
# anyway (Redis's EVICT_RUNNING): a CONFIG SET maxmemory far below the
# data never stalls one command; the cron evicts the rest.
MEMORY_NODES_PER_WRITE = 1024
# Nodes compress_step() may conform per stream visit (a node is deflated or
# inflated in ~1 ms per MB).
COMPRESS_NODES_PER_CALL = 2

_COMPRESSION_DIRECTIVES = (
    "stream-compression",
    "stream-compression-level",
    "stream-compression-depth",
)


def _is_stream(value: Any) -> bool:
    return isinstance(value, Stream)


class Retention:
    """The cron's retention walker for one server (state.retention)."""

    def __init__(self, state: ServerState, serve_ready: Callable[[], None]) -> None:
        """serve_ready: the command layer's wake-up of readers whose keys
        changed, run after a cron step evicted (start-up wires it)."""
        self.state = state
        self._serve_ready = serve_ready
        # Keys left in the current pass, visited from the end.
        self._keys: list[bytes] = []
        # Loaded streams may need their compression conformed; so do all
        # streams after a compression setting changed.
        self._compress_wanted = True
        self._compress_pass = False
        self._continuation: asyncio.Handle | None = None
        for name in _COMPRESSION_DIRECTIVES:
            state.config.on_change(name, self._compression_changed)

    def _compression_changed(self, _value: Any) -> None:
        self._compress_wanted = True

    # -- the cron ---------------------------------------------------------

    def cron(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """One bounded step from the server cron; when it stopped with
        evictions left, the next step runs in the next loop iteration."""
        if self._continuation is not None:
            return  # a continuation is already on its way
        self._run(loop)

    def _run(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._continuation = None
        if self.step() and loop is not None and not loop.is_closed():
            self._continuation = loop.call_soon(self._run, loop)

    def cancel(self) -> None:
        if self._continuation is not None:
            self._continuation.cancel()
            self._continuation = None

    def step(self, now_ms: int | None = None) -> bool:
        """Evict what retention and the memory policy ask for, within
        STEP_SECONDS and STEP_NODES. now_ms (unix ms) is the clock retention
        by age compares with (default: the wall clock; tests pass their
        own). Returns True when it stopped with evictions left to do."""
        state = self.state
        if state.loading or state.pause.writes_paused:
            return False  # nothing is evicted during CLIENT PAUSE either
        deadline = perf_counter() + STEP_SECONDS
        config = state.config
        age = int(config.get("stream-retention-ms") or 0)
        size = int(config.get("stream-retention-bytes") or 0)
        nodes = 0
        more = False
        runs_before = state.stats.retention_runs
        tend_oldest_index(state)
        limit = memory_limit(state)
        if limit:
            fits, left = evict_oldest(state, limit, STEP_NODES)
            more = not fits and left
            nodes = STEP_NODES if more else 0
        if not self._keys and (age or size or self._compress_wanted) and not more:
            self._start_pass()
        if self._keys and not more:
            if now_ms is None:
                now_ms = time.time_ns() // 1_000_000
            cutoff = now_ms - age if age else None
            more = self._walk(cutoff, size, deadline, nodes)
        if state.stats.retention_runs != runs_before:
            # What the command layer does after a write: wake readers whose
            # keys changed; then hand the AOF records to the kernel now,
            # rather than at the next reply, so a crash in a quiet moment
            # does not bring evicted messages back.
            self._serve_ready()
            state.persistence.flush()
        return more

    def _start_pass(self) -> None:
        # A plain copy of the keys (a C-level copy, ~5 ms for a million
        # keys): strings and keys gone by their visit are skipped then.
        self._keys = list(self.state.keyspace.data)
        self._compress_pass = self._compress_wanted
        self._compress_wanted = False

    def _walk(self, cutoff: int | None, size: int, deadline: float, nodes: int) -> bool:
        """Visit streams of the current pass until the budget is spent.
        True when it stopped in the middle of evicting (so the caller
        continues at once rather than at the next tick)."""
        state = self.state
        data = state.keyspace.data
        keys = self._keys
        total = Evicted()
        while keys:
            if nodes >= STEP_NODES or perf_counter() >= deadline:
                if total.messages:
                    state.stats.retention_runs += 1
                return total.messages > 0
            key = keys[-1]
            stream = data.get(key)
            if stream is None or not _is_stream(stream):
                keys.pop()
                continue
            # Compression stays on a stream until it is done (or the step's
            # time is up: the next tick resumes it).
            done = not (
                self._compress_pass
                and stream.compress_pending
                and stream.compress_step(COMPRESS_NODES_PER_CALL)
            )
            if cutoff is not None or size:
                ev = _evict_by_retention(stream, cutoff, size, STEP_NODES - nodes)
                # By age, messages go inside a node too (no node freed).
                if ev.messages:
                    nodes += ev.nodes
                    total = _add(total, ev)
                    record_eviction(state, key, stream, ev)
                done = done and not ev.more
            if done:
                keys.pop()
        if total.messages:
            state.stats.retention_runs += 1
        return False


def _evict_by_retention(stream: Stream, cutoff: int | None, size: int, budget: int) -> Evicted:
    """At most NODES_PER_CALL (and budget) nodes by age, then by size, for
    one stream; .more when it stopped at that limit with more to evict."""
    budget = min(budget, NODES_PER_CALL)
    ev = Evicted()
    if cutoff is not None:
        ev = stream.evict_older_than(cutoff, budget)
        if ev.more:
            return ev
    if size:
        if ev.nodes >= budget:
            # Out of budget: whether size wants more is for the next visit.
            return Evicted(ev.messages, ev.bytes, ev.nodes, ev.memory, True)
        by_size = stream.evict_over_bytes(size, budget - ev.nodes)
        ev = _add(ev, by_size)
        ev = Evicted(ev.messages, ev.bytes, ev.nodes, ev.memory, by_size.more)
    return ev


def _add(a: Evicted, b: Evicted) -> Evicted:
    return Evicted(
        a.messages + b.messages, a.bytes + b.bytes, a.nodes + b.nodes, a.memory + b.memory, b.more
    )


def record_eviction(state: ServerState, key: bytes, stream: Stream, ev: Evicted) -> None:
    """Account for messages evicted from `key` and log the stream's new cut."""
    state.keyspace.touch(key)
    stats = state.stats
    stats.retention_evicted_messages += ev.messages
    stats.retention_evicted_bytes += ev.bytes
    stats.total_messages_evicted += ev.messages
    # The absolute cut, not "how many": replay must not depend on the clock
    # or on what the stream held then. Something was evicted, so >= 0.
    state.propagate([b"TEVICT", key, b"%d" % (stream.first_offset - 1)])
    state.blocking.signal_key(key)


# -- maxmemory-policy streams-oldest ---------------------------------------


def memory_limit(state: ServerState) -> int:
    """maxmemory when the policy is streams-oldest and the server is over
    it (0 otherwise)."""
    config = state.config
    if config is None or config.get("maxmemory-policy") != "streams-oldest":
        return 0
    limit = int(config.get("maxmemory") or 0)
    return limit if limit and state.used_memory() > limit else 0


def tend_oldest_index(state: ServerState) -> None:
    """From the cron: the streams-oldest index takes in what changed since
    the last tick (so the keys noted for it stay few while the server is
    under maxmemory), or goes once the policy is another."""
    index = state.oldest_index
    if index is None:
        return
    config = state.config
    if config is None or config.get("maxmemory-policy") != "streams-oldest":
        index.close()
        state.oldest_index = None
    else:
        index.sync()


def evict_for_memory(state: ServerState, limit: int) -> bool:
    """The write path's OOM check under streams-oldest: evict until the
    server fits. Whether the write may go ahead: it fits, or eviction is
    still under way (MEMORY_NODES_PER_WRITE reached; the cron goes on).
    False when no stream has anything left to evict and it still does not
    fit: the write is refused with -OOM."""
    fits, left = evict_oldest(state, limit, MEMORY_NODES_PER_WRITE)
    return fits or left


def evict_oldest(state: ServerState, limit: int, max_nodes: int) -> tuple[bool, bool]:
    """Evict the oldest node of all streams (by append time), again, until
    used memory is at most `limit` or max_nodes were evicted. Returns
    (fits, some stream still holds a node)."""
    index = state.oldest_index
    if index is None:
        index = state.oldest_index = OldestIndex(state.keyspace)
    index.sync()
    keyspace = state.keyspace
    data = keyspace.data
    evicted: dict[bytes, Evicted] = {}
    nodes = 0
    fits = state.used_memory() <= limit
    while not fits and nodes < max_nodes:
        key = index.oldest()
        if key is None:
            break
        stream = data[key]
        ev = stream.evict_oldest_node()
        keyspace.touch(key)  # so used_memory() re-measures it
        nodes += 1
        evicted[key] = _add(evicted.get(key, Evicted()), ev)
        index.update(key, stream)
        fits = state.used_memory() <= limit
    for key, ev in evicted.items():
        record_eviction(state, key, data[key], ev)
    if evicted:
        state.stats.retention_runs += 1
    return fits, index.oldest() is not None


class OldestIndex:
    """The streams that hold a message, by the append time of their oldest
    (Stream.oldest_append_ms), for streams-oldest: the oldest node of all
    streams in O(log streams) instead of a look at every key per eviction.

        heap     (oldest_ms, key), smallest first: ties go to the smaller
                 key, as a sort of every stream would give them. Entries go
                 stale (the key's oldest moved, or the key went) and are
                 dropped when they reach the top
        current  key -> the oldest_ms of its live entry (a key whose entry
                 says otherwise is stale)

    The keyspace notes every key it touches (Keyspace.changed: every write,
    eviction, deletion, FLUSHALL goes through touch()); sync() re-reads
    those keys only, so keeping the index costs one dict insertion per
    write and one look per changed key when the policy next evicts.
    """

    def __init__(self, keyspace: Any) -> None:
        self._keyspace = keyspace
        self._current: dict[bytes, int] = {}
        for key, value in keyspace.data.items():
            if _is_stream(value):
                oldest = value.oldest_append_ms
                if oldest is not None:
                    self._current[key] = oldest
        self._heap = [(ms, key) for key, ms in self._current.items()]
        heapq.heapify(self._heap)
        keyspace.changed = {}

    def close(self) -> None:
        """Stop the keyspace noting changes (the policy was turned off)."""
        self._keyspace.changed = None

    def sync(self) -> None:
        """Take in the keys changed since the last sync()."""
        keyspace = self._keyspace
        changed = keyspace.changed
        if not changed:
            return
        keyspace.changed = {}
        data = keyspace.data
        for key in changed:
            value = data.get(key)
            if value is None or not _is_stream(value):
                self._current.pop(key, None)
            else:
                self.update(key, value)

    def update(self, key: bytes, stream: Stream) -> None:
        """key's stream may have another oldest message now."""
        oldest = stream.oldest_append_ms
        if oldest is None:
            self._current.pop(key, None)
        elif self._current.get(key) != oldest:
            self._current[key] = oldest
            heapq.heappush(self._heap, (oldest, key))
            if len(self._heap) > 2 * len(self._current) + 64:
                # Mostly stale entries: rebuild (amortized O(1) per push).
                self._heap = [(ms, k) for k, ms in self._current.items()]
                heapq.heapify(self._heap)

    def oldest(self) -> bytes | None:
        """The key of the stream with the oldest message (None: no stream
        holds one)."""
        heap = self._heap
        current = self._current
        while heap:
            ms, key = heap[0]
            if current.get(key) == ms:
                return key
            heapq.heappop(heap)
        return None
