"""Consumer groups (docs/PROTOCOL.md section 3): the position a plain group
key holds, and acknowledged groups: lease reads (TREAD ... LEASE), TACK,
TGROUP INFO / PENDING and the internal RCP11.LEASE the AOF replays.

A lease read depends on the clock (which leases ran out, the deadline it
gives), so it is logged as what it did in absolute terms: `TACK g start
count` for its ACK, then `RCP11.LEASE g key floor start count deadline
deliveries consumer`, which drops what is below `floor`, leases those
offsets until that deadline and creates the group if needed (the Redis
module replicates the same commands, src/module_ack.c). The group's state
itself is src/ackgroup.c through rcp11/storage/ackgroups.py, shared with the module.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from rcp11 import errors
from rcp11.blocking import WAIT, BlockRequest
from rcp11.commands.args import check_subcommand, now_ms, parse_int
from rcp11.commands.reading import WITHINFO, lookup_stream, reply_for, stream_reply
from rcp11.commands.table import KeySpec, command
from rcp11.errors import CommandError
from rcp11.limits import NEXT_OFFSET_CEILING
from rcp11.resp import OK, Raw
from rcp11.state import ClientState, ServerState
from rcp11.storage import Stream
from rcp11.storage.ackgroups import MAX_LEASE_MS, MAX_OWNER_BYTES, AckGroup

# A group key holds a decimal offset written the way Redis writes integers:
# no sign on positives, no leading zeros.
_OFFSET_RE = re.compile(rb"0|[1-9][0-9]{0,18}")

LEASE_RECORD = b"RCP11.LEASE"


# ---------------------------------------------------------------------------
# Plain groups: a string key holding the next offset
# ---------------------------------------------------------------------------


def _plain_position(group: bytes, value: bytes) -> int:
    # 2^63 is the group position past a stream's last possible message: the
    # server writes it itself, so it must read it back.
    if not _OFFSET_RE.fullmatch(value) or int(value) > NEXT_OFFSET_CEILING:
        raise CommandError(errors.group_not_offset(group))
    return int(value)


def group_position(state: ServerState, group: bytes) -> int | None:
    """The offset stored in a plain group key, None when the key is missing."""
    value = state.keyspace.get(group)
    if value is None:
        return None
    if not isinstance(value, bytes):
        if isinstance(value, AckGroup):
            raise CommandError(errors.group_is_acknowledged(group))
        raise CommandError(errors.WRONGTYPE)
    return _plain_position(group, value)


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


# ---------------------------------------------------------------------------
# Acknowledged groups: finding and creating them
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseOptions:
    """LEASE ms [CONSUMER name] [ACK start count] of one TREAD."""

    lease_ms: int
    consumer: bytes = b""
    ack: tuple[int, int] | None = None


def parse_lease(value: bytes) -> int:
    lease = parse_int(value, errors.LEASE_TIME)
    if not 1 <= lease <= MAX_LEASE_MS:
        raise CommandError(errors.LEASE_TIME)
    return lease


def parse_consumer(value: bytes) -> bytes:
    if len(value) > MAX_OWNER_BYTES:
        raise CommandError(errors.CONSUMER_TOO_LONG)
    return value


def parse_range(start: bytes, count: bytes) -> tuple[int, int]:
    """An acknowledged range (ACK, TACK): both integers >= 0."""
    first = parse_int(start, errors.TREAD_OFFSET)
    if first < 0:
        raise CommandError(errors.NEGATIVE_OFFSET)
    n = parse_int(count, errors.TREAD_COUNT)
    if n < 0:
        raise CommandError(errors.NEGATIVE_COUNT)
    return first, n


def find_group(state: ServerState, group: bytes, stream_key: bytes) -> AckGroup | int | None:
    """What group key `group` holds for the stream `stream_key`: its
    acknowledged group, a plain group's position, or None when missing."""
    value = state.keyspace.get(group)
    if value is None:
        return None
    if isinstance(value, AckGroup):
        if value.stream_key != stream_key:
            raise CommandError(errors.group_of_other_stream(group, value.stream_key))
        return value
    if isinstance(value, bytes):
        return _plain_position(group, value)
    raise CommandError(errors.WRONGTYPE)


@dataclass
class _Opened:
    """The group a lease read works on, and how it came to be: found as an
    acknowledged group, or new (created at `base` for a missing key, at its
    position for a plain group key), stored only if the read changes it."""

    group: AckGroup
    new: bool
    missing_at: int | None  # the start of a group created for a missing key


