"""TREAD: reading a stream, blocking, and consumer groups
(docs/PROTOCOL.md section 3).

The read helpers (stream_reply in reading.py, group_position in groups.py,
...) serve both a TREAD that answers at once and a blocked one served later
(TreadWait.serve), so a woken client gets exactly the reply a non-blocking
read would have produced at that moment. Lease reads (acknowledged groups)
are groups.py's lease_read() and LeaseWait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rcp11 import errors
from rcp11.blocking import WAIT, BlockRequest
from rcp11.commands.args import parse_int, text
from rcp11.commands.core import BLOCKED
from rcp11.commands.groups import (
    RANGE_ARGUMENTS,
    LeaseOptions,
    group_default_start,
    group_position,
    lease_read,
    parse_consumer,
    parse_lease,
    parse_range,
    set_group_position,
)
from rcp11.commands.reading import (
    PLAIN,
    ReplyForm,
    lookup_stream,
    readable_part,
    reply_for,
    stream_reply,
)
from rcp11.commands.table import KeySpec, command
from rcp11.errors import CommandError
from rcp11.state import ClientState, ServerState
from rcp11.storage import Stream

_GROUP_OPTIONS = (b"GROUP", b"GROUPNEW")
# Options that take one value; ACK takes two.
_VALUE_OPTIONS = frozenset({b"BLOCK", b"GROUP", b"GROUPNEW", b"LEASE", b"CONSUMER"})


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
    form: ReplyForm = PLAIN
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
        return type(value) is not Stream or value.next_offset > self.start

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
        reply, n = reply_for(self.client, stream, start, count, self.form, next_offset)
        if group is not None and start + n != position:
            set_group_position(state, group, start + n)
        state.stats.total_messages_read += n
        return reply


_TREAD_OFFSET = errors.TREAD_OFFSET
_TREAD_COUNT = errors.TREAD_COUNT


class _Options:
    """TREAD's options after key offset count."""

    __slots__ = (
        "block_ms",
        "group",
        "group_new",
        "lease",
        "nonulls",
        "packed",
        "withinfo",
        "withtimes",
    )

    def __init__(self) -> None:
        self.block_ms: int | None = None
        self.group: bytes | None = None
        self.group_new = False
        self.withinfo = False
        self.withtimes = False
        self.packed = False
        self.nonulls = False
        self.lease: LeaseOptions | None = None

    @property
    def form(self) -> ReplyForm:
        return ReplyForm(self.withinfo, self.withtimes, self.packed)


# Options that are a word alone, and the _Options field each sets.
_FLAGS = {
    b"WITHINFO": "withinfo",
    b"WITHTIMES": "withtimes",
    b"PACKED": "packed",
    b"NONULLS": "nonulls",
}

# The argv parsed last and its options: dispatch asks for TREAD's keys
# (whether a call writes) just before the handler parses the same argv, and
# a lease read has many options. Held by reference, so no other list can
# take its identity meanwhile; argv lists are never changed once parsed.
_parsed: list[Any] = [None, None]


