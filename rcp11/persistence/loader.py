"""Start-up: what the files in `dir` hold goes back into memory
(docs/PERSISTENCE.md).

load_files() reads the offsets file first (a damaged one refuses the start
before anything is truncated), then the AOF (when appendonly) or the
snapshot. When the AOF is whole (aof_whole.py: the offsets file's AOF slot
vouches for it) every stream goes on at its next offset; otherwise nothing
proves the files hold every acknowledged write, and every reserved stream
is raised to its mark, so offsets that may have been handed out are never
handed out again.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rcp11.datafiles import REWRITE_TEMP_PREFIX
from rcp11.errors import PersistenceError
from rcp11.limits import MAX_OFFSET, NEXT_OFFSET_CEILING, TORN_BATCH_MARGIN
from rcp11.logs import show_arg
from rcp11.persistence.aof_format import (
    ANNOTATION,
    RAISE_NEXT,
    BadBytes,
    TornTail,
    iter_aof_commands,
    parse_append_time,
)
from rcp11.persistence.aof_whole import FoundAof, current_boot, doubt, tail_crc_of
from rcp11.persistence.parts import Engine
from rcp11.persistence.snapshot import SNAP_MAGIC, CrcReader, read_snapshot, write_snapshot_file
from rcp11.resp import Error
from rcp11.state import ClientState, ServerState
from rcp11.storage import Stream

log = logging.getLogger("rcp11.persistence")


def load_files(engine: Engine) -> list[tuple[bytes, int]]:
    """Load the offsets file, then the AOF or the snapshot, then raise every
    reserved stream to its mark unless the AOF is whole. Returns the raises
    (key, mark), which the AOF must log. Raises PersistenceError. Runs with
    state.loading set."""
    reservations = engine.reservations
    # Read first: a damaged offsets file refuses the start before the AOF
    # loader truncates anything.
    reservations.load()
    snapshot_streams: set[bytes] = set()
    found: FoundAof | None = None
    if engine.yes("appendonly") and os.path.exists(engine.aof.path):
        found = load_aof(engine, reservations.slot.length)
    elif os.path.exists(engine.snapshot_path):
        snapshot_streams = set(load_snapshot_file(engine.state, engine.snapshot_path))
    engine.deletions.snapshot_streams = snapshot_streams
    if reservations.header_torn:
        _mark_streams_after_torn_header(engine)
    why = doubt(reservations.slot, found, current_boot())
    if why is None:
        log.info(
            "AOF %s holds every acknowledged write: streams go on at their next offsets",
            engine.aof.path,
        )
    elif found is not None and reservations.marks:
        log.warning(
            "AOF %s may lack acknowledged writes (%s): streams resume at their reservation marks",
            engine.aof.path,
            why,
        )
    return _apply_reservations(engine, raise_streams=why is not None)


def load_snapshot_file(state: ServerState, path: str) -> list[bytes]:
    """Read the snapshot at path into state; returns its stream keys."""
    try:
        with open(path, "rb", buffering=1 << 20) as file:
            size = os.fstat(file.fileno()).st_size
            reader = CrcReader(file, path, size)
            keys = read_snapshot(reader, state)
            if reader.pos != size:
                raise reader.fail("corrupt file (bytes after the checksum)")
    except OSError as exc:
        raise PersistenceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    log.info("Snapshot %s loaded: %d keys", path, len(state.keyspace))
    return keys


def load_aof(engine: Engine, slot_length: int = 0) -> FoundAof:
    """Replay the AOF; a torn tail is cut off (aof-load-truncated) or
    refuses the start. Returns what aof_whole.doubt() needs to know of the
    file, its last bytes read up to slot_length (the length the offsets
    file's AOF slot recorded)."""
    path = engine.aof.path
    state = engine.state
    client = ClientState(addr="aof-loader", authenticated=True, resp=2)
    try:
        file = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed by `with` below
    except OSError as exc:
        raise PersistenceError(f"{path}: cannot read: {exc.strerror or exc}") from exc

    def replay(argv: list[bytes], at: int) -> None:
        reply = engine.replay(state, client, argv)
        if isinstance(reply, Error):
            name = argv[0].decode("utf-8", "replace")
            raise PersistenceError(
                f"{path}: command {name!r} at byte offset {at} failed on replay: "
                f"{reply.message}; refusing to start"
            )

    with file:
        stat = os.fstat(file.fileno())
        size = stat.st_size
        tail_crc = tail_crc_of(file, slot_length) if slot_length <= size else -1
        found = FoundAof(stat.st_dev, stat.st_ino, size, tail_crc)
        file.seek(0)
        start = 0
        head = file.read(len(SNAP_MAGIC))
        file.seek(0)
        if head == SNAP_MAGIC:
            reader = CrcReader(file, path, size)
            read_snapshot(reader, state)
            start = reader.pos
        # Commands of an open MULTI wait here until their EXEC is read.
        pending: list[list[bytes]] | None = None
        multi_at = 0
        valid = start
        torn_at: int | None = None
        try:
            for argv, at, end in iter_aof_commands(file, start):
                if argv[0] is ANNOTATION:
                    # The writes after it were appended at its time (an
                    # AOF without annotations: at replay time, as before).
                    state.append_ms = _append_time(argv[1], path, at, state.append_ms)
                    valid = end if pending is None else valid
                    continue
                name = argv[0].lower()
                if pending is not None:
                    if name == b"exec":
                        replay([b"MULTI"], multi_at)
                        for queued in pending:
                            replay(queued, multi_at)
                        replay(argv, multi_at)
                        pending = None
                        valid = end
                    elif name == b"multi":
                        raise PersistenceError(f"{path}: nested MULTI at byte offset {at}")
                    else:
                        pending.append(argv)
                    continue
                if name == b"multi":
                    pending = []
                    multi_at = at
                    continue
                if argv[0] == RAISE_NEXT:
                    _replay_raise(state, argv, path, at)
                else:
                    replay(argv, at)
                valid = end
        except BadBytes as exc:
            raise PersistenceError(
                f"{path}: corrupt AOF at byte offset {exc.offset} ({exc.problem}); "
                "refusing to start"
            ) from None
        except TornTail as exc:
            torn_at = exc.offset
        finally:
            state.append_ms = None
        if pending is not None and torn_at is None:
            torn_at = multi_at  # a transaction without its EXEC
    found.complete_end = valid
    if torn_at is not None:
        _cut_torn_tail(engine, path, size, torn_at, valid)
    log.info("AOF %s loaded: %d keys", path, len(state.keyspace))
    return found


def _append_time(text: bytes, path: str, at: int, current: int | None) -> int | None:
    # A damaged annotation is a damaged record: the start is refused, as
    # for bytes that are not RESP (a torn one is a torn tail, cut above).
    try:
        ms = parse_append_time(text)
    except ValueError as exc:
        raise PersistenceError(
            f"{path}: corrupt AOF at byte offset {at} ({exc}); refusing to start"
        ) from None
    return current if ms is None else ms


def _cut_torn_tail(engine: Engine, path: str, size: int, torn_at: int, cut: int) -> None:
    if not engine.yes("aof-load-truncated"):
        raise PersistenceError(
            f"{path}: unexpected end of file at byte offset {torn_at} "
            f"(the last complete command ends at {cut}); start with "
            "aof-load-truncated yes to truncate it"
        )
    log.warning(
        "!!! Warning: short read while loading the AOF %s: truncating it from %d to %d "
        "bytes (incomplete last command or transaction) !!!",
        path,
        size,
        cut,
    )
    try:
        with open(path, "r+b") as file:
            file.truncate(cut)
            os.fsync(file.fileno())
    except OSError as exc:
        raise PersistenceError(f"{path}: cannot truncate: {exc.strerror}") from exc


def _replay_raise(state: ServerState, argv: list[bytes], path: str, at: int) -> None:
    # Written only by this package as RAISE-NEXT key offset, offset in
    # 0..2^63 (a stream at the ceiling has next offset 2^63).
    problem = None
    if len(argv) != 3:
        problem = f"{len(argv) - 1} arguments instead of 2"
    elif not argv[2].isdigit() or int(argv[2]) > NEXT_OFFSET_CEILING:
        problem = f"offset {show_arg(argv[2][:30])} is not an integer from 0 to 2^63"
    elif not isinstance(state.keyspace.data.get(argv[1]), (Stream, type(None))):
        problem = "the key does not hold a stream"
    if problem is not None:
        raise PersistenceError(
            f"{path}: bad {RAISE_NEXT.decode()} record at byte offset {at} ({problem}); "
            "refusing to start"
        )
    raise_stream(state, argv[1], int(argv[2]))


def raise_stream(state: ServerState, key: bytes, mark: int) -> bool:
    """Make key's stream have next offset >= mark. Returns whether that
    changed anything. A non-stream key is left alone."""
    keyspace = state.keyspace
    value = keyspace.data.get(key)
    if value is not None and not isinstance(value, Stream):
        return False
    if value is None:
        value = state.new_stream()
        if mark > 0:
            value.raise_next_offset(mark)
        keyspace.set(key, value)
        return True
    if value.next_offset < mark:
        value.raise_next_offset(mark)
        keyspace.touch(key)
        return True
    return False


def _mark_streams_after_torn_header(engine: Engine) -> None:
    """The offsets file was cut inside its header, so no mark is known. A
    crash while creating it leaves that, and then no stream has reserved
    anything yet; but a damaged file looks the same, so, as for a torn last
    batch, every stream the files brought back gets a mark
    TORN_BATCH_MARGIN above its next offset, durably."""
    reservations = engine.reservations
    raised = 0
    for key, value in engine.state.keyspace.data.items():
        if not isinstance(value, Stream):
            continue
        mark = min(value.next_offset + TORN_BATCH_MARGIN, MAX_OFFSET)
        reservations.marks[key] = max(reservations.marks.get(key, 0), mark)
        raised += 1
    if not raised:
        return
    log.warning(
        "Offsets file %s is cut inside its header: the next offset of each of the %d "
        "streams loaded is raised by %d so that no offset is handed out again",
        reservations.path,
        raised,
        TORN_BATCH_MARGIN,
    )
    try:
        reservations.rewrite(dict(reservations.marks), dict(reservations.deleted))
    except OSError as exc:
        raise PersistenceError(
            f"{reservations.path}: cannot rewrite: {exc.strerror or exc}"
        ) from exc


def _apply_reservations(engine: Engine, raise_streams: bool) -> list[tuple[bytes, int]]:
    """Raise every reserved stream to its mark (raise_streams: the files
    may lack acknowledged writes), and settle the marks of deleted streams.
    Returns the raises, for the AOF."""
    state = engine.state
    reservations = engine.reservations
    live, deleted = reservations.marks, reservations.deleted
    raised: list[tuple[bytes, int]] = []
    stale: list[bytes] = []
    revived: list[tuple[bytes, int]] = []
    for key in [*live, *(k for k in deleted if k not in live)]:
        value: Any = state.keyspace.data.get(key)
        if value is not None and not isinstance(value, Stream):
            stale.append(key)  # the stream was replaced by another type durably
            continue
        if value is None and key not in live:
            stale.append(key)  # deleted, and the files hold its deletion
            continue
        mark = live.get(key, 0)
        if value is not None and key in deleted:
            # Its deletion did not reach the files: the old stream is back
            # and must go up to its old mark too.
            mark = max(mark, deleted[key])
            revived.append((key, mark))
        if raise_streams and raise_stream(state, key, mark):
            raised.append((key, mark))
            log.warning(
                "Stream %s: next offset raised to its reservation %d (writes after the "
                "last durable point were lost; their offsets read as null)",
                show_arg(key),
                mark,
            )
    for key in stale:
        reservations.queue_drop(key)
    for key, mark in revived:
        reservations.revive(key, mark)
    return raised


def write_aof_base(engine: Engine) -> None:
    """The first start with the AOF on: its base must hold what the
    snapshot had before anything is appended to it."""
    path = engine.aof.path
    tmp = os.path.join(engine.dir, f"{REWRITE_TEMP_PREFIX}{os.getpid()}.aof")
    try:
        engine.aof.base_size = write_snapshot_file(engine.state, path, tmp)
    except OSError as exc:
        raise PersistenceError(f"{path}: cannot create: {exc.strerror}") from exc


__all__ = ["load_aof", "load_files", "load_snapshot_file", "raise_stream", "write_aof_base"]