def _open(state: ServerState, group_key: bytes, stream_key: bytes, base: int) -> _Opened:
    found = find_group(state, group_key, stream_key)
    if isinstance(found, AckGroup):
        return _Opened(found, False, None)
    if found is None:
        return _Opened(AckGroup(stream_key, base), True, base)
    return _Opened(AckGroup(stream_key, found), True, None)


# ---------------------------------------------------------------------------
# Lease reads
# ---------------------------------------------------------------------------


def _bounds(stream: Stream | None) -> tuple[int, int]:
    """The stream's first readable and next offsets."""
    return (stream.first_offset, stream.next_offset) if stream is not None else (0, 0)


def _log_lease(
    state: ServerState,
    group_key: bytes,
    stream_key: bytes,
    floor: int,
    lease: tuple[int, int, int, int],
    consumer: bytes,
) -> None:
    start, count, deadline, deliveries = lease
    state.propagate(
        [
            LEASE_RECORD,
            group_key,
            stream_key,
            b"%d" % floor,
            b"%d" % start,
            b"%d" % count,
            b"%d" % deadline,
            b"%d" % deliveries,
            consumer,
        ]
    )


def _store(state: ServerState, group_key: bytes, group: AckGroup) -> None:
    """Record a change of group: a new group goes into the keyspace (over a
    plain group key, whose TTL goes with it, as the module's does).

    A change of a group in place signals none of the readers blocked in it
    (rcp11/blocking.py): taking leases, acknowledging and dropping evicted
    ranges only make them wait longer; a lease taken while they wait sets
    a wake-up for its deadline instead (_delivered). A new group signals
    them: plain readers of the key it replaced answer an error."""
    keyspace = state.keyspace
    if keyspace.data.get(group_key) is group:
        keyspace.touch(group_key, signal_watchers=False)
    else:
        keyspace.set(group_key, group)


def _logged_floor(opened: _Opened, floor: int) -> int:
    """The floor RCP11.LEASE logs: the stream's first offset, except that a
    group created for a missing key is created by the replay at the floor,
    so there it is the group's start."""
    return floor if opened.missing_at is None else max(opened.missing_at, floor)


def _delivered(
    state: ServerState,
    client: ClientState,
    stream: Stream | None,
    keys: tuple[bytes, bytes],
    opened: _Opened,
    floor: int,
    took: tuple[int, int, int, int],
    consumer: bytes,
) -> Raw:
    """What a lease read that delivered (take() found something) answers;
    the group is stored and the lease logged."""
    stream_key, group_key = keys
    start, count, deliveries, deadline = took
    _store(state, group_key, opened.group)
    lease = (start, count, deadline, deliveries)
    _log_lease(state, group_key, stream_key, _logged_floor(opened, floor), lease, consumer)
    if state.blocking.involves(group_key):
        # Readers wait in this group: they look again when this lease runs
        # out, if no earlier wake-up is set.
        state.blocking.wake_at(group_key, time.monotonic() + max(deadline - now_ms(), 1) / 1000)
    end = stream.next_offset if stream is not None else 0
    reply, n = reply_for(client, stream, start, count, WITHINFO, end, extra=(deliveries, deadline))
    state.stats.total_messages_read += n
    return reply


def lease_read(
    state: ServerState,
    client: ClientState,
    argv: list[bytes],
    stream: Stream | None,
    group_key: bytes,
    count: int,
    group_new: bool,
    options: LeaseOptions,
    may_block: bool,
) -> Any:
    """TREAD key offset count GROUP|GROUPNEW g LEASE ms ...: the reply, or a
    LeaseWait for the caller to register when there is nothing to deliver
    and the read may block. stream: what the key argv[1] holds."""
    stream_key = argv[1]
    floor, end = _bounds(stream)
    opened = _open(state, group_key, stream_key, end if group_new else floor)
    group = opened.group
    changed = opened.new
    if options.ack is not None:
        start, n = options.ack
        if group.ack(start, n):
            state.keyspace.touch(group_key)
            state.propagate([b"TACK", group_key, b"%d" % start, b"%d" % n])
            changed = True
    now = now_ms()
    took = group.take(now, floor, end, count, options.lease_ms, options.consumer)
    if took[1]:
        keys = (stream_key, group_key)
        return _delivered(state, client, stream, keys, opened, floor, took, options.consumer)
    # Nothing to deliver: what changed (the group created, acknowledged, its
    # evicted part dropped) is kept and logged, as GROUP writes its key when
    # it reads nothing; then the reader waits, or gets the header alone.
    before = group.next_offset
    if group.floor(floor) or group.next_offset != before or changed:
        _store(state, group_key, group)
        lease = (group.next_offset, 0, 0, 0)
        _log_lease(state, group_key, stream_key, _logged_floor(opened, floor), lease, b"")
    if not may_block:
        return stream_reply(stream, took[0], 0, WITHINFO, client.resp == 3, end, extra=(0, 0))[0]
    request = LeaseWait(
        client, stream_key, argv, watch=group_key, count=count, group_new=group_new, options=options
    )
    request.wake_for_leases(state, group, floor, end, now)
    return request


