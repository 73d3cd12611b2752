"""Writing streams: TWRITE, TEVICT and TCONCAT (docs/PROTOCOL.md sections 2,
4 and 5), and TSEEK (section 6). TREAD is in tread.py. The C lane (lane.py,
src/lane.c) runs most TWRITEs of a pipeline without this handler, exactly as
it would."""

from __future__ import annotations

from typing import Any

from rcp11 import errors
from rcp11.commands.args import parse_int
from rcp11.commands.reading import lookup_stream
from rcp11.commands.table import KeySpec, command
from rcp11.errors import CommandError
from rcp11.limits import MAX_OFFSET
from rcp11.state import ClientState, ServerState
from rcp11.storage import OffsetOverflowError, Stream, total_length


@command(
    "twrite",
    -3,
    "write denyoom fast",
    (1, 1, 1),
    summary="Append entries to a stream; returns the offset of the first",
    group="stream",
    # Appends (INSERT); BACKLOG also evicts the oldest (DELETE).
    key_specs=(KeySpec(("RW", "INSERT", "DELETE"), index=1),),
    # TWRITE key entry | TWRITE key [BACKLOG backlog] ENTRIES entry [entry ...]
    arguments=(
        {"name": "key", "type": "key", "key_spec_index": 0},
        {
            "name": "form",
            "type": "oneof",
            "arguments": [
                {"name": "entry", "type": "string"},
                {
                    "name": "entries",
                    "type": "block",
                    "arguments": [
                        {
                            "name": "backlog",
                            "type": "integer",
                            "token": "BACKLOG",
                            "flags": ["optional"],
                        },
                        {
                            "name": "entry",
                            "type": "string",
                            "token": "ENTRIES",
                            "flags": ["multiple"],
                        },
                    ],
                },
            ],
        },
    ),
)
def twrite_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    if len(argv) == 3:
        entries = argv[2:]  # the simple form: one entry, whatever its bytes
        backlog = None
    else:
        entries, backlog = _twrite_options(argv)
    keyspace = state.keyspace
    # Keyspace.get() only matters for keys with a TTL (lazy expiry).
    stream = keyspace.get(key) if keyspace.expires else keyspace.data.get(key)
    created = stream is None
    if created:
        stream = state.new_stream()
    elif not isinstance(stream, Stream):
        raise CommandError(errors.WRONGTYPE)
    count = len(entries)
    new_next_offset = stream.next_offset + count
    if new_next_offset - 1 > MAX_OFFSET:
        raise CommandError(errors.OFFSET_OVERFLOW)
    state.persistence.before_stream_write(key, new_next_offset)
    append_ms = state.write_time()
    try:
        first = stream.append(entries, append_ms)
    except OffsetOverflowError:
        raise CommandError(errors.OFFSET_OVERFLOW) from None
    stats = state.stats
    if backlog is not None:
        stats.total_messages_evicted += stream.evict_keep(backlog)
    if created:
        keyspace.set(key, stream)
    else:
        keyspace.touch(key)
    stats.total_messages_written += count
    state.propagate(argv, append_ms)
    return first


def _twrite_options(argv: list[bytes]) -> tuple[list[bytes], int | None]:
    """TWRITE key [BACKLOG n] ENTRIES e1 e2 ...: (entries, backlog)."""
    backlog: int | None = None
    i = 2
    while True:
        if i >= len(argv):
            raise CommandError(errors.ENTRIES_MISSING)
        option = argv[i].upper()
        if option == b"ENTRIES":
            i += 1
            break
        if option == b"BACKLOG":
            if backlog is not None:
                raise CommandError(errors.option_twice("BACKLOG"))
            if i + 1 >= len(argv):
                raise CommandError(errors.BACKLOG_NEEDS_COUNT)
            backlog = parse_int(argv[i + 1], errors.BACKLOG_COUNT)
            if backlog < 0:
                raise CommandError(errors.BACKLOG_COUNT)
            i += 2
            continue
        entries_follow = any(arg.upper() == b"ENTRIES" for arg in argv[i + 1 :])
        raise CommandError(errors.twrite_unknown_option(argv[i], entries_follow))
    entries = argv[i:]
    if not entries:
        raise CommandError(errors.NO_ENTRY_AFTER_ENTRIES)
    return entries, backlog


@command(
    "tevict",
    3,
    "write fast",
    (1, 1, 1),
    summary="Evict the oldest messages of a stream",
    group="stream",
    key_specs=(KeySpec(("RW", "DELETE"), index=1),),
    arguments=(
        {"name": "key", "type": "key", "key_spec_index": 0},
        {"name": "offset", "type": "integer"},
    ),
)
def tevict_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], errors.TREAD_OFFSET)
    stream = lookup_stream(state, key)
    if stream is None:
        return 0
    evicted = stream.evict_upto(offset) if offset >= 0 else stream.evict_keep(-offset)
    if evicted:
        state.keyspace.touch(key)
        state.stats.total_messages_evicted += evicted
        state.propagate(argv)
    return evicted


