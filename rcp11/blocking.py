"""Who waits for what: the registry of clients blocked in `TREAD ... BLOCK`,
and the order in which they are served.

Keys and lanes. A blocked request waits on one key, in one *lane* of that
key: the requests of a lane wait for the same thing, so at any moment
either all of them can be served or none can (TREAD: the plain readers of a
stream waiting for the same offset; the readers of one group on one
stream). A lane is a FIFO in the order its requests blocked. Serving a lane
therefore stops at the first request that has to wait: the ones behind it
would wait too. A signal costs the requests it serves plus one check per
lane, not one check per blocked request: 1000 messages for 1000 readers of
a group are 1000 serves; one message for them is one serve and one check.

Ranked lanes. A request may wait for its key to reach a rank (TREAD: the
offset a plain reader reads from; BlockRequest.rank). The ranked lanes of a
key are looked at in rank order and only while their first request says
the key reached them (reached()), so readers waiting far ahead of a
stream's end cost nothing per write.

Watches. A request may also depend on a second key (a group reader on its
group key, BlockRequest.watch): a change of that key signals the lanes that
watch it, not every lane of their stream. The requests of one lane watch
the same key.

Signals and passes. Every write to the keyspace signals the key it changed
(Keyspace.touch calls signal_key() while anyone waits), so whatever a
command wrote, the lanes depending on it are looked at; after the command
(Redis's call() order: run, propagate, then wake) the command layer calls
serve() (rcp11/commands/core.py serve_ready()), which serves requests
through the same checks and write protection as any command. serve() works
in passes: a pass looks at the signalled lanes in the order of their first
requests, which is the order those requests blocked, across keys too (a
group may have readers on several streams: docs/PROTOCOL.md serves a
group's readers in the order they blocked). A lane signalled during a pass
(serving may write) joins it if its first request comes after the current
one, or else the next pass; passes repeat until one is signalled nothing
new. Requests of lanes nobody signalled cannot have become servable, so
they are not looked at.

What must signal, and what need not: anything that can make a waiting
request servable must signal its key or the key it watches. A change that
can only make requests less servable need not: a group read moves its group
forward, which can only make the group's other readers wait longer, so
TREAD moves a group key without signalling the group's readers
(rcp11/commands/tread.py set_group_position()); it still signals readers
waiting on that key itself. Without this, each of 1000 served group reads
re-signalled the 999 others: a million checks for one write.

Time can make waiters servable too: an acknowledged group's lease that
runs out hands its messages out again without the stream growing. A lease
reader that has to wait asks wake_at(group key, deadline); expire() then
signals the group key, and the lanes watching it look at their first
requests. Lease reads and TACK change their group in place without
signalling it (they only take or settle leases: rcp11/commands/groups.py
_store()). A new kind of wait needs its lane: requests that are servable
together, FIFO; one that has to wait stops the lane.

This module knows no command. The server cron calls expire() for timeouts;
a disconnect calls remove(). ServerState owns one BlockingManager from its
construction: blocking is always there, so nothing tests whether it is.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
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
# yet: it keeps its place in its lane.
WAIT = _Wait()


@dataclass(eq=False)
class BlockRequest:
    """One blocked command. eq=False: requests are compared by identity, so
    two equal-looking requests of different clients differ.

    Commands that block subclass it, set `lane` (and `rank` if the lane is
    ranked) and implement serve() (and reached() for a ranked lane)."""

    client: Waiter
    key: bytes  # waits on this key
    argv: list[bytes]  # the command as the client sent it (original name)
    watch: bytes | None = None  # another key whose change re-checks it
    deadline: float | None = None  # time.monotonic() seconds; None waits forever
    # Requests of one key with equal lanes wait for the same thing: all of
    # them can be served, or none (they must watch the same key).
    lane: Hashable = None
    # For a ranked lane: the rank of the key it waits for (reached()).
    # Requests of one key and one rank must share a lane.
    rank: int | None = None
    # Serving it may change a key (a group read moves its group): it is
    # then refused like a write while writes are (MISCONF).
    writes: bool = False
    seq: int = -1  # the order of blocking, set by BlockingManager.block()

    def serve(self, state: Any) -> Any:
        """The reply now, or WAIT. May raise CommandError (its text becomes
        the reply) and may write (a group read moves its group key). state
        is the rcp11.state.ServerState; the registry never looks at it."""
        raise NotImplementedError

    def reached(self, state: Any) -> bool:
        """For a ranked request: whether its key may have reached its rank,
        so that serve() may answer. Changes nothing. Must be monotonic: a
        key that has not reached rank r has not reached any rank above r."""
        return True


class _Lane:
    """The requests of one key waiting for the same thing, in blocking order."""

    __slots__ = ("key", "name", "rank", "requests", "watch")

    def __init__(self, request: BlockRequest) -> None:
        self.key = request.key
        self.name = request.lane
        self.rank = request.rank
        self.watch = request.watch
        # OrderedDict: O(1) first item after many removals from the front,
        # and O(1) removal of any request (timeouts, disconnects).
        self.requests: OrderedDict[BlockRequest, None] = OrderedDict()

    def head(self) -> BlockRequest:
        return next(iter(self.requests))

    def __repr__(self) -> str:
        return f"<lane {self.key!r} {self.name!r}: {len(self.requests)} requests>"


class _KeyLanes:
    """The lanes of one key: unranked ones by name, ranked ones also by rank."""

    __slots__ = ("by_name", "unranked", "ranks", "by_rank")

    def __init__(self) -> None:
        self.by_name: dict[Hashable, _Lane] = {}
        self.unranked: dict[_Lane, None] = {}
        self.ranks: list[int] = []  # sorted
        self.by_rank: dict[int, _Lane] = {}

    def add(self, lane: _Lane) -> None:
        self.by_name[lane.name] = lane
        if lane.rank is None:
            self.unranked[lane] = None
        else:
            if lane.rank in self.by_rank:
                raise ValueError(f"two lanes of rank {lane.rank}: {lane!r}")
            bisect.insort(self.ranks, lane.rank)  # usually at the end: a stream's next offset
            self.by_rank[lane.rank] = lane

    def drop(self, lane: _Lane) -> None:
        del self.by_name[lane.name]
        if lane.rank is None:
            del self.unranked[lane]
        else:
            del self.ranks[bisect.bisect_left(self.ranks, lane.rank)]
            del self.by_rank[lane.rank]

    def signalled(self, state: Any) -> Iterator[_Lane]:
        """The lanes a write to the key may have made servable: every
        unranked one, and the ranked ones up to the first not reached."""
        yield from list(self.unranked)
        for rank in list(self.ranks):
            lane = self.by_rank.get(rank)
            if lane is None or not lane.requests:
                continue  # served meanwhile
            if not lane.head().reached(state):
                return
            yield lane


class _Pass:
    """serve()'s bookkeeping: the lanes of this pass (a heap by the seq of
    their first requests), where it is, and the lanes left for the next."""

    __slots__ = ("heap", "entered", "cursor", "again")

    def __init__(self) -> None:
        self.heap: list[tuple[int, _Lane]] = []
        self.entered: set[_Lane] = set()
        self.cursor = -1  # the seq of the request looked at last
        self.again: dict[_Lane, None] = {}

    def enter(self, lane: _Lane) -> None:
        """lane was signalled. Its first request was looked at already in
        this pass (it waited, or is being served now), or comes before the
        current one: then the next pass looks at the lane again. Otherwise
        it joins this pass, once; the lanes in the heap were not looked at
        since their last signal, so a second signal changes nothing."""
        if not lane.requests:
            return
        seq = lane.head().seq
        if seq <= self.cursor:
            self.again[lane] = None
        elif lane not in self.entered:
            self.entered.add(lane)
            heapq.heappush(self.heap, (seq, lane))

    def next_pass(self) -> bool:
        """Start the next pass with the lanes left for it; False if none."""
        lanes = list(self.again)
        self.heap.clear()
        self.entered.clear()
        self.again.clear()
        self.cursor = -1
        for lane in lanes:
            self.enter(lane)
        return bool(self.heap)


class BlockingManager:
    """The registry. Public for the command layer: `waiting` (key -> its
    lanes; a key is there only while someone waits on it, so writers skip
    signalling when it is empty), `ready` (keys, and single lanes of watched
    keys, signalled since the last serve), `deadlines`."""

    def __init__(self) -> None:
        self.waiting: dict[bytes, _KeyLanes] = {}
        # watched key -> the lanes watching it, so a SET/DEL of a group key
        # re-checks the readers of that group (and only them).
        self._watchers: dict[bytes, dict[_Lane, None]] = {}
        self.ready: dict[bytes | _Lane, None] = {}
        self.deadlines: list[tuple[float, int, BlockRequest]] = []
        # Clients whose command waits until the signalled lanes are all
        # served (rcp11/commands/core.py DEFERRED), resumed when they are.
        self.deferred: dict[Waiter, None] = {}
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
        """request waits from now on, at the end of its lane."""
        lanes = self.waiting.get(request.key)
        if lanes is None:
            lanes = self.waiting[request.key] = _KeyLanes()
        lane = lanes.by_name.get(request.lane)
        if lane is None:
            lane = _Lane(request)
            lanes.add(lane)
            if lane.watch is not None:
                self._watchers.setdefault(lane.watch, {})[lane] = None
        elif lane.watch != request.watch or lane.rank != request.rank:
            raise ValueError(f"request {request.argv!r} does not fit its lane {lane!r}")
        request.client.blocked = request
        request.seq = next(self._sequence)
        lane.requests[request] = None
        if request.deadline is not None:
            heapq.heappush(self.deadlines, (request.deadline, next(self._sequence), request))
        self.blocked_clients += 1

    def signal_key(self, key: bytes, watchers: bool = True) -> None:
        """key changed: its waiters are looked at at the next serve, and
        (watchers) the lanes watching it. watchers=False: the change can only
        make the requests watching key wait longer (module docstring)."""
        if key in self.waiting:
            self.ready[key] = None
        if watchers:
            lanes = self._watchers.get(key)
            if lanes:
                for lane in lanes:
                    self.ready[lane] = None

    def signal_keys(self, keys: Sequence[bytes]) -> None:
        """signal_key() of each of keys, in order: one call for a command
        naming many keys. filter() finds the few that anyone waits on or
        watches, without Python code per key."""
        involved = set(filter(self.waiting.__contains__, keys))
        if self._watchers:
            involved.update(filter(self._watchers.__contains__, keys))
        if involved:
            for key in filter(involved.__contains__, keys):
                self.signal_key(key)

    def serve(
        self,
        state: Any,
        serve_one: Callable[[BlockRequest], Any],
        deadline: float | None = None,
    ) -> list[Waiter]:
        """Serve what the signals since the last call made servable, in
        passes (module docstring): serve_one(request) answers a request
        (its reply, or WAIT to keep its place). Returns the clients served,
        in order, for the caller to resume (resuming may block or signal
        again, which must not happen mid-pass). deadline (time.perf_counter()
        seconds): past it, the lanes not looked at yet stay signalled in
        `ready` for the next call, so waking thousands of readers does not
        hold every other client up (the server calls again at once)."""
        served: list[Waiter] = []
        this = _Pass()
        while True:
            if self.ready:
                self._enter_signalled(state, this)
            if not this.heap:
                if this.again and this.next_pass():
                    continue
                if self.deferred:
                    # Nothing signalled is left: what waited for it runs.
                    served += self.deferred
                    self.deferred = {}
                return served
            seq, lane = heapq.heappop(this.heap)
            if not lane.requests:
                continue  # cannot happen: lanes lose requests only here
            request = lane.head()
            if request.seq != seq:
                continue  # cannot happen either
            this.cursor = seq
            reply = serve_one(request)
            if reply is WAIT:
                continue  # the lane waits: the requests behind it would too
            self.finish(request, reply)
            served.append(request.client)
            if lane.requests:
                heapq.heappush(this.heap, (lane.head().seq, lane))
            left = this.heap or this.again or self.ready
            if left and deadline is not None and time.perf_counter() > deadline:
                # Signalled again, in the order their first requests
                # blocked: the next call's pass takes them up from here.
                for _, left in sorted(this.heap, key=lambda item: item[0]):
                    self.ready[left] = None
                for left in this.again:
                    self.ready[left] = None
                return served

    def _enter_signalled(self, state: Any, this: _Pass) -> None:
        while self.ready:
            signalled = list(self.ready)
            self.ready.clear()
            for item in signalled:
                if type(item) is _Lane:
                    this.enter(item)
                    continue
                lanes = self.waiting.get(item)
                if lanes is not None:
                    for lane in lanes.signalled(state):
                        this.enter(lane)

    def defer(self, client: Waiter) -> None:
        """client's next command waits until the signalled lanes are all
        served (the next serve() that leaves `ready` empty resumes it)."""
        self.deferred[client] = None

    def finish(self, request: BlockRequest, reply: Any) -> None:
        """Answer a request and forget it (the caller resumes the client)."""
        self._forget(request)
        request.client.send(reply)

    def wake_at(self, key: bytes, when: float) -> None:
        """Signal key at `when` (time.monotonic() seconds), whether or not
        anything writes it: expire() does, and then its readers (and the
        lanes watching it: a group whose lease runs out) are served.
        A wake-up of the key set for `when` or sooner makes this one moot."""
        soonest = self._soonest_wakes.get(key)
        if soonest is not None and soonest <= when and soonest > time.monotonic():
            return
        self._soonest_wakes[key] = when
        heapq.heappush(self.key_wakes, (when, next(self._sequence), key))

    def expire(self, now: float | None = None, with_wakes: bool = True) -> None:
        """Answer every client whose BLOCK timeout passed with a null
        array, and signal the keys whose wake-up time came (wake_at; the
        caller then serves the ready keys). now: time.monotonic() seconds;
        with_wakes=False: the key wake-ups wait (CLIENT PAUSE)."""
        if self.ready:
            # A wake-up is under way in slices: a reader it is about to
            # serve must get its message, not a timeout (served at once, as
            # the contract has it, it would have). Its end comes within a
            # few event-loop iterations; the timeouts are answered then.
            return
        now = time.monotonic() if now is None else now
        wakes = self.key_wakes if with_wakes else []
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

    def next_deadline(self, with_wakes: bool = True) -> float | None:
        """The earliest pending timeout or key wake-up (time.monotonic()
        seconds), for a server that wants to wake exactly then instead of at
        its next tick. with_wakes=False: timeouts only (see expire())."""
        heap = self.deadlines
        while heap and heap[0][2].client.blocked is not heap[0][2]:
            heapq.heappop(heap)
        wakes = self.key_wakes
        while wakes and not self.involves(wakes[0][2]):
            when, _, key = heapq.heappop(wakes)  # nobody waits on or watches that key any more
            if self._soonest_wakes.get(key) == when:
                del self._soonest_wakes[key]
        times = [h[0][0] for h in (heap, wakes if with_wakes else []) if h]
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
        self.deferred.pop(client, None)
        request = client.blocked
        if isinstance(request, BlockRequest):
            self._forget(request)

    def _forget(self, request: BlockRequest) -> None:
        request.client.blocked = None
        self.blocked_clients -= 1
        lanes = self.waiting.get(request.key)
        if lanes is None:
            return
        lane = lanes.by_name.get(request.lane)
        if lane is None:
            return
        lane.requests.pop(request, None)
        if lane.requests:
            return
        lanes.drop(lane)
        if not lanes.by_name:
            del self.waiting[request.key]
        if lane.watch is not None:
            watching = self._watchers[lane.watch]
            del watching[lane]
            if not watching:
                del self._watchers[lane.watch]


__all__ = ["WAIT", "BlockRequest", "BlockingManager", "Waiter"]