@dataclass(eq=False)
class LeaseWait(BlockRequest):
    """A lease read waiting for messages past its group's next offset, or
    for a lease of its group to run out."""

    client: ClientState
    count: int = 0
    group_new: bool = False
    options: LeaseOptions = LeaseOptions(1)
    wake_at_ms: int = 0  # the lease expiry a wake-up is set for (0: none)

    def __post_init__(self) -> None:
        # The lease readers of one group on one stream are one lane
        # (rcp11/blocking.py): what one of them cannot take (no new
        # message, no expired lease), none can. Serving moves the group.
        self.lane = ("lease", self.watch)
        self.writes = True

    def serve(self, state: ServerState) -> Any:
        group_key = self.watch
        assert group_key is not None
        stream = lookup_stream(state, self.key)
        floor, end = _bounds(stream)
        opened = _open(state, group_key, self.key, group_default_start(stream, self.group_new))
        now = now_ms()
        options = self.options
        took = opened.group.take(now, floor, end, self.count, options.lease_ms, options.consumer)
        if not took[1]:
            # Keep waiting, changing nothing (a group key deleted meanwhile
            # is created again only when this reader is served).
            self.wake_for_leases(state, opened.group, floor, end, now)
            return WAIT
        keys = (self.key, group_key)
        return _delivered(state, self.client, stream, keys, opened, floor, took, options.consumer)

    def wake_for_leases(
        self, state: ServerState, group: AckGroup, floor: int, end: int, now: int
    ) -> None:
        """Have the registry re-check this reader when the earliest lease it
        could take runs out: no write signals that."""
        deadline = group.earliest_deadline(floor, end)
        if deadline is None:
            return
        if now < self.wake_at_ms <= deadline:
            return  # a wake-up early enough is set
        self.wake_at_ms = max(deadline, now + 1)
        delay = (self.wake_at_ms - now) / 1000
        assert self.watch is not None
        state.blocking.wake_at(self.watch, time.monotonic() + delay)


# ---------------------------------------------------------------------------
# TACK, TGROUP, RCP11.LEASE
# ---------------------------------------------------------------------------


# An acknowledged range as COMMAND DOCS gives it (TACK's, TREAD's ACK).
RANGE_ARGUMENTS = (
    {"name": "start", "type": "integer"},
    {"name": "count", "type": "integer"},
)


@command(
    "tack",
    -4,
    "write fast",
    (1, 1, 1),
    summary="Acknowledge offsets leased by an acknowledged group",
    group="stream",
    key_specs=(KeySpec(("RW", "UPDATE"), index=1),),
    arguments=(
        {"name": "groupkey", "type": "key", "key_spec_index": 0},
        {"name": "range", "type": "block", "flags": ["multiple"], "arguments": RANGE_ARGUMENTS},
    ),
)
def tack_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) % 2:
        raise CommandError(errors.wrong_arity("tack"))
    ranges = [parse_range(argv[i], argv[i + 1]) for i in range(2, len(argv), 2)]
    value = state.keyspace.get(argv[1])
    if value is None:
        return 0
    if not isinstance(value, AckGroup):
        raise CommandError(errors.WRONGTYPE)
    acked = sum(value.ack(start, n) for start, n in ranges)
    if acked:
        state.keyspace.touch(argv[1])
        state.propagate(argv)
    return acked


_TGROUP_ARITY = {"info": 4, "pending": 6, "help": 2}


