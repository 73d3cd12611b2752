"""The one database: key -> Stream | bytes, with expiry, WATCH marks and
the memory each key is charged (maxmemory, INFO memory, MEMORY USAGE).

Every structural change goes through Keyspace's methods, so that WATCH,
blocked readers (rcp11/blocking.py) and persistence see it. The keyspace
sits below the server state that holds it (rcp11/state.py's ServerState)
and states what it asks of it as Protocols of its own: KeyspaceOwner, and
Watcher for a client that WATCHes keys (ClientState).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any, Protocol

from rcp11.blocking import BlockingManager


class KeyRemovals(Protocol):
    """Persistence, as the keyspace tells it of a key gone (state.py's
    PersistenceHooks is one): a deleted stream's offset reservations go."""

    def on_keys_removed(self, keys: Sequence[bytes]) -> None:
        """keys were deleted, renamed away or replaced (one call for the
        many keys of one DEL or TCONCAT)."""


class KeyspaceOwner(Protocol):
    """What the keyspace asks of the server state that holds it (state.py's
    ServerState): whether the files are loading (nothing expires then),
    the persistence to tell of removed keys, and where an expiry is counted
    (stats.expired_keys) and logged (propagate a DEL; dirty)."""

    persistence: KeyRemovals
    loading: bool
    pause: Any  # rcp11/pause.py's ClientPause: while writes_paused, nothing expires
    stats: Any  # its expired_keys counts expiries (INFO stats)
    dirty: int

    def propagate(self, argv: list[bytes], append_ms: int | None = None) -> None:
        """Log a change (an expiry's DEL) as a command would."""


class Watcher(Protocol):
    """A client that WATCHes keys (state.py's ClientState): a change to one
    of them makes its EXEC fail."""

    dirty_cas: bool