def _tread_options(argv: list[bytes]) -> _Options:
    """TREAD's options, in any order, each at most once; then CONSUMER and
    ACK need LEASE, and LEASE a group (and no NONULLS)."""
    if _parsed[0] is argv:
        return _parsed[1]  # type: ignore[no-any-return]
    options = _Options()
    lease_ms: int | None = None
    consumer: bytes | None = None
    ack: tuple[int, int] | None = None
    seen: set[bytes] = set()
    i = 4
    n = len(argv)
    while i < n:
        option = argv[i].upper()
        if option in seen:
            raise CommandError(errors.option_twice(text(option)))
        seen.add(option)
        if option in _FLAGS:
            setattr(options, _FLAGS[option], True)
            i += 1
            continue
        if option == b"ACK":
            if i + 2 >= n:
                raise CommandError(errors.ACK_NEEDS_RANGE)
            ack = parse_range(argv[i + 1], argv[i + 2])
            i += 3
            continue
        if option not in _VALUE_OPTIONS:
            raise CommandError(errors.tread_unknown_option(argv[i]))
        if i + 1 >= n:
            raise CommandError(errors.option_needs_value(text(option)))
        value = argv[i + 1]
        i += 2
        if option == b"GROUP" or option == b"GROUPNEW":
            if options.group is not None:
                raise CommandError(errors.GROUP_AND_GROUPNEW)
            options.group = value
            options.group_new = option == b"GROUPNEW"
        elif option == b"LEASE":
            lease_ms = parse_lease(value)
        elif option == b"CONSUMER":
            consumer = parse_consumer(value)
        else:
            options.block_ms = parse_int(value, errors.TREAD_TIMEOUT)
            if options.block_ms < 0:
                raise CommandError(errors.NEGATIVE_TIMEOUT)
    if lease_ms is None:
        if consumer is not None:
            raise CommandError(errors.CONSUMER_NEEDS_LEASE)
        if ack is not None:
            raise CommandError(errors.ACK_NEEDS_LEASE)
    elif options.group is None:
        raise CommandError(errors.LEASE_NEEDS_GROUP)
    elif options.nonulls:
        # A lease read answers every offset it leases (ReadResult.start and
        # count are the range to acknowledge); a null stands for a message
        # evicted or lost in a crash.
        raise CommandError(errors.NONULLS_LEASE)
    elif options.withtimes:
        # A lease read's reply is WITHINFO's with the lease added; it has
        # no form with times (nor a packed one).
        raise CommandError(errors.WITHTIMES_LEASE)
    elif options.packed:
        raise CommandError(errors.PACKED_LEASE)
    else:
        options.lease = LeaseOptions(lease_ms, consumer or b"", ack)
    _parsed[0], _parsed[1] = argv, options
    return options


_NO_OPTIONS = _Options()


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
        {"name": "nonulls", "type": "pure-token", "token": "NONULLS", "flags": ["optional"]},
        {"name": "withtimes", "type": "pure-token", "token": "WITHTIMES", "flags": ["optional"]},
        {"name": "packed", "type": "pure-token", "token": "PACKED", "flags": ["optional"]},
        {"name": "lease", "type": "integer", "token": "LEASE", "flags": ["optional"]},
        {"name": "consumer", "type": "string", "token": "CONSUMER", "flags": ["optional"]},
        {
            "name": "ack",
            "type": "block",
            "token": "ACK",
            "flags": ["optional"],
            "arguments": RANGE_ARGUMENTS,
        },
    ),
)
def tread_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], _TREAD_OFFSET)
    count = parse_int(argv[3], _TREAD_COUNT)
    if count < 0:
        raise CommandError(errors.NEGATIVE_COUNT)
    options = _tread_options(argv) if len(argv) > 4 else _NO_OPTIONS
    block_ms, group, group_new = options.block_ms, options.group, options.group_new
    form, nonulls = options.form, options.nonulls

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
                client, key, argv, start=start, count=wanted, form=form, nonulls=nonulls
            )
            return _block(state, request, block_ms)
        reply, n = reply_for(client, stream, start, count, form, next_offset)
    else:
        if group == key:
            raise CommandError(errors.GROUP_IS_KEY)
        if options.lease is not None:
            reply = lease_read(
                state, client, argv, stream, group, count, group_new, options.lease, may_block
            )
            if isinstance(reply, BlockRequest):
                return _block(state, reply, block_ms)
            return reply
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
                form=form,
                group_new=group_new,
                nonulls=nonulls,
            )
            return _block(state, request, block_ms)
        reply, n = reply_for(client, stream, start, count, form, next_offset)
        if start + n != position:
            set_group_position(state, group, start + n)
    state.stats.total_messages_read += n
    return reply


def _block(state: ServerState, request: BlockRequest, block_ms: int | None) -> Any:
    if block_ms:
        request.deadline = time.monotonic() + block_ms / 1000
    state.blocking.block(request)
    return BLOCKED


__all__ = [
    "PLAIN",
    "ReplyForm",
    "TreadWait",
    "group_default_start",
    "group_position",
    "lookup_stream",
    "reply_for",
    "set_group_position",
    "stream_reply",
    "tread_keys",
]
