"""The RCP 11 commands: TWRITE, TREAD, TEVICT (SPEC.md sections 2-4)."""

from __future__ import annotations

import logging
import time
from collections import deque
from time import perf_counter_ns
from typing import Any

from rcp11 import errors
from rcp11.blocking import (
    BlockRequest,
    group_default_start,
    group_position,
    lookup_stream,
    set_group_position,
    stream_reply,
)
from rcp11.commands.core import (
    BLOCKED,
    MAX_OFFSET,
    RUN_COMMANDS,
    command,
    command_stats,
    parse_int,
    text,
    transaction,
    write_refusal,
)
from rcp11.errors import CommandError
from rcp11.state import ClientState, ServerState
from rcp11.storage import OffsetOverflowError, StorageError, Stream

log = logging.getLogger("rcp11")


@command(
    "twrite",
    -3,
    "write denyoom fast",
    (1, 1, 1),
    summary="Append entries to a stream; returns the offset of the first",
    group="stream",
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
    elif isinstance(stream, bytes):
        raise CommandError(errors.WRONGTYPE)
    count = len(entries)
    new_next_offset = stream.next_offset + count
    if new_next_offset - 1 > MAX_OFFSET:
        raise CommandError(errors.OFFSET_OVERFLOW)
    state.persistence.before_stream_write(key, new_next_offset)
    try:
        first = stream.append(entries)
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
    state.propagate(argv)
    return first


# A run's AOF bytes must fit in the disk space persistence keeps reserved
# ahead of the log (it checks before each write command, with a 128 KB
# margin), so a run is cut at this many payload bytes.
_RUN_MAX_BYTES = 64 << 10
# And at this many commands: the server reads the clock between runs to give
# other clients their turn (a run of tiny messages costs ~4 us per command).
_RUN_MAX_COMMANDS = 1024


def execute_run(
    state: ServerState, client: ClientState, commands: list[list[bytes]], index: int
) -> list[int] | None:
    """Run commands[index:] as far as they are a run of plain `TWRITE key
    value` on one existing stream, with one append for all of them, when
    nothing could tell that from running them one by one through execute():
    no transaction, no reader blocked on that stream, no TTL, no maxmemory,
    writes allowed. Returns their replies (consecutive offsets), or None to
    say: use execute() for commands[index].

    Every refusal that does not depend on the run is decided before the
    scan ahead, in O(1): the server calls this for every TWRITE of a
    pipeline, so a scan that is then refused would make a pipeline that
    cannot use runs (MULTI, maxmemory) quadratic. After the scan the run is
    run: only a failure that refuses the next call cheaply too (MISCONF) or
    a C allocation failure can waste it.

    Every command is still propagated (AOF) and counted on its own."""
    argv = commands[index]
    if len(argv) != 3 or argv[0] not in RUN_COMMANDS:
        return None
    if state.loading or not client.authenticated or client.queued is not None:
        return None
    key = argv[1]
    blocking = state.blocking
    keyspace = state.keyspace
    if (
        (blocking is not None and (key in blocking.waiting or blocking.ready))
        or key in keyspace.expires
        or (state.config is not None and state.config.get("maxmemory"))
        or write_refusal(state, True, False)
    ):
        return None
    stream = keyspace.data.get(key)
    if stream is None or isinstance(stream, bytes):
        return None  # creation and WRONGTYPE take the one-by-one path
    # Offsets left before 2^63-1: a run never needs the overflow error.
    room = MAX_OFFSET + 1 - stream.next_offset
    end = index + 1
    size = len(argv[2])
    limit = min(len(commands), index + room, index + _RUN_MAX_COMMANDS)
    while end < limit:
        follower = commands[end]
        if len(follower) != 3 or follower[1] != key or follower[0] not in RUN_COMMANDS:
            break
        size += len(follower[2])
        if size > _RUN_MAX_BYTES:
            break
        end += 1
    count = end - index
    if count < 2:
        return None
    run = commands[index:end]
    new_next_offset = stream.next_offset + count
    try:
        state.persistence.before_stream_write(key, new_next_offset)
        started = perf_counter_ns()
        first = stream.append([argv[2] for argv in run])
    except (CommandError, StorageError):
        return None  # nothing was written; execute() gives each its error
    try:
        keyspace.touch(key)
        # state.propagate() per command, without re-testing `loading` each
        # time, and not at all while there is no AOF to write.
        if state.persistence.aof_state != "off":
            deque(map(state.persistence.propagate, run), maxlen=0)
        state.dirty += count
    except Exception:
        # Appended, but how much of it is logged is unknown: as call() does
        # when it cannot log a change, refuse every write from now on.
        log.exception("A run of %d TWRITE failed after its append", count)
        state.writes_refused = errors.UNLOGGED_CHANGE
        raise
    stats = state.stats
    stats.total_messages_written += count
    stats.total_commands_processed += count
    row = stats.commands.get("twrite") or command_stats(state, "twrite")
    row[0] += count
    row[1] += (perf_counter_ns() - started) // 1000
    client.last_command = "twrite"
    return list(range(first, first + count))


def _twrite_options(argv: list[bytes]) -> tuple[list[bytes], int | None]:
    """TWRITE key [BACKLOG n] ENTRIES e1 e2 ...: (entries, backlog)."""
    backlog: int | None = None
    i = 2
    while True:
        if i >= len(argv):
            raise CommandError(errors.syntax_error("ENTRIES is missing"))
        option = argv[i].upper()
        if option == b"ENTRIES":
            i += 1
            break
        if option == b"BACKLOG":
            if backlog is not None:
                raise CommandError(errors.syntax_error("BACKLOG given more than once"))
            if i + 1 >= len(argv):
                raise CommandError(errors.syntax_error("BACKLOG needs a count"))
            backlog = parse_int(argv[i + 1], "ERR BACKLOG count must be an integer >= 0")
            if backlog < 0:
                raise CommandError("ERR BACKLOG count must be an integer >= 0")
            i += 2
            continue
        raise CommandError(
            errors.syntax_error(f"unknown option '{text(argv[i])}' (expected BACKLOG or ENTRIES)")
        )
    entries = argv[i:]
    if not entries:
        raise CommandError(errors.syntax_error("no entry after ENTRIES"))
    return entries, backlog


_TREAD_OFFSET = "ERR offset is not an integer or out of range"
_TREAD_COUNT = "ERR count is not an integer or out of range"
_TREAD_TIMEOUT = "ERR timeout is not an integer or out of range"


def _tread_options(argv: list[bytes]) -> tuple[int | None, bytes | None, bool, bool]:
    """TREAD's options after key offset count: (BLOCK ms, group key,
    GROUPNEW?, WITHINFO?), in any order, each at most once."""
    block_ms: int | None = None
    group: bytes | None = None
    group_new = False
    withinfo = False
    seen: set[bytes] = set()
    i = 4
    while i < len(argv):
        option = argv[i].upper()
        if option in seen:
            raise CommandError(errors.syntax_error(f"{text(option)} given more than once"))
        seen.add(option)
        if option == b"WITHINFO":
            withinfo = True
            i += 1
            continue
        if option not in (b"BLOCK", b"GROUP", b"GROUPNEW"):
            raise CommandError(errors.syntax_error(f"unknown option '{text(argv[i])}'"))
        if i + 1 >= len(argv):
            raise CommandError(errors.syntax_error(f"{text(option)} needs a value"))
        value = argv[i + 1]
        i += 2
        if option == b"BLOCK":
            block_ms = parse_int(value, _TREAD_TIMEOUT)
            if block_ms < 0:
                raise CommandError(errors.NEGATIVE_TIMEOUT)
        else:
            if group is not None:
                raise CommandError(errors.GROUP_AND_GROUPNEW)
            group = value
            group_new = option == b"GROUPNEW"
    return block_ms, group, group_new, withinfo


@command(
    "tread",
    -4,
    "readonly blocking",
    (1, 1, 1),
    summary="Read a stream from an offset, or as a member of a group",
    group="stream",
)
def tread_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], _TREAD_OFFSET)
    count = parse_int(argv[3], _TREAD_COUNT)
    if count < 0:
        raise CommandError(errors.NEGATIVE_COUNT)
    if len(argv) > 4:
        block_ms, group, group_new, withinfo = _tread_options(argv)
    else:
        block_ms, group, group_new, withinfo = None, None, False, False

    stream = lookup_stream(state, key)
    next_offset = stream.next_offset if stream is not None else 0
    may_block = block_ms is not None and client is not transaction.client and not state.loading
    resp3 = client.resp == 3
    if group is None:
        start = offset if offset >= 0 else max(next_offset + offset, 0)
        if start >= next_offset and may_block:
            return _block(
                state, client, BlockRequest(client, key, start, count, withinfo), block_ms
            )
        reply, n = stream_reply(stream, start, count, withinfo, resp3, next_offset)
    else:
        if group == key:
            raise CommandError(errors.GROUP_IS_KEY)
        # A group read writes its group key, so it obeys write refusals.
        refused = write_refusal(state, True, False) if not state.loading else None
        if refused:
            raise CommandError(refused)
        position = group_position(state, group)
        start = position if position is not None else group_default_start(stream, group_new)
        if start >= next_offset and may_block:
            if position is None:
                # Created now, so a GROUPNEW reader gets what is written next.
                set_group_position(state, group, start)
            request = BlockRequest(client, key, start, count, withinfo, group, group_new)
            return _block(state, client, request, block_ms)
        reply, n = stream_reply(stream, start, count, withinfo, resp3, next_offset)
        if start + n != position:
            set_group_position(state, group, start + n)
    state.stats.total_messages_read += n
    return reply


