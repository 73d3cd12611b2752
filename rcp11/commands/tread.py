"""TREAD: reading a stream, blocking, and consumer groups
(docs/PROTOCOL.md section 3).

The read helpers (stream_reply, group_position, ...) serve both a TREAD that
answers at once and a blocked one served later (TreadWait.serve), so a woken
client gets exactly the reply a non-blocking read would have produced at
that moment.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rcp11 import errors
from rcp11.blocking import WAIT, BlockRequest
from rcp11.commands.args import parse_int, text
from rcp11.commands.core import BLOCKED
from rcp11.commands.table import KeySpec, command
from rcp11.errors import CommandError
from rcp11.limits import MAX_OFFSET, NEXT_OFFSET_CEILING
from rcp11.resp import Raw, array_header, encode
from rcp11.state import ClientState, ServerState

if TYPE_CHECKING:
    from rcp11.storage import Stream

# A group key holds a decimal offset written the way Redis writes integers:
# no sign on positives, no leading zeros.
_OFFSET_RE = re.compile(rb"0|[1-9][0-9]{0,18}")

_GROUP_OPTIONS = (b"GROUP", b"GROUPNEW")


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
    reply, n = _stream_reply(stream, start, count, withinfo, resp3, next_offset, None)
    assert type(reply) is Raw
    return reply, n


def reply_for(
    client: ClientState,
    stream: Stream | None,
    start: int,
    count: int,
    withinfo: bool,
    next_offset: int,
) -> tuple[Raw, int]:
    """stream_reply() for client, held to its output limit as Redis's
    addReply holds a reply: a reply that would take it past its hard limit
    closes it and is not built, nor is any once it is being closed
    (ClientState.output_dropped). The count is the read's either way: a
    group read still moves its group."""
    if client.output_dropped:
        return Raw(b""), _span(start, count, next_offset)  # never sent
    room = client.output_room()
    resp3 = client.resp == 3
    reply, n = _stream_reply(stream, start, count, withinfo, resp3, next_offset, room)
    if type(reply) is int:
        client.output_overflow(reply)
        client.output_dropped = True
        return Raw(b""), n  # never sent
    return reply, n  # type: ignore[return-value]


def _span(start: int, count: int, next_offset: int) -> int:
    """How many offsets a read of count from start holds (nulls included)."""
    return min(count, next_offset - start) if start < next_offset else 0


def _stream_reply(
    stream: Stream | None,
    start: int,
    count: int,
    withinfo: bool,
    resp3: bool,
    next_offset: int | None,
    cap: int | None,
) -> tuple[Raw | int, int]:
    """stream_reply(), or when the reply would be over cap bytes (None: no
    cap) its size instead, unbuilt."""
    if next_offset is None:
        next_offset = stream.next_offset if stream is not None else 0
    n = _span(start, count, next_offset)
    if withinfo:
        first = stream.first_offset if stream is not None else 0
        # A stream that wrote offset 2^63-1 has next offset 2^63, which no
        # RESP integer holds: the info reports the ceiling instead.
        info = [min(first, MAX_OFFSET), next_offset - 1, min(start, MAX_OFFSET), n]
        head = array_header(n + 1) + encode(info, resp3)
    else:
        head = array_header(n)
    if n <= 0:
        return Raw(head), n
    # The core writes the header and the messages into one buffer: no
    # second copy of a large reply to join them.
    body = stream.read_resp_capped(start, n, resp3, head, cap)  # type: ignore[union-attr]
    return (Raw(body) if type(body) is bytes else body), n


def readable_part(stream: Stream | None, start: int, count: int) -> tuple[int, int]:
    """TREAD ... NONULLS: where the read starts (the first readable offset
    at or after start, past evicted offsets and crash gaps) and how many
    offsets it covers (readable ones in a row, at most count)."""
    if stream is None:
        return start, 0
    return stream.readable_run(start, count)


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
    if not _OFFSET_RE.fullmatch(value) or int(value) > NEXT_OFFSET_CEILING:
        raise CommandError(errors.group_not_offset(group))
    return int(value)


def group_default_start(stream: Stream | None, group_new: bool) -> int:
    """Where a group without a group key starts: the oldest readable
    message, or (GROUPNEW) the next message written."""
    if stream is None:
        return 0
    return stream.next_offset if group_new else stream.first_offset


def set_group_position(state: ServerState, group: bytes, offset: int) -> None:
    """A group read moves its group (or recreates a deleted one).

    The readers blocked in the group are not signalled (rcp11/blocking.py):
    a group read only moves the group forward, which can only make them
    wait longer, or recreates a group whose deletion already signalled
    them all. Readers waiting on the group key itself as a stream are."""
    value = b"%d" % offset
    state.keyspace.set(group, value, signal_watchers=False)
    state.propagate([b"SET", group, value])


@dataclass(eq=False)
class TreadWait(BlockRequest):
    """A TREAD waiting for its stream to grow past `start` (or, in a group,
    past the group's position).

    Its lane (rcp11/blocking.py): a plain reader's is the offset it waits
    for (and whether it reads NONULLS), ranked by that offset (a write reaching offset N serves every
    plain reader waiting below N, and none above it); a group reader's is
    its group, whose readers on one stream are served in the order they
    blocked until one has to wait."""

    client: ClientState  # the registry needs less of it (blocking.Waiter); TREAD reads .resp
    start: int = 0  # absolute start offset; unused when group is set
    count: int = 0
    withinfo: bool = False
    group_new: bool = False  # GROUPNEW: a missing group starts at next_offset
    nonulls: bool = False  # NONULLS: start at a readable offset, stop before a null

    def __post_init__(self) -> None:
        if self.watch is None:
            # A NONULLS reader waits for a readable offset, a plain one for
            # its offset to exist: a write that a TEVICT in the same EXEC
            # evicted serves the plain one (a null) and not the other, so
            # they wait in lanes of their own, ranked side by side (rank
            # 2 * offset, + 1 for NONULLS: still monotonic in the offset).
            self.lane = ("offset", self.start, self.nonulls)
            self.rank = 2 * self.start + self.nonulls
        else:
            self.lane = ("group", self.watch)
            self.writes = True

    def reached(self, state: ServerState) -> bool:
        # data, not get(): changes nothing, also not an expiry. A key that
        # expired but is still there looks reached; serve() then waits.
        value = state.keyspace.data.get(self.key)
        if value is None:
            return False
        return type(value) is bytes or value.next_offset > self.start

    def serve(self, state: ServerState) -> Any:
        stream = lookup_stream(state, self.key)
        next_offset = stream.next_offset if stream is not None else 0
        group = self.watch
        position = None
        if group is None:
            start = self.start
        else:
            position = group_position(state, group)
            start = (
                position if position is not None else group_default_start(stream, self.group_new)
            )
        count = self.count
        if self.nonulls:
            start, count = readable_part(stream, start, count)
        if start >= next_offset:
            if group is not None and position is None:
                # The group key was deleted while this reader waited:
                # recreate it, as blocking would have.
                set_group_position(state, group, start)
            return WAIT
        reply, n = reply_for(self.client, stream, start, count, self.withinfo, next_offset)
        if group is not None and start + n != position:
            set_group_position(state, group, start + n)
        state.stats.total_messages_read += n
        return reply


_TREAD_OFFSET = errors.TREAD_OFFSET
_TREAD_COUNT = errors.TREAD_COUNT


def _tread_options(argv: list[bytes]) -> tuple[int | None, bytes | None, bool, bool, bool]:
    """TREAD's options after key offset count: (BLOCK ms, group key,
    GROUPNEW?, WITHINFO?, NONULLS?), in any order, each at most once."""
    block_ms: int | None = None
    group: bytes | None = None
    group_new = False
    withinfo = False
    nonulls = False
    seen: set[bytes] = set()
    i = 4
    while i < len(argv):
        option = argv[i].upper()
        if option in seen:
            raise CommandError(errors.option_twice(text(option)))
        seen.add(option)
        if option in (b"WITHINFO", b"NONULLS"):
            withinfo = withinfo or option == b"WITHINFO"
            nonulls = nonulls or option == b"NONULLS"
            i += 1
            continue
        if option not in (b"BLOCK", *_GROUP_OPTIONS):
            raise CommandError(errors.tread_unknown_option(argv[i]))
        if i + 1 >= len(argv):
            raise CommandError(errors.option_needs_value(text(option)))
        value = argv[i + 1]
        i += 2
        if option == b"BLOCK":
            block_ms = parse_int(value, errors.TREAD_TIMEOUT)
            if block_ms < 0:
                raise CommandError(errors.NEGATIVE_TIMEOUT)
        else:
            if group is not None:
                raise CommandError(errors.GROUP_AND_GROUPNEW)
            group = value
            group_new = option == b"GROUPNEW"
    return block_ms, group, group_new, withinfo, nonulls


def tread_keys(argv: list[bytes]) -> list[bytes]:
    """TREAD's keys, its options read as TREAD reads them: the stream, and
    the group key of GROUP/GROUPNEW (COMMAND GETKEYS, and whether a call
    writes). Options TREAD would refuse hide no key: the keyword's value
    counts as the group key, as the key specs say."""
    try:
        group = _tread_options(argv)[1] if len(argv) > 4 else None
    except CommandError:
        found = [argv[i + 1] for i in range(4, len(argv) - 1) if argv[i].upper() in _GROUP_OPTIONS]
        return [argv[1], *found[:1]]
    return [argv[1]] if group is None else [argv[1], group]


# The stream is read; the group key (found after the GROUP or GROUPNEW
# keyword) is read and written: TREAD is neither readonly nor write as a
# whole, its key specs say which key it writes.
_TREAD_SPECS = (
    KeySpec(("RO", "ACCESS"), index=1),
    KeySpec(("RW", "ACCESS", "UPDATE"), keyword=b"GROUP", startfrom=4),
    KeySpec(("RW", "ACCESS", "UPDATE"), keyword=b"GROUPNEW", startfrom=4),
)


@command(
    "tread",
    -4,
    "blocking",
    (1, 1, 1),
    summary="Read a stream from an offset, or as a member of a group",
    group="stream",
    key_specs=_TREAD_SPECS,
    getkeys=tread_keys,
    arguments=(
        {"name": "key", "type": "key", "key_spec_index": 0},
        {"name": "offset", "type": "integer"},
        {"name": "count", "type": "integer"},
        {"name": "milliseconds", "type": "integer", "token": "BLOCK", "flags": ["optional"]},
        {
            "name": "group",
            "type": "oneof",
            "flags": ["optional"],
            "arguments": [
                {"name": "groupkey", "type": "key", "token": "GROUP", "key_spec_index": 1},
                {"name": "newgroupkey", "type": "key", "token": "GROUPNEW", "key_spec_index": 2},
            ],
        },
        {"name": "withinfo", "type": "pure-token", "token": "WITHINFO", "flags": ["optional"]},
        {"name": "nonulls", "type": "pure-token", "token": "NONULLS", "flags": ["optional"]},
    ),
)
def tread_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], _TREAD_OFFSET)
    count = parse_int(argv[3], _TREAD_COUNT)
    if count < 0:
        raise CommandError(errors.NEGATIVE_COUNT)
    if len(argv) > 4:
        block_ms, group, group_new, withinfo, nonulls = _tread_options(argv)
    else:
        block_ms, group, group_new, withinfo, nonulls = None, None, False, False, False

    stream = lookup_stream(state, key)
    next_offset = stream.next_offset if stream is not None else 0
    may_block = block_ms is not None and not client.deny_blocking and not state.loading
    if group is None:
        start = offset if offset >= 0 else max(next_offset + offset, 0)
        wanted = count
        if nonulls:
            start, count = readable_part(stream, start, count)
        if start >= next_offset and may_block:
            request = TreadWait(
                client, key, argv, start=start, count=wanted, withinfo=withinfo, nonulls=nonulls
            )
            return _block(state, request, block_ms)
        reply, n = reply_for(client, stream, start, count, withinfo, next_offset)
    else:
        if group == key:
            raise CommandError(errors.GROUP_IS_KEY)
        position = group_position(state, group)
        start = position if position is not None else group_default_start(stream, group_new)
        wanted = count
        if nonulls:
            start, count = readable_part(stream, start, count)
        if start >= next_offset and may_block:
            if position is None:
                # Created now, so a GROUPNEW reader gets what is written next.
                set_group_position(state, group, start)
            request = TreadWait(
                client,
                key,
                argv,
                watch=group,
                count=wanted,
                withinfo=withinfo,
                group_new=group_new,
                nonulls=nonulls,
            )
            return _block(state, request, block_ms)
        reply, n = reply_for(client, stream, start, count, withinfo, next_offset)
        if start + n != position:
            set_group_position(state, group, start + n)
    state.stats.total_messages_read += n
    return reply


def _block(state: ServerState, request: TreadWait, block_ms: int | None) -> Any:
    if block_ms:
        request.deadline = time.monotonic() + block_ms / 1000
    state.blocking.block(request)
    return BLOCKED


__all__ = [
    "TreadWait",
    "group_default_start",
    "group_position",
    "lookup_stream",
    "reply_for",
    "set_group_position",
    "stream_reply",
    "tread_keys",
]