# One TCONCAT may append at most this many messages. The offsets file's
# recovery margin for a cut-short last batch (2^30, rcp11.persistence)
# assumes one command moves a reservation mark by at most 3 x its entries
# plus the largest step (2^22); TWRITE's entries are bounded by the query
# buffer, TCONCAT's only by this limit: 3 x 2^28 + 2^22 < 2^30.
TCONCAT_MAX_MESSAGES = 1 << 28


@command(
    "tconcat",
    -3,
    "write denyoom",
    (1, -1, 1),
    summary="Append every readable message of source streams to a stream, then delete them",
    group="stream",
    key_specs=(
        KeySpec(("RW", "INSERT"), index=1),
        KeySpec(("RW", "DELETE"), index=2, lastkey=-1),
    ),
    arguments=(
        {"name": "destination", "type": "key", "key_spec_index": 0},
        {"name": "source", "type": "key", "key_spec_index": 1, "flags": ["multiple"]},
    ),
)
def tconcat_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """TCONCAT dst src [src ...] (docs/PROTOCOL.md): every check comes before
    the first change, so an error changes nothing. It may name a hundred
    thousand sources: the work per source is done in whole-list steps."""
    dst = argv[1]
    sources = argv[2:]
    named = set(sources)
    if len(named) != len(sources) or dst in named:
        _refuse_repeated(dst, sources)
    keyspace = state.keyspace
    target = keyspace.get(dst)
    if target is not None and not isinstance(target, Stream):
        raise CommandError(errors.WRONGTYPE)
    values = keyspace.get_many(sources)
    found = [value for value in values if value is not None]
    # Each kind of value once, not each value.
    if not all(issubclass(kind, Stream) for kind in set(map(type, found))):
        raise CommandError(errors.WRONGTYPE)
    next_offset = target.next_offset if target is not None else 0
    total = total_length(found)
    if total > TCONCAT_MAX_MESSAGES:
        raise CommandError(errors.tconcat_too_many(TCONCAT_MAX_MESSAGES))
    if next_offset + total - 1 > MAX_OFFSET:
        raise CommandError(errors.OFFSET_OVERFLOW)
    if total:
        state.persistence.before_stream_write(dst, next_offset + total)
    created = target is None
    if target is None:
        target = state.new_stream()  # created even when nothing moves
    if total:
        concat_streams(target, found)
    if len(found) == len(sources):
        keyspace.remove_existing(sources)
    else:
        data = keyspace.data
        pairs = list(zip(sources, values, strict=True))
        keyspace.remove_existing([src for src, value in pairs if value is not None])
        # Every key named counts as modified, a missing source too: a WATCH
        # on any of them aborts the transaction, as inside redis-server.
        keyspace.touch_many([src for src, value in pairs if value is None and src not in data])
    if created:
        keyspace.set(dst, target)
    else:
        keyspace.touch(dst)
    state.stats.total_messages_written += total
    if created or found:
        # Replaying the command itself is deterministic: the sources'
        # contents at that point of the log are what they were here.
        state.propagate(argv)
    return next_offset


def _refuse_repeated(dst: bytes, sources: list[bytes]) -> None:
    """The error for the first source, in order, that is the destination or
    named before."""
    seen: set[bytes] = set()
    for src in sources:
        if src == dst:
            raise CommandError(errors.tconcat_source_is_destination(src))
        if src in seen:
            raise CommandError(errors.tconcat_source_twice(src))
        seen.add(src)


def concat_streams(target: Stream, sources: list[Stream]) -> None:
    """Append the readable messages of each source to target, in order.

    The core relinks whole nodes (cost per node, not per message) and keeps
    each message's append time, so TSEEK and retention by age see the moved
    messages as written when they were (docs/PROTOCOL.md, TCONCAT)."""
    target.concat_many(sources)


@command(
    "tseek",
    3,
    "readonly fast",
    (1, 1, 1),
    summary="The offset of the first message appended at or after a unix time in ms",
    group="stream",
    key_specs=(KeySpec(("RO", "ACCESS"), index=1),),
    arguments=(
        {"name": "key", "type": "key", "key_spec_index": 0},
        {"name": "unix-time-ms", "type": "integer"},
    ),
)
def tseek_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    unix_ms = parse_int(argv[2], errors.TSEEK_TIME)
    stream = lookup_stream(state, argv[1])
    return 0 if stream is None else stream.seek_time(unix_ms)
