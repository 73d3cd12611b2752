"""Clients blocked in `TREAD ... BLOCK`, woken when their stream grows.

A blocked client waits on one stream key. Waiters of a key sit in one FIFO
(an insertion-ordered dict, so a disconnecting client leaves in O(1)).
Readers of a group share the group key: when messages arrive they are served
in the order they blocked, each from where the previous one stopped, so a
group spreads messages over its readers (SPEC.md section 3).

The command layer calls signal_key() when a key changes and serve_ready()
after the command ran (Redis's call() order: run, propagate, then wake). The
server cron calls expire(); a disconnect calls remove().

The read helpers below (stream_reply, group_position, ...) are shared with
TREAD itself, so a woken client gets exactly the reply a non-blocking read
would have produced at that moment.
"""

from __future__ import annotations

import heapq
import itertools
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rcp11 import errors
from rcp11.errors import CommandError
from rcp11.resp import NULL_ARRAY, Error, Raw
from rcp11.state import ClientState, ServerState

if TYPE_CHECKING:
    from rcp11.storage import Stream

# A group key holds a decimal offset written the way Redis writes integers:
# no sign on positives, no leading zeros.
_OFFSET_RE = re.compile(rb"0|[1-9][0-9]{0,18}")
_MAX_OFFSET = 2**63 - 1


@dataclass(eq=False)
class BlockRequest:
    """What a blocked TREAD waits for. eq=False: requests are compared by
    identity, so two equal-looking requests of different clients differ."""

    client: ClientState
    key: bytes
    start: int  # absolute start offset; unused when group is set
    count: int
    withinfo: bool = False
    group: bytes | None = None
    group_new: bool = False  # GROUPNEW: a missing group starts at next_offset
    deadline: float | None = None  # time.monotonic() seconds; None waits forever
    seq: int = -1  # the order of blocking, set by BlockingManager.block()


def stream_reply(
    stream: Stream | None,
    start: int,
    count: int,
    withinfo: bool,
    resp3: bool,
    next_offset: int | None = None,
) -> tuple[Raw, int]:
    """TREAD's reply for offsets start.. (at most count of them) as Raw
    RESP bytes, and how many offsets it holds (nulls included).
    next_offset: the stream's, when the caller already has it."""
    if next_offset is None:
        next_offset = stream.next_offset if stream is not None else 0
    n = min(count, next_offset - start) if start < next_offset else 0
    if withinfo:
        first = stream.first_offset if stream is not None else 0
        # A stream that wrote offset 2^63-1 has next offset 2^63, which no
        # RESP integer holds: the info reports the ceiling instead.
        head = b"*%d\r\n*4\r\n:%d\r\n:%d\r\n:%d\r\n:%d\r\n" % (
            n + 1,
            min(first, _MAX_OFFSET),
            next_offset - 1,
            min(start, _MAX_OFFSET),
            n,
        )
    else:
        head = b"*%d\r\n" % n
    if n <= 0:
        return Raw(head), n
    # The core writes the header and the messages into one buffer: no
    # second copy of a large reply to join them.
    return Raw(stream.read_resp(start, n, resp3, head)), n  # type: ignore[union-attr]


def lookup_stream(state: ServerState, key: bytes) -> Stream | None:
    value = state.keyspace.get(key)
    if isinstance(value, bytes):
        raise CommandError(errors.WRONGTYPE)
    return value


def group_position(state: ServerState, group: bytes) -> int | None:
    """The offset stored in a group key, None when the key is missing."""
    value = state.keyspace.get(group)
    if value is None:
        return None
    if not isinstance(value, bytes):
        raise CommandError(errors.WRONGTYPE)
    # 2^63 is the group position past a stream's last possible message: the
    # server writes it itself, so it must read it back.
    if not _OFFSET_RE.fullmatch(value) or int(value) > _MAX_OFFSET + 1:
        raise CommandError(errors.group_not_offset(group))
    return int(value)


def group_default_start(stream: Stream | None, group_new: bool) -> int:
    """Where a group without a group key starts: the oldest readable
    message, or (GROUPNEW) the next message written."""
    if stream is None:
        return 0
    return stream.next_offset if group_new else stream.first_offset


def set_group_position(state: ServerState, group: bytes, offset: int) -> None:
    value = b"%d" % offset
    state.keyspace.set(group, value)
    state.propagate([b"SET", group, value])