@command(
    "tgroup",
    -2,
    "readonly",
    summary="Describe a consumer group of a stream",
    group="stream",
    key_specs=(KeySpec(("RO", "ACCESS"), index=2), KeySpec(("RO", "ACCESS"), index=3)),
)
def tgroup_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = check_subcommand("tgroup", _TGROUP_ARITY, argv)
    if sub == "help":
        return [
            "TGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "INFO <key> <groupkey>",
            "    A group of the stream <key>: its next offset, lag, pending, expired and",
            "    delivered offsets, and the consumers holding leases.",
            "PENDING <key> <groupkey> <offset> <count>",
            "    Up to <count> pending ranges from <offset> on: start, count, consumer,",
            "    deliveries, lease deadline.",
            "HELP",
            "    Prints this help.",
        ]
    if sub == "pending":
        offset, limit = parse_range(argv[4], argv[5])
    stream = lookup_stream(state, argv[2])
    found = find_group(state, argv[3], argv[2])
    if found is None:
        raise CommandError(errors.NO_SUCH_GROUP_KEY)
    floor, end = _bounds(stream)
    if sub == "pending":
        if not isinstance(found, AckGroup):
            return []
        return [
            [
                max(r.start, floor),
                r.start + r.count - max(r.start, floor),
                r.owner,
                r.deliveries,
                r.deadline_ms,
            ]
            for r in found.ranges(max(offset, floor), limit)
        ]
    return _group_info(found, floor, end)


def _group_info(found: AckGroup | int, floor: int, end: int) -> dict[str, Any]:
    now = now_ms()
    if isinstance(found, AckGroup):
        next_offset = found.next_offset
        pending, expired, ranges = found.pending_from(floor, now)
        totals = found.totals()
        delivered = (totals.delivered, totals.redelivered, totals.acked, totals.dropped)
        consumers = [
            {
                "name": owner.name,
                "pending": owner.pending,
                "expired": owner.expired,
                "lease-deadline": owner.latest_deadline_ms,
            }
            for owner in found.owners(floor, now)
        ]
    else:
        next_offset = found
        pending = expired = ranges = 0
        delivered = (0, 0, 0, 0)
        consumers = []
    return {
        "mode": "acknowledged" if isinstance(found, AckGroup) else "plain",
        "next-offset": min(next_offset, NEXT_OFFSET_CEILING - 1),
        "lag": max(end - max(next_offset, floor), 0),
        "pending": pending,
        "pending-ranges": ranges,
        "expired": expired,
        "delivered": delivered[0],
        "redelivered": delivered[1],
        "acknowledged": delivered[2],
        "dropped": delivered[3],
        "consumers": consumers,
    }


def _lease_record(argv: list[bytes]) -> tuple[int, int, int, int, int]:
    """RCP11.LEASE's numbers: floor, start, count, deadline, deliveries."""
    try:
        floor, start, count, deliveries = (int(argv[i]) for i in (3, 4, 5, 7))
        deadline = int(argv[6])
    except ValueError:
        raise CommandError(errors.BAD_LEASE_RECORD) from None
    ok = (
        all(_OFFSET_RE.fullmatch(argv[i]) for i in (3, 4, 5, 7))
        and max(floor, start) <= NEXT_OFFSET_CEILING
        and count <= NEXT_OFFSET_CEILING - start
        and deliveries < 2**32
        and (deliveries > 0 or count == 0)
        and -(2**63) <= deadline < 2**63
        and len(argv[8]) <= MAX_OWNER_BYTES
    )
    if not ok:
        raise CommandError(errors.BAD_LEASE_RECORD)
    return floor, start, count, deadline, deliveries


@command(
    "rcp11.lease",
    9,
    "write",
    (1, 2, 1),
    summary="Lease offsets of an acknowledged group (AOF only)",
    group="stream",
    key_specs=(KeySpec(("RW", "UPDATE"), index=1), KeySpec(("RO", "ACCESS"), index=2)),
)
def lease_record_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if not state.loading:
        raise CommandError(errors.internal_command("RCP11.LEASE"))
    floor, start, count, deadline, deliveries = _lease_record(argv)
    group = _open(state, argv[1], argv[2], floor).group
    group.floor(floor)
    group.lease(start, count, deadline, deliveries, argv[8])
    _store(state, argv[1], group)
    state.propagate(argv)
    return OK


__all__ = [
    "LEASE_RECORD",
    "RANGE_ARGUMENTS",
    "LeaseOptions",
    "LeaseWait",
    "find_group",
    "group_default_start",
    "group_position",
    "lease_read",
    "parse_consumer",
    "parse_lease",
    "parse_range",
    "set_group_position",
]
