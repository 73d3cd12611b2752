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
    withtimes: bool = False,
    packed: bool = False,
) -> tuple[Raw, int]:
    """TREAD's reply for offsets start.. (at most count of them) as Raw
    RESP bytes, and how many offsets it holds (nulls included).
    next_offset: the stream's, when the caller already has it. withtimes:
    each message with its append time (RESP2: two elements per offset,
    RESP3: a pair; docs/PROTOCOL.md, WITHTIMES). packed: the messages (and
    times) in two (three) bulk strings, whatever the count (PACKED)."""
    if next_offset is None:
        next_offset = stream.next_offset if stream is not None else 0
    n = min(count, next_offset - start) if start < next_offset else 0
    if packed:
        elements = 3 if withtimes else 2
    else:
        elements = 2 * n if withtimes and not resp3 else n
    if withinfo:
        first = stream.first_offset if stream is not None else 0
        # A stream that wrote offset 2^63-1 has next offset 2^63, which no
        # RESP integer holds: the info reports the ceiling instead.
        info = [min(first, MAX_OFFSET), next_offset - 1, min(start, MAX_OFFSET), n]
        head = array_header(elements + 1) + encode(info, resp3)
    else:
        head = array_header(elements)
    if packed:
        parts = (
            stream.read_packed(start, n, withtimes)  # type: ignore[union-attr]
            if n > 0
            else [b""] * elements
        )
        bulks = [b"$%d\r\n%b\r\n" % (len(part), part) for part in parts]
        return Raw(head + b"".join(bulks)), max(n, 0)
    if n <= 0:
        return Raw(head), n
    # The core writes the header and the messages into one buffer: no
    # second copy of a large reply to join them.
    return Raw(stream.read_resp(start, n, resp3, head, withtimes)), n  # type: ignore[union-attr]


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
    value = b"%d" % offset
    state.keyspace.set(group, value)
    state.propagate([b"SET", group, value])


@dataclass(eq=False)
class TreadWait(BlockRequest):
    """A TREAD waiting for its stream to grow past `start` (or, in a group,
    past the group's position)."""

    client: ClientState  # the registry needs less of it (blocking.Waiter); TREAD reads .resp
    start: int = 0  # absolute start offset; unused when group is set
    count: int = 0
    withinfo: bool = False
    group_new: bool = False  # GROUPNEW: a missing group starts at next_offset
    withtimes: bool = False
    packed: bool = False

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
        if start >= next_offset:
            if group is not None and position is None:
                # The group key was deleted while this reader waited:
                # recreate it, as blocking would have.
                set_group_position(state, group, start)
            return WAIT
        resp3 = self.client.resp == 3
        reply, n = stream_reply(
            stream,
            start,
            self.count,
            self.withinfo,
            resp3,
            next_offset,
            self.withtimes,
            self.packed,
        )
        if group is not None and start + n != position:
            set_group_position(state, group, start + n)
        state.stats.total_messages_read += n
        return reply


_TREAD_OFFSET = errors.TREAD_OFFSET
_TREAD_COUNT = errors.TREAD_COUNT


@dataclass
class _TreadOptions:
    """TREAD's options after key offset count."""

    block_ms: int | None = None
    group: bytes | None = None
    group_new: bool = False
    withinfo: bool = False
    withtimes: bool = False
    packed: bool = False


# Options that are a word alone, and the _TreadOptions field each sets.
_FLAGS = {b"WITHINFO": "withinfo", b"WITHTIMES": "withtimes", b"PACKED": "packed"}


def _tread_options(argv: list[bytes]) -> _TreadOptions:
    """TREAD's options after key offset count, in any order, each at most
    once."""
    options = _TreadOptions()
    seen: set[bytes] = set()
    i = 4
    while i < len(argv):
        option = argv[i].upper()
        if option in seen:
            raise CommandError(errors.option_twice(text(option)))
        seen.add(option)
        if option in _FLAGS:
            setattr(options, _FLAGS[option], True)
            i += 1
            continue
        if option not in (b"BLOCK", *_GROUP_OPTIONS):
            raise CommandError(errors.tread_unknown_option(argv[i]))
        if i + 1 >= len(argv):
            raise CommandError(errors.option_needs_value(text(option)))
        value = argv[i + 1]
        i += 2
        if option == b"BLOCK":
            options.block_ms = parse_int(value, errors.TREAD_TIMEOUT)
            if options.block_ms < 0:
                raise CommandError(errors.NEGATIVE_TIMEOUT)
        else:
            if options.group is not None:
                raise CommandError(errors.GROUP_AND_GROUPNEW)
            options.group = value
            options.group_new = option == b"GROUPNEW"
    return options


def tread_keys(argv: list[bytes]) -> list[bytes]:
    """TREAD's keys, its options read as TREAD reads them: the stream, and
    the group key of GROUP/GROUPNEW (COMMAND GETKEYS, and whether a call
    writes). Options TREAD would refuse hide no key: the keyword's value
    counts as the group key, as the key specs say."""
    try:
        group = _tread_options(argv).group if len(argv) > 4 else None
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
        {"name": "withtimes", "type": "pure-token", "token": "WITHTIMES", "flags": ["optional"]},
        {"name": "packed", "type": "pure-token", "token": "PACKED", "flags": ["optional"]},
    ),
)
def tread_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], _TREAD_OFFSET)
    count = parse_int(argv[3], _TREAD_COUNT)
    if count < 0:
        raise CommandError(errors.NEGATIVE_COUNT)
    options = _tread_options(argv) if len(argv) > 4 else _TreadOptions()
    block_ms, group, group_new = options.block_ms, options.group, options.group_new
    withinfo, withtimes, packed = options.withinfo, options.withtimes, options.packed

    stream = lookup_stream(state, key)
    next_offset = stream.next_offset if stream is not None else 0
    may_block = block_ms is not None and not client.deny_blocking and not state.loading
    resp3 = client.resp == 3
    if group is None:
        start = offset if offset >= 0 else max(next_offset + offset, 0)
        if start >= next_offset and may_block:
            request = TreadWait(
                client,
                key,
                argv,
                start=start,
                count=count,
                withinfo=withinfo,
                withtimes=withtimes,
                packed=packed,
            )
            return _block(state, request, block_ms)
        reply, n = stream_reply(
            stream, start, count, withinfo, resp3, next_offset, withtimes, packed
        )
    else:
        if group == key:
            raise CommandError(errors.GROUP_IS_KEY)
        position = group_position(state, group)
        start = position if position is not None else group_default_start(stream, group_new)
        if start >= next_offset and may_block:
            if position is None:
                # Created now, so a GROUPNEW reader gets what is written next.
                set_group_position(state, group, start)
            request = TreadWait(
                client,
                key,
                argv,
                watch=group,
                count=count,
                withinfo=withinfo,
                group_new=group_new,
                withtimes=withtimes,
                packed=packed,
            )
            return _block(state, request, block_ms)
        reply, n = stream_reply(
            stream, start, count, withinfo, resp3, next_offset, withtimes, packed
        )
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
    "set_group_position",
    "stream_reply",
    "tread_keys",
]