class Keyspace:
    """The one database: key -> Stream | bytes.

    Every structural change goes through these methods so WATCH and
    persistence see it: touch() marks watching clients dirty, removals notify
    persistence (offset reservations of a deleted stream must be dropped).
    """

    # Bytes charged per key beyond its value (dict slot, key object,
    # bookkeeping): an estimate, so maxmemory and MEMORY USAGE grow with the
    # number of keys and not only with their payload.
    KEY_OVERHEAD = 64

    def __init__(self, state: KeyspaceOwner, blocking: BlockingManager) -> None:
        self._state = state
        # Every write touches its key: readers blocked on it are re-checked.
        self._blocking = blocking
        self.data: dict[bytes, Any] = {}
        self.watchers: dict[bytes, set[Watcher]] = {}
        # Expiry: key -> deadline in unix milliseconds. Keys expire lazily
        # when read and actively through expire_due() from the server cron;
        # the heap may hold stale entries, checked against `expires`.
        self.expires: dict[bytes, int] = {}
        self._expire_heap: list[tuple[int, bytes]] = []
        # Memory accounting for maxmemory and INFO memory, kept up to date
        # on every change instead of summed over all keys per command.
        # _stream_bytes remembers what each stream was charged. A written
        # stream is only noted in _unmeasured by touch(); it is re-measured
        # (a C call) when used_bytes is next read, so a run of writes costs
        # one measurement, and none at all while nobody asks (no maxmemory).
        self._used_bytes = 0
        self._stream_bytes: dict[bytes, int] = {}
        self._unmeasured: dict[bytes, None] = {}
        # Bumped by every change (touch() and set_expire()): dispatch compares
        # it around a handler that raised (see commands.core.call).
        self.changes = 0
        # The part of `changes` that expiries made: a key a handler found
        # expired is deleted and logged (DEL) by the keyspace, not by the
        # handler, so a handler that then refuses the command changed nothing.
        self.expiry_changes = 0
        self.expiry_logged = 0  # the part of state.dirty those DELs made
        # Keys touched since the streams-oldest index last looked (None:
        # nobody keeps one). rcp11/retention.py's OldestIndex turns it on.
        self.changed: dict[bytes, None] | None = None

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, key: bytes) -> bool:
        if self.expires and key in self.expires and self._expire_if_due(key):
            return False
        return key in self.data

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.data)

    def get(self, key: bytes) -> Any:
        if self.expires and key in self.expires and self._expire_if_due(key):
            return None
        return self.data.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[Any]:
        """get() of each key, in order (None for a missing one)."""
        hidden = self._expire_among(keys) if self.expires else None
        values = list(map(self.data.get, keys))
        if hidden:
            values = [None if key in hidden else v for key, v in zip(keys, values, strict=True)]
        return values

    def _expire_among(self, keys: Sequence[bytes]) -> set[bytes]:
        """What get() and `in` do first for each of keys that has a deadline,
        in order: expire it if due. Returns the keys past their deadline
        but kept (CLIENT PAUSE), which read as missing. Only the keys with
        a deadline cost Python code."""
        due = self._expire_if_due
        return {key for key in filter(self.expires.__contains__, keys) if due(key)}

    @property
    def used_bytes(self) -> int:
        if self._unmeasured:
            self._measure()
        return self._used_bytes

    def _measure(self) -> None:
        # Run before every command that may grow memory while maxmemory is
        # set (core.write_refusal): _charge() written out for a stream, the
        # only kind touch() leaves unmeasured.
        charges = self._stream_bytes
        data = self.data
        used = self._used_bytes
        overhead = self.KEY_OVERHEAD
        for key in self._unmeasured:
            now = data[key].memory_bytes + len(key) + overhead
            used += now - charges[key]
            charges[key] = now
        self._used_bytes = used
        self._unmeasured.clear()

    def touch(self, key: bytes, signal_watchers: bool = True) -> None:
        """key changed (every write calls this, directly or through set,
        delete and rename): WATCHers see it, readers blocked on it (or on it
        as their group key, unless signal_watchers is False: see
        BlockingManager.signal_key) are re-checked after the command, and a
        stream is re-measured when memory is next read."""
        # Called by every write, so it does no C call, and the WATCH and
        # blocking lookups are skipped while nobody watches or waits.
        self.changes += 1
        if key in self._stream_bytes:
            self._unmeasured[key] = None
        if self.changed is not None:
            self.changed[key] = None
        if self.watchers:
            watchers = self.watchers.get(key)
            if watchers:
                for client in watchers:
                    client.dirty_cas = True
        if self._blocking.waiting:
            self._blocking.signal_key(key, signal_watchers)

    def set(
        self, key: bytes, value: Any, keep_ttl: bool = False, signal_watchers: bool = True
    ) -> None:
        """Store value under key; like Redis's SET it drops the key's expiry
        unless keep_ttl. signal_watchers: as for touch()."""
        old = self.data.get(key)
        if old is not None:
            self._uncharge(key, old)
            if old is not value and not isinstance(old, bytes):
                self._state.persistence.on_keys_removed((key,))
        if not keep_ttl and self.expires:
            self.expires.pop(key, None)
        self.data[key] = value
        charged = self._charge(key, value)
        self._used_bytes += charged
        if not isinstance(value, bytes):
            self._stream_bytes[key] = charged
        self.touch(key, signal_watchers)

    def touch_many(self, keys: Sequence[bytes]) -> None:
        """touch() of every key, in order, in one call (a command naming
        many keys)."""
        charged = self._stream_bytes
        if charged:
            self._unmeasured.update(dict.fromkeys(filter(charged.__contains__, keys)))
        self._signal_many(keys)

    def _signal_many(self, keys: Sequence[bytes]) -> None:
        # touch() but for the re-measuring, for many keys: only the keys
        # someone watches or waits on cost Python code (filter() finds them).
        self.changes += len(keys)
        if self.changed is not None:
            self.changed.update(dict.fromkeys(keys))
        watching = self.watchers
        if watching:
            for key in filter(watching.__contains__, keys):
                for client in watching[key]:
                    client.dirty_cas = True
        if self._blocking.waiting:
            self._blocking.signal_keys(keys)

    def delete(self, key: bytes) -> bool:
        if key not in self.data:
            return False
        self.remove_existing((key,))
        return True

    def delete_many(self, keys: Sequence[bytes]) -> int:
        """DEL: delete those of keys that exist; returns how many. A key
        past its deadline expires first, as `key in keyspace` would, and is
        not counted; a key named twice is deleted once."""
        if self.expires:
            hidden = self._expire_among(keys)
            if hidden:
                keys = [key for key in keys if key not in hidden]
        data = self.data
        before = len(data)
        # map(), not a loop: a DEL may name a million keys. A pop that finds
        # nothing (a missing key, or one named again) yields None, which no
        # value is.
        values = list(map(data.pop, keys, repeat(None)))
        removed = before - len(data)
        if removed < len(values):
            keys = [key for key, value in zip(keys, values, strict=True) if value is not None]
            values = [value for value in values if value is not None]
        if removed:
            self._removed(keys, values)
        return removed

    def remove_existing(self, keys: Sequence[bytes]) -> None:
        """Delete keys, each present and named once, as delete() of each in
        turn would, with the per-key bookkeeping in tight loops: a command
        may name a million keys (DEL, TCONCAT's sources, FLUSHALL)."""
        self._removed(keys, list(map(self.data.pop, keys)))

    def _removed(self, keys: Sequence[bytes], values: list[Any]) -> None:
        # keys (values) just left `data`: _uncharge() of each, then the
        # expiries, persistence and touch() that delete() does. The loops
        # are map() and filter() where they can be: no Python code per key.
        charges = self._stream_bytes
        # Exactly the keys of values that are not strings are charged there.
        streams = list(filter(charges.__contains__, keys)) if charges else []
        freed = sum(map(charges.pop, streams))
        if self._unmeasured:
            # Their pending re-measurement goes with them (list(map()) runs
            # the pops without Python code per key).
            list(map(self._unmeasured.pop, streams, repeat(None)))
        if not streams:
            freed += sum(map(len, keys)) + sum(map(len, values)) + len(keys) * self.KEY_OVERHEAD
        elif len(streams) < len(keys):
            pairs = zip(keys, values, strict=True)
            freed += sum(self._charge(k, v) for k, v in pairs if isinstance(v, bytes))
        self._used_bytes -= freed
        if self.expires:
            list(map(self.expires.pop, keys, repeat(None)))
        self._state.persistence.on_keys_removed(keys)
        # No key is charged any more: nothing to re-measure.
        self._signal_many(keys)

    def rename(self, src: bytes, dst: bytes) -> None:
        when = self.expires.pop(src, None)
        value = self.data.pop(src)
        self._uncharge(src, value)
        self._state.persistence.on_keys_removed((src,))
        self.touch(src)
        self.set(dst, value)
        if when is not None:
            self.set_expire(dst, when)

    def _charge(self, key: bytes, value: Any) -> int:
        size = len(value) if isinstance(value, bytes) else value.memory_bytes
        return size + len(key) + self.KEY_OVERHEAD

    def _uncharge(self, key: bytes, value: Any) -> None:
        if isinstance(value, bytes):
            self._used_bytes -= self._charge(key, value)
        else:
            # What it was charged last, measured or not: the pending
            # re-measurement is dropped with it.
            self._used_bytes -= self._stream_bytes.pop(key, 0)
            self._unmeasured.pop(key, None)

    def set_expire(self, key: bytes, when_ms: int) -> None:
        """Make an existing key expire at when_ms (unix milliseconds)."""
        self.changes += 1
        self.expires[key] = when_ms
        heapq.heappush(self._expire_heap, (when_ms, key))
        if len(self._expire_heap) > 2 * len(self.expires) + 64:
            self._expire_heap = [(w, k) for k, w in self.expires.items()]
            heapq.heapify(self._expire_heap)

    def _expire_if_due(self, key: bytes) -> bool:
        """Whether key is past its deadline but kept: while writes are
        paused (CLIENT PAUSE) it reads as missing, as in redis-server 7.0,
        and is deleted once the pause ends. Otherwise a key past its
        deadline is deleted now."""
        # While the files load nothing expires (as in redis-server): the
        # commands logged after a deadline ran on the live key, so replay
        # must find it; it expires once loading is over.
        if self.expires[key] <= time.time() * 1000 and not self._state.loading:
            if self._state.pause.writes_paused:
                return True
            self._expire(key)
        return False

    def _expire(self, key: bytes) -> None:
        before = self.changes
        self.delete(key)
        self.expiry_changes += self.changes - before
        self._state.stats.expired_keys += 1
        dirty = self._state.dirty
        self._state.propagate([b"DEL", key])
        self.expiry_logged += self._state.dirty - dirty

    def expire_due(self, now_ms: float | None = None, limit: int = 1000) -> int:
        """Delete up to `limit` keys whose deadline passed (server cron).
        Returns how many expired."""
        if self._state.loading or self._state.pause.writes_paused:
            return 0
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        heap = self._expire_heap
        expired = 0
        while heap and heap[0][0] <= now_ms and expired < limit:
            when, key = heapq.heappop(heap)
            if self.expires.get(key) == when:
                self._expire(key)
                expired += 1
        return expired

    def flush(self) -> None:
        self.remove_existing(list(self.data))
