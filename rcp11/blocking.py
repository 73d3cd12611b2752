"""Who waits for what: the registry of clients blocked in `TREAD ... BLOCK`.

A blocked client waits on one stream key. Waiters of a key sit in one FIFO
(an insertion-ordered dict, so a disconnecting client leaves in O(1)). A
request may also watch a second key (a group reader watches its group key),
whose change re-checks it too.

This module only keeps the registry: it knows no command. Every write to
the keyspace signals the key it changed (Keyspace.touch calls signal_key()
while anyone waits), so whatever a command wrote, readers waiting on it are
re-checked; the command layer (rcp11/commands/core.py serve_ready()) then serves the
keys that became ready after the command ran (Redis's call() order: run,
propagate, then wake), each request through request.serve() and the same
checks and write protection as any command. The server cron calls expire()
for timeouts; a disconnect calls remove().

ServerState owns one BlockingManager from its construction: blocking is
always there, so nothing tests whether it is.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rcp11 import errors
from rcp11.resp import NULL_ARRAY, Error


class Waiter(Protocol):
    """What the registry needs of a client: rcp11.state.ClientState is one.
    Stated here so that the registry imports nothing above it (state.py
    owns a BlockingManager)."""

    blocked: Any  # the client's BlockRequest while it waits, else None
    send: Callable[[Any], None]  # queue a reply to the client
    on_unblocked: Callable[[], None]  # resume its pipelined commands


class _Wait:
    __slots__ = ()

    def __repr__(self) -> str:
        return "WAIT"


# What BlockRequest.serve() returns when the request has nothing to answer
# yet: it keeps its place in the queue.
WAIT = _Wait()


@dataclass(eq=False)
class BlockRequest:
    """One blocked command. eq=False: requests are compared by identity, so
    two equal-looking requests of different clients differ.

    Commands that block subclass it and implement serve()."""

    client: Waiter
    key: bytes  # waits in this key's FIFO
    argv: list[bytes]  # the command as the client sent it (original name)
    watch: bytes | None = None  # another key whose change re-checks it
    deadline: float | None = None  # time.monotonic() seconds; None waits forever
    seq: int = -1  # the order of blocking, set by BlockingManager.block()

    def serve(self, state: Any) -> Any:
        """The reply now, or WAIT. May raise CommandError (its text becomes
        the reply) and may write (a group read moves its group key). state
        is the rcp11.state.ServerState; the registry never looks at it."""
        raise NotImplementedError


class BlockingManager:
    """The registry. Public for the command layer: `waiting` (stream key ->
    FIFO of requests; empty when nobody waits, so writers skip signalling),
    `ready` (keys signalled since the last serve), `deadlines`."""

    def __init__(self) -> None:
        self.waiting: dict[bytes, dict[BlockRequest, None]] = {}
        # watched key -> stream keys with requests watching it -> how many,
        # so a SET/DEL of a group key re-checks the readers of that group.
        self._watchers: dict[bytes, dict[bytes, int]] = {}
        self.ready: dict[bytes, None] = {}
        self.deadlines: list[tuple[float, int, BlockRequest]] = []
        # Keys to signal at a moment no write marks (a lease that runs out:
        # its group's blocked readers look again): (monotonic time, seq, key).
        self.key_wakes: list[tuple[float, int, bytes]] = []
        self._soonest_wakes: dict[bytes, float] = {}  # key -> its soonest wake-up
        self._sequence = itertools.count()
        self.blocked_clients = 0

    def __len__(self) -> int:
        return self.blocked_clients

    @property
    def active(self) -> bool:
        """Whether any client waits (lets writers skip signal_key)."""
        return bool(self.waiting)

    def involves(self, key: bytes) -> bool:
        """Whether a write to key must be signalled: someone waits on it,
        or watches it as a group key."""
        return key in self.waiting or key in self._watchers

    def block(self, request: BlockRequest) -> None:
        request.client.blocked = request
        request.seq = next(self._sequence)
        self.waiting.setdefault(request.key, {})[request] = None
        if request.watch is not None:
            streams = self._watchers.setdefault(request.watch, {})
            streams[request.key] = streams.get(request.key, 0) + 1
        if request.deadline is not None:
            heapq.heappush(self.deadlines, (request.deadline, next(self._sequence), request))
        self.blocked_clients += 1

    def signal_key(self, key: bytes) -> None:
        """key changed: its waiters (and those watching it) are checked at
        the next serve."""
        if key in self.waiting:
            self.ready[key] = None
        streams = self._watchers.get(key)
        if streams:
            for stream_key in streams:
                self.ready[stream_key] = None

    def ready_requests(self) -> Iterator[BlockRequest]:
        """The requests to re-check now that keys were signalled, in the
        order they blocked, across keys too (a group may have readers
        waiting on several streams: docs/PROTOCOL.md serves a group's
        readers in the order they blocked). Read lazily: serving one may
        signal more keys. The outcome is that of passes over every blocked
        request in that order until a pass changes nothing: the requests of
        a key signalled during a pass join it if they come later in the
        order, or else the next pass; requests of keys nobody signalled
        cannot have become servable, so they are skipped."""
        this_pass: list[tuple[int, int, BlockRequest]] = []
        next_pass: list[tuple[int, int, BlockRequest]] = []
        tie = itertools.count()  # one request may be queued twice: never compare requests
        cursor = -1
        while True:
            for key in self.ready:
                for request in self.waiting.get(key, ()):
                    heap = this_pass if request.seq > cursor else next_pass
                    heapq.heappush(heap, (request.seq, next(tie), request))
            self.ready.clear()
            if not this_pass:
                if not next_pass:
                    return
                this_pass, next_pass, cursor = next_pass, [], -1
                continue
            seq, _, request = heapq.heappop(this_pass)
            if seq <= cursor:
                continue  # signalled twice: already looked at in this pass
            cursor = seq
            if request.client.blocked is request:
                yield request

    def finish(self, request: BlockRequest, reply: Any) -> None:
        """Answer a request and forget it (the caller resumes the client)."""
        self._forget(request)
        request.client.send(reply)

    def wake_at(self, key: bytes, when: float) -> None:
        """Signal key at `when` (time.monotonic() seconds), whether or not
        anything writes it: expire() does, and then its readers are served.
        A wake-up of the key set for `when` or sooner makes this one moot."""
        soonest = self._soonest_wakes.get(key)
        if soonest is not None and soonest <= when and soonest > time.monotonic():
            return
        self._soonest_wakes[key] = when
        heapq.heappush(self.key_wakes, (when, next(self._sequence), key))

    def expire(self, now: float | None = None) -> None:
        """Answer every client whose BLOCK timeout passed with a null
        array, and signal the keys whose wake-up time came (wake_at; the
        caller then serves the ready keys). now: time.monotonic() seconds."""
        now = time.monotonic() if now is None else now
        wakes = self.key_wakes
        while wakes and wakes[0][0] <= now:
            when, _, key = heapq.heappop(wakes)
            if self._soonest_wakes.get(key) == when:
                del self._soonest_wakes[key]
            self.signal_key(key)
        timed_out: list[Waiter] = []
        heap = self.deadlines
        while heap and heap[0][0] <= now:
            request = heapq.heappop(heap)[2]
            if request.client.blocked is request:
                self.finish(request, NULL_ARRAY)
                timed_out.append(request.client)
        for client in timed_out:
            client.on_unblocked()

    def next_deadline(self) -> float | None:
        """The earliest pending timeout or key wake-up (time.monotonic()
        seconds), for a server that wants to wake exactly then instead of at
        its next tick."""
        heap = self.deadlines
        while heap and heap[0][2].client.blocked is not heap[0][2]:
            heapq.heappop(heap)
        wakes = self.key_wakes
        while wakes and wakes[0][2] not in self.waiting:
            when, _, key = heapq.heappop(wakes)  # nobody waits on that key any more
            if self._soonest_wakes.get(key) == when:
                del self._soonest_wakes[key]
        times = [h[0][0] for h in (heap, wakes) if h]
        return min(times) if times else None

    def unblock(self, client: Waiter, error: bool) -> bool:
        """CLIENT UNBLOCK: end the client's blocked read as a timeout (a
        null reply) or with an -UNBLOCKED error. False if it was not blocked."""
        request = client.blocked
        if not isinstance(request, BlockRequest):
            return False
        self.finish(request, Error(errors.UNBLOCKED) if error else NULL_ARRAY)
        client.on_unblocked()
        return True

    def remove(self, client: Waiter) -> None:
        """The client disconnected: forget it at once, so messages that
        arrive later go to the next waiter."""
        request = client.blocked
        if isinstance(request, BlockRequest):
            self._forget(request)

    def _forget(self, request: BlockRequest) -> None:
        request.client.blocked = None
        self.blocked_clients -= 1
        queue = self.waiting.get(request.key)
        if queue is not None:
            queue.pop(request, None)
            if not queue:
                del self.waiting[request.key]
        if request.watch is not None:
            streams = self._watchers[request.watch]
            streams[request.key] -= 1
            if not streams[request.key]:
                del streams[request.key]
                if not streams:
                    del self._watchers[request.watch]


__all__ = ["WAIT", "BlockRequest", "BlockingManager", "Waiter"]