class BlockingManager:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        state.blocking = self
        # stream key -> FIFO of requests waiting on it (empty: writers
        # need not signal keys)
        self.waiting: dict[bytes, dict[BlockRequest, None]] = {}
        # group key -> stream keys with group readers waiting -> how many,
        # so a SET/DEL of a group key re-checks the readers of that group.
        self._groups: dict[bytes, dict[bytes, int]] = {}
        # Keys signalled since the last serve_ready(); the command layer
        # skips the call while it is empty (the usual case).
        self.ready: dict[bytes, None] = {}
        # Public: the server's flush skips next_deadline() while it is empty.
        self.deadlines: list[tuple[float, int, BlockRequest]] = []
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.waiting.values())

    @property
    def active(self) -> bool:
        """Whether any client waits (lets writers skip signal_key)."""
        return bool(self.waiting)

    def block(self, client: ClientState, request: BlockRequest) -> None:
        client.blocked = request
        request.seq = next(self._sequence)
        self.waiting.setdefault(request.key, {})[request] = None
        if request.group is not None:
            streams = self._groups.setdefault(request.group, {})
            streams[request.key] = streams.get(request.key, 0) + 1
        if request.deadline is not None:
            heapq.heappush(self.deadlines, (request.deadline, next(self._sequence), request))
        self.state.stats.blocked_clients += 1

    def signal_key(self, key: bytes) -> None:
        """key changed: its waiters (or the waiters of a group whose group
        key it is) are checked at the next serve_ready()."""
        if key in self.waiting:
            self.ready[key] = None
        streams = self._groups.get(key)
        if streams:
            for stream_key in streams:
                self.ready[stream_key] = None

    def serve_ready(self) -> None:
        """Serve the readers of the keys signalled since the last call.

        Readers are served in the order they blocked, across keys too (a
        group may have readers waiting on several streams: docs/PROTOCOL.md
        serves a group's readers in the order they blocked). The outcome is
        that of passes over every blocked reader in that order until a pass
        changes nothing: readers of a key signalled during a pass join it if
        they come later in the order, or else the next pass. Readers of keys
        nobody signalled cannot have become servable, so they are skipped."""
        if not self.ready:
            return
        served: list[ClientState] = []
        this_pass: list[tuple[int, BlockRequest]] = []
        next_pass: list[tuple[int, BlockRequest]] = []
        cursor = -1
        while True:
            for key in self.ready:
                for request in self.waiting.get(key, ()):
                    heap = this_pass if request.seq > cursor else next_pass
                    heapq.heappush(heap, (request.seq, request))
            self.ready.clear()
            if not this_pass:
                if not next_pass:
                    break
                this_pass, next_pass, cursor = next_pass, [], -1
                continue
            seq, request = heapq.heappop(this_pass)
            if seq <= cursor:
                continue  # signalled twice: already looked at in this pass
            cursor = seq
            if request.client.blocked is request:
                self._serve_request(request, served)
        # Resuming pipelines last: a resumed client may run commands that
        # block or wake others again, which must not happen mid-iteration.
        for client in served:
            client.on_unblocked()

    def expire(self, now: float | None = None) -> None:
        """Answer every client whose BLOCK timeout passed with a null
        array. now: time.monotonic() seconds."""
        now = time.monotonic() if now is None else now
        timed_out: list[ClientState] = []
        heap = self.deadlines
        while heap and heap[0][0] <= now:
            request = heapq.heappop(heap)[2]
            if request.client.blocked is request:
                self._finish(request, NULL_ARRAY)
                timed_out.append(request.client)
        for client in timed_out:
            client.on_unblocked()

    def next_deadline(self) -> float | None:
        """The earliest pending timeout (time.monotonic() seconds), for a
        server that wants to wake exactly then instead of at its next tick."""
        heap = self.deadlines
        while heap and heap[0][2].client.blocked is not heap[0][2]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def unblock(self, client: ClientState, error: bool) -> bool:
        """CLIENT UNBLOCK: end the client's blocked read as a timeout (a
        null reply) or with an -UNBLOCKED error. False if it was not blocked."""
        request = client.blocked
        if not isinstance(request, BlockRequest):
            return False
        reply = Error("UNBLOCKED client unblocked via CLIENT UNBLOCK") if error else NULL_ARRAY
        self._finish(request, reply)
        client.on_unblocked()
        return True

    def remove(self, client: ClientState) -> None:
        """The client disconnected: forget it at once, so messages that
        arrive later go to the next waiter."""
        request = client.blocked
        if isinstance(request, BlockRequest):
            self._forget(request)

    def _forget(self, request: BlockRequest) -> None:
        request.client.blocked = None
        self.state.stats.blocked_clients -= 1
        queue = self.waiting.get(request.key)
        if queue is not None:
            queue.pop(request, None)
            if not queue:
                del self.waiting[request.key]
        if request.group is not None:
            streams = self._groups[request.group]
            streams[request.key] -= 1
            if not streams[request.key]:
                del streams[request.key]
                if not streams:
                    del self._groups[request.group]

    def _finish(self, request: BlockRequest, reply: Any) -> None:
        client = request.client
        client.send(reply)
        self._forget(request)

    def _serve_request(self, request: BlockRequest, served: list[ClientState]) -> None:
        state = self.state
        key = request.key
        try:
            stream = lookup_stream(state, key)
            next_offset = stream.next_offset if stream is not None else 0
            position = None
            if request.group is None:
                start = request.start
            else:
                position = group_position(state, request.group)
                start = position
                if start is None:
                    start = group_default_start(stream, request.group_new)
            if start >= next_offset:
                if request.group is not None and position is None:
                    # The group key was deleted while this reader
                    # waited: recreate it, as blocking would have.
                    set_group_position(state, request.group, start)
                return
            reply, n = stream_reply(
                stream,
                start,
                request.count,
                request.withinfo,
                request.client.resp == 3,
                next_offset,
            )
            if request.group is not None and start + n != position:
                set_group_position(state, request.group, start + n)
        except CommandError as exc:
            # The key turned into a string (or the group key into
            # garbage): the reader gets the error TREAD would now give.
            self._finish(request, Error(exc.message))
            served.append(request.client)
            return
        state.stats.total_messages_read += n
        self._finish(request, reply)
        served.append(request.client)