def _block(state: ServerState, client: ClientState, request: BlockRequest, block_ms: Any) -> Any:
    if state.blocking is None:
        raise CommandError("ERR blocking is not available")
    if block_ms:
        request.deadline = time.monotonic() + block_ms / 1000
    state.blocking.block(client, request)
    return BLOCKED


@command(
    "tevict",
    3,
    "write fast",
    (1, 1, 1),
    summary="Evict the oldest messages of a stream",
    group="stream",
)
def tevict_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], _TREAD_OFFSET)
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
# Messages copied per read/append round, so a large source is never held in
# memory as one Python list.


@command(
    "tconcat",
    -3,
    "write denyoom",
    (1, -1, 1),
    summary="Append every readable message of source streams to a stream, then delete them",
    group="stream",
)
def tconcat_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """TCONCAT dst src [src ...] (docs/PROTOCOL.md): every check comes before
    the first change, so an error changes nothing."""
    dst = argv[1]
    sources = argv[2:]
    seen: set[bytes] = set()
    for src in sources:
        if src == dst:
            raise CommandError(errors.tconcat_source_is_destination(src))
        if src in seen:
            raise CommandError(errors.tconcat_source_twice(src))
        seen.add(src)
    keyspace = state.keyspace
    target = keyspace.get(dst)
    if isinstance(target, bytes):
        raise CommandError(errors.WRONGTYPE)
    found: list[tuple[bytes, Stream]] = []
    for src in sources:
        value = keyspace.get(src)
        if isinstance(value, bytes):
            raise CommandError(errors.WRONGTYPE)
        if value is not None:
            found.append((src, value))
    next_offset = target.next_offset if target is not None else 0
    if not found:
        return next_offset  # nothing exists to move: no change, nothing logged
    total = sum(stream.length for _, stream in found)
    if total > TCONCAT_MAX_MESSAGES:
        raise CommandError(errors.tconcat_too_many(TCONCAT_MAX_MESSAGES))
    if next_offset + total - 1 > MAX_OFFSET:
        raise CommandError(errors.OFFSET_OVERFLOW)
    created = False
    if total:
        state.persistence.before_stream_write(dst, next_offset + total)
        if target is None:
            target = state.new_stream()
            created = True
        for _, stream in found:
            concat_stream(target, stream)
    for src, _ in found:
        keyspace.delete(src)
    if created:
        keyspace.set(dst, target)
    elif total:
        keyspace.touch(dst)
    state.stats.total_messages_written += total
    # Replaying the command itself is deterministic: the sources' contents
    # at that point of the log are what they were here.
    state.propagate(argv)
    return next_offset


def concat_stream(target: Stream, source: Stream) -> None:
    """Append the readable messages of source to target, in offset order.

    The core relinks whole nodes (cost per node, not per message) and keeps
    each message's append time, so TSEEK and retention by age see the moved
    messages as written when they were (docs/PROTOCOL.md, TCONCAT)."""
    target.concat(source)
