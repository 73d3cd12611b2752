"""Durability: snapshots, the append-only file (AOF) and offset reservations.

Design
======

Three files live in `dir` (their names, and the names they may never
share, are in rcp11/datafiles.py):

* The snapshot (`dbfilename`), written by SAVE, BGSAVE, `save` rules and
  SHUTDOWN. Layout (little endian)::

      "RCP11SNAP" u16 version u64 unix-time
      records:  'S' u32 keylen key u64 len value          a string
                'T' u32 keylen key (u64 len blob)* u64 ~0  a stream: Stream.dump()
                                                           blobs (header first,
                                                           then nodes as they sit
                                                           in memory, compressed
                                                           nodes stay compressed)
                'X' u32 keylen key u64 unix-ms             expiry of the key before
      'E' u32 crc32(everything before it, 'E' included)

  The trailing CRC32 covers every byte except the stream blobs, which end
  with their own CRC32 over all their bytes and pass the core validator in
  Stream.load() (checksumming them twice would halve load speed); so a
  flipped byte anywhere is caught. Every length is checked against the
  bytes left in the file before anything is allocated, so a torn or corrupt file is reported by name and byte offset
  instead of loading garbage. A file is written to a temporary name, fsynced,
  renamed over the old one and the directory is fsynced, so a crash leaves
  either the old or the new snapshot, never half of one.

* The AOF (`appendfilename`): every write command in RESP, as Redis writes
  it. propagate() appends to a memory buffer; the server calls flush() once
  per event-loop iteration *before* it sends replies. flush() hands the
  buffer to the kernel with os.write, so a killed process (kill -9) never
  loses an acknowledged write whatever `appendfsync` says; `always` also
  fsyncs before flush() returns; `everysec` fsyncs from a background thread
  once a second (the event loop never waits for the disk); `no` leaves it to
  the OS. A rewrite (BGREWRITEAOF, auto-aof-rewrite-*, CONFIG SET appendonly
  yes) forks a child that writes a snapshot of the data into a temporary
  file; meanwhile the parent keeps appending to the old AOF and also keeps
  every new command in a rewrite buffer; when the child is done the parent
  moves that buffer into the new file in slices per cron tick (fdatasync in
  a background thread) until little is left, then appends the rest, fsyncs,
  renames the file over the old AOF and fsyncs the directory; the old file
  is closed (its blocks freed) off the event loop. The AOF payload itself is
  plain RESP without checksums, as Redis's: a flipped byte inside a value
  cannot be detected, a damaged command structure can. The loader accepts such a snapshot preamble followed by
  RESP commands. Loading replays commands through rcp11.commands.execute with
  a fake client and state.loading set, MULTI ... EXEC blocks included; a
  transaction left open at the end is dropped. A torn tail (a command cut
  short by a crash) is truncated away with `aof-load-truncated yes` and
  refuses the start otherwise; bytes that are not RESP in the middle refuse
  the start with the file name and offset.

* Offset reservations (`<dbfilename>.offsets`): the flaw of the kafkaesque
  README is that offsets handed out but never fsynced are handed out again
  after a crash. Here a stream may only grow its next offset up to a durable
  *reservation mark*. before_stream_write(key, new_next) checks an in-memory
  dict; only when new_next passes the mark, a new mark (new_next plus a step
  that doubles while reservations of that key come faster than once a second,
  capped, and is at least twice the batch) is appended to the file *before*
  the write happens (a full disk refuses the write with -MISCONF) and
  fsynced by flush(), before any reply leaves: the reply carrying those
  offsets can only leave after its reservation is on disk, and one fsync
  covers all reservations of an event-loop iteration (many new streams in
  one pipeline cost one fsync). Under heavy load that is a few small fsyncs
  per second. The file is a header (magic, version) then batches of
  (key, mark) records, each batch framed with its length and CRC32. A last
  batch cut short is dropped: torn by a power loss it was never fsynced, so
  never acknowledged, but a file damaged at its end looks the same, so every
  mark (and every key still readable in the cut batch) is then raised by
  2^30, more than one reservation can move a mark, and the file rewritten.
  Damage before the last batch refuses start-up. The file is compacted by
  an atomic rewrite when it grows. At start-up, after the snapshot or AOF is
  loaded, each reserved stream's next offset is raised to its mark, and a
  reserved stream that was lost altogether is recreated empty at its mark:
  messages lost in a crash read as null, never as other data, in every
  persistence mode (even without AOF and save rules). With the AOF on, such
  a raise is logged as an internal `RCP11-RAISE-NEXT key offset` record that
  only this loader understands, so later commands in the AOF replay onto the
  same offsets they were acknowledged with.

  The raise always happens, whatever the AOF looks like: an AOF that lost
  commands at a command boundary (a power loss with `everysec`, a copied or
  restored file, a disk that dropped writes) or that was emptied loads
  without any sign of damage, so nothing at start-up can prove that it
  holds every acknowledged write. (An earlier design kept a slot in the
  offsets file vouching for "the AOF of this boot is complete" and skipped
  the raise; a file cut on the same boot then handed offsets out again.)
  So a kill -9 leaves a gap of null offsets below each stream's mark; a
  clean SHUTDOWN writes the marks tight (below), so a clean restart shows
  none.

  DEL really resets a stream (docs/PROTOCOL.md), but the old mark may only
  be forgotten once the deletion itself is durable; otherwise a crash could
  bring back the old stream from an older snapshot (or an AOF that lost the
  DEL) below offsets already handed out. So a removal moves the key's mark
  to a *deleted* record, written (no fsync) before the reply leaves: at
  start-up a deleted mark raises the stream only if the files bring it
  back, and a key absent from the files stays absent, so a kill -9 right
  after DEL or FLUSHALL does not resurrect the key. The deleted mark is
  forgotten once the deletion is durable: with the AOF on once the AOF is
  fsynced past the DEL; with the AOF off once a snapshot taken after the
  DEL is complete, or at once if the on-disk snapshot does not contain the
  key. A stream created again at that key reserves its own marks meanwhile;
  if the files bring the old stream back, it goes up to the higher of both.
  A clean SHUTDOWN rewrites the table tight (each mark = the stream's next
  offset) so a normal restart shows no gap.

Disk errors (ENOSPC, EIO, EROFS) never turn into acknowledged writes:
flush() returns False when the AOF write or fsync failed and the server then
drops the pending replies of that iteration's write commands and closes those
clients; write_refused() answers -MISCONF while the AOF write is failing,
while the reservations file cannot be written, or (with save rules, like
Redis's stop-writes-on-bgsave-error) after a failed background save. tick()
retries and clears the error when the disk recovers; unwritten AOF bytes are
kept and written in order, so the file stays a clean sequence of commands.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from rcp11 import errors
from rcp11.datafiles import (
    REWRITE_TEMP_PREFIX,
    SNAPSHOT_TEMP_PREFIX,
    TEMP_PREFIXES,
    DirectoryInUse,
    lock_data_dir,
    offsets_name,
)
from rcp11.errors import CommandError
from rcp11.files import fsync_dir, replace_atomically, write_all
from rcp11.limits import (
    AOF_SPACE_MARGIN,
    AOF_SPACE_SLICES,
    MAX_OFFSET,
    NEXT_OFFSET_CEILING,
    RESERVATION_MAX_STEP,
    RESERVATION_MIN_STEP,
    TORN_BATCH_MARGIN,
)
from rcp11.resp import Error, encode_command
from rcp11.state import ClientState, ServerState

log = logging.getLogger("rcp11.persistence")

SNAP_MAGIC = b"RCP11SNAP"
SNAP_VERSION = 1
OFFSETS_MAGIC = b"RCP11OFS"
OFFSETS_VERSION = 2
RAISE_NEXT = b"RCP11-RAISE-NEXT"

_END_OF_BLOBS = 0xFFFFFFFFFFFFFFFF
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_OFS_BATCH = struct.Struct("<II")
_REWRITE_RETRY_DELAY = 5.0
_BGSAVE_RETRY_DELAY = 5.0
# Finishing an AOF rewrite: the commands logged meanwhile move into the new
# file _FINISH_STEP bytes per cron tick until at most _FINISH_SMALL remain.
_FINISH_STEP = 32 << 20
_FINISH_SMALL = 4 << 20
# The offsets file header: magic and version. Version 1 files had a 64-byte
# slot after it (the "AOF of this boot is complete" shortcut, see the design
# above); they are read by skipping it and rewritten as version 2.
_OFS_HEADER = OFFSETS_MAGIC + struct.pack("<H", OFFSETS_VERSION)
_V1_SLOT_SIZE = 64


class PersistenceError(Exception):
    """A persistence file cannot be loaded; the message names the file, the
    byte offset when known, and the problem."""


# ---------------------------------------------------------------------------
# Small file helpers
# ---------------------------------------------------------------------------


def _die_with_parent() -> None:
    # A forked child must not outlive a killed server (it would go on
    # writing files nobody waits for).
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# ---------------------------------------------------------------------------
# Snapshot format
# ---------------------------------------------------------------------------


class _CrcWriter:
    """Buffered writer that keeps a running CRC32 of what it wrote."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.crc = 0
        self.size = 0

    def write(self, data: bytes) -> None:
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        self.file.write(data)

    def write_self_checked(self, blob: bytes) -> None:
        # Stream blobs end with their own CRC32 over every byte, verified by
        # Stream.load(): checksumming them twice would only halve the speed.
        self.size += len(blob)
        self.file.write(blob)


def write_snapshot(out: _CrcWriter, state: ServerState) -> None:
    """Serialize the whole keyspace into out (see the module docstring)."""
    out.write(SNAP_MAGIC + struct.pack("<HQ", SNAP_VERSION, int(time.time())))
    keyspace = state.keyspace
    expires = keyspace.expires
    u64 = _U64.pack
    for key, value in keyspace.data.items():
        head = _U32.pack(len(key)) + key
        if isinstance(value, bytes):
            out.write(b"S" + head + u64(len(value)))
            out.write(value)
        else:
            out.write(b"T" + head)
            for blob in value.dump():
                out.write(u64(len(blob)))
                out.write_self_checked(blob)
            out.write(u64(_END_OF_BLOBS))
        when = expires.get(key) if expires else None
        if when is not None:
            out.write(b"X" + head + u64(int(when)))
    out.write(b"E")
    out.file.write(_U32.pack(out.crc))
    out.size += 4


class _CrcReader:
    """Reads exact byte counts with a running CRC; every short read or
    impossible length becomes a PersistenceError naming file and offset."""

    def __init__(self, file: BinaryIO, path: str, size: int, start: int = 0) -> None:
        self.file = file
        self.path = path
        self.size = size
        self.pos = start
        self.crc = 0
        self._scratch = bytearray()

    def fail(self, problem: str, at: int | None = None) -> PersistenceError:
        where = self.pos if at is None else at
        return PersistenceError(f"{self.path}: {problem} at byte offset {where}")

    def read(self, n: int) -> bytes:
        if n > self.size - self.pos:
            raise self.fail(
                f"truncated or corrupt file (a {n}-byte field runs past the end of the file)"
            )
        data = self.file.read(n)
        if len(data) != n:
            raise self.fail("truncated file (short read)")
        self.crc = zlib.crc32(data, self.crc)
        self.pos += n
        return data

    def read_self_checked(self, n: int) -> memoryview:
        """Read a blob that carries its own checksum into a reused buffer
        (valid until the next call: the core copies what it loads)."""
        if n > self.size - self.pos:
            raise self.fail(
                f"truncated or corrupt file (a {n}-byte blob runs past the end of the file)"
            )
        if len(self._scratch) < n:
            self._scratch = bytearray(max(n, 2 * len(self._scratch)))
        view = memoryview(self._scratch)[:n]
        if self.file.readinto(view) != n:
            raise self.fail("truncated file (short read)")
        self.pos += n
        return view

    def u32(self) -> int:
        return _U32.unpack(self.read(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self.read(8))[0]


def read_snapshot(reader: _CrcReader, state: ServerState) -> list[bytes]:
    """Load a snapshot from reader into state.keyspace (which should be
    empty). Returns the stream keys it loaded. Raises PersistenceError."""
    from rcp11.storage import StorageError, Stream

    magic = reader.read(len(SNAP_MAGIC))
    if magic != SNAP_MAGIC:
        raise reader.fail("not an rcp11 snapshot (bad magic)", 0)
    version, _created = struct.unpack("<HQ", reader.read(10))
    if version != SNAP_VERSION:
        raise reader.fail(f"unsupported snapshot version {version}")
    keyspace = state.keyspace
    stream_keys: list[bytes] = []
    while True:
        record_at = reader.pos
        tag = reader.read(1)
        if tag == b"E":
            break
        if tag not in (b"S", b"T", b"X"):
            raise reader.fail(f"corrupt file (unknown record type {tag!r})", record_at)
        key = reader.read(reader.u32())
        if tag != b"X" and key in keyspace.data:
            raise reader.fail(f"corrupt file (key {key[:60]!r} appears twice)", record_at)
        if tag == b"S":
            keyspace.set(key, reader.read(reader.u64()))
        elif tag == b"X":
            when = reader.u64()
            if key not in keyspace.data:
                raise reader.fail("corrupt file (expiry for a missing key)", record_at)
            keyspace.set_expire(key, when)
        else:

            def blobs() -> Iterator[memoryview]:
                while True:
                    size = reader.u64()
                    if size == _END_OF_BLOBS:
                        return
                    yield reader.read_self_checked(size)

            try:
                stream = Stream.load(blobs())
            except StorageError as exc:
                raise reader.fail(f"corrupt stream {key!r} ({exc})", record_at) from exc
            keyspace.set(key, stream)
            stream_keys.append(key)
    expected = reader.crc
    if reader.size - reader.pos < 4:
        raise reader.fail("truncated file (checksum missing)")
    stored = _U32.unpack(reader.file.read(4))[0]
    reader.pos += 4
    if stored != expected:
        raise reader.fail(
            f"checksum mismatch (stored {stored:08x}, computed {expected:08x}): corrupt file"
        )
    return stream_keys


def _write_snapshot_file(state: ServerState, path: str, tmp_path: str) -> int:
    """Write a complete, durable snapshot to path via tmp_path; returns its size."""

    def write(file: BinaryIO) -> int:
        out = _CrcWriter(file)
        write_snapshot(out, state)
        return out.size

    return replace_atomically(path, write, temp_path=tmp_path)


# ---------------------------------------------------------------------------
# AOF parsing
# ---------------------------------------------------------------------------


class _Incomplete(Exception):
    """The buffer ends inside a command."""


def _parse_command(buf: bytes, pos: int) -> tuple[list[bytes], int]:
    """Parse one RESP array of bulk strings at pos; returns (argv, end).
    Raises _Incomplete or ValueError (with a relative description)."""
    size = len(buf)
    if buf[pos] != 42:  # '*'
        raise ValueError(f"expected '*', got {bytes([buf[pos]])!r}")
    newline = buf.find(b"\r\n", pos, pos + 24)
    if newline < 0:
        if size - pos < 24:
            raise _Incomplete
        raise ValueError("bad array header")
    count_text = buf[pos + 1 : newline]
    if not count_text.isdigit() or int(count_text) < 1:
        raise ValueError(f"bad argument count {count_text!r}")
    count = int(count_text)
    pos = newline + 2
    argv: list[bytes] = []
    for _ in range(count):
        if pos >= size:
            raise _Incomplete
        if buf[pos] != 36:  # '$'
            raise ValueError(f"expected '$', got {bytes([buf[pos]])!r}")
        newline = buf.find(b"\r\n", pos, pos + 24)
        if newline < 0:
            if size - pos < 24:
                raise _Incomplete
            raise ValueError("bad bulk header")
        length_text = buf[pos + 1 : newline]
        if not length_text.isdigit():
            raise ValueError(f"bad bulk length {length_text!r}")
        start = newline + 2
        end = start + int(length_text)
        if end + 2 > size:
            raise _Incomplete
        if buf[end : end + 2] != b"\r\n":
            raise ValueError("bulk string not followed by CRLF")
        argv.append(buf[start:end])
        pos = end + 2
    return argv, pos


def iter_aof_commands(
    file: BinaryIO, start: int, chunk: int = 16 << 20
) -> Iterator[tuple[list[bytes], int, int]]:
    """Yield (argv, start_offset, end_offset) for each complete command of
    file from byte `start`. At the end: if bytes remain that do not form a
    complete command, raises _TornTail(offset); bytes that are not RESP raise
    _BadBytes(offset, problem)."""
    file.seek(start)
    buf = b""
    base = start  # file offset of buf[0]
    pos = 0
    eof = False
    while True:
        if pos >= len(buf) and eof:
            return
        try:
            if pos >= len(buf):
                raise _Incomplete
            argv, end = _parse_command(buf, pos)
        except _Incomplete:
            if eof:
                raise _TornTail(base + pos) from None
            more = file.read(max(chunk, 2 * (len(buf) - pos)))
            if not more:
                eof = True
            buf = buf[pos:] + more
            base += pos
            pos = 0
            continue
        except ValueError as exc:
            raise _BadBytes(base + pos, str(exc)) from None
        yield argv, base + pos, base + end
        pos = end


class _TornTail(Exception):
    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


class _BadBytes(Exception):
    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(offset, problem)
        self.offset = offset
        self.problem = problem


# ---------------------------------------------------------------------------
# Offset reservations
# ---------------------------------------------------------------------------


# A record is: u32 key length | key | i64 mark. Bit 31 of the key length
# (keys are far shorter than 2 GB) marks a deleted stream's record; without
# it a mark of -1 forgets the key.
#
#   kind      key-length bit 31   mark     meaning at load
#   live      0                   >= 0     the stream's reservation mark
#   deleted   1                   >= 0     the stream was deleted; should an
#                                          older file bring it back, it still
#                                          goes up to this mark
#   forget    0                   -1       no mark at all for the key
_DELETED_FLAG = 1 << 31
_KEY_LEN_MASK = _DELETED_FLAG - 1
Record = tuple[bytes, int, bool]  # key, mark, deleted


def _iter_records(payload: bytes) -> Iterator[Record]:
    """The records of one batch; struct.error if they do not fill it."""
    at = 0
    while at < len(payload):
        (raw_len,) = _U32.unpack_from(payload, at)
        klen = raw_len & _KEY_LEN_MASK
        if at + 4 + klen + 8 > len(payload):
            raise struct.error("record runs past its batch")
        key = payload[at + 4 : at + 4 + klen]
        (mark,) = _I64.unpack_from(payload, at + 4 + klen)
        at += 12 + klen
        yield key, mark, bool(raw_len & _DELETED_FLAG)


# Finding a complete batch after a damaged length reads at most this many
# bytes through crc32 (a few hundred ms): past it the damage is taken for a
# torn tail, as before the search.
_BATCH_SEARCH_BUDGET = 256 << 20


def _complete_batch_after(data: bytes, start: int) -> int | None:
    """The offset of a complete, checksummed, non-empty batch at or after
    `start`, if any. A batch torn by a crash is the file's last bytes, so
    such a batch after it proves the length before it was damaged."""
    budget = _BATCH_SEARCH_BUDGET
    size = len(data)
    for pos in range(start, size - _OFS_BATCH.size - 12 + 1):
        length, crc = _OFS_BATCH.unpack_from(data, pos)
        if length < 12 or length > size - pos - _OFS_BATCH.size:
            continue
        budget -= length
        if budget < 0:
            return None
        payload = data[pos + _OFS_BATCH.size : pos + _OFS_BATCH.size + length]
        if zlib.crc32(payload) != crc:
            continue
        try:
            for _record in _iter_records(payload):
                pass
        except struct.error:
            continue
        return pos
    return None


def _raise_after_torn_batch(
    live: dict[bytes, int], deleted: dict[bytes, int], torn: bytes
) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """Marks for a file whose last batch (torn, unverified) was cut off:
    every known mark and every key still readable in the cut batch (as a
    live mark), raised by the margin. Marks only go up, so reading garbage
    costs a gap at most."""

    def up(mark: int) -> int:
        return min(max(mark, 0) + TORN_BATCH_MARGIN, MAX_OFFSET)

    raised = {key: up(mark) for key, mark in live.items()}
    raised_deleted = {key: up(mark) for key, mark in deleted.items()}
    payload = torn[_OFS_BATCH.size :]
    at = 0
    while at + _U32.size <= len(payload):
        klen = _U32.unpack_from(payload, at)[0] & _KEY_LEN_MASK
        if klen > len(payload) - at - _U32.size:
            break
        key = payload[at + _U32.size : at + _U32.size + klen]
        at += _U32.size + klen
        mark = _I64.unpack_from(payload, at)[0] if at + _I64.size <= len(payload) else 0
        at += _I64.size
        known = max(mark, live.get(key, 0), deleted.get(key, 0))
        raised[key] = max(raised.get(key, 0), up(known))
    return raised, raised_deleted


class OffsetReservations:
    """The durable key -> reserved next-offset table (module docstring).

    `marks` holds the live streams' marks. `deleted` holds the marks of
    streams deleted since their deletion was last known durable: until
    forget_deleted(), an older snapshot or AOF could bring such a stream
    back, and it must then still go up to its old mark. A stream created
    again at a deleted key reserves afresh in `marks`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.marks: dict[bytes, int] = {}
        self.deleted: dict[bytes, int] = {}
        # key -> (current step, monotonic time of its last reservation)
        self._pace: dict[bytes, tuple[int, float]] = {}
        self._fd = -1
        self.file_size = 0
        self.fsyncs = 0
        self._pending: list[Record] = []  # not yet written, no fsync needed
        self.unsynced = False  # reservations written but not yet fsynced
        # The file exists but was cut inside its header: no mark is known.
        self.header_torn = False

    @property
    def pending(self) -> bool:
        """Records wait to be written (best effort, no fsync needed)."""
        return bool(self._pending)

    @staticmethod
    def _encode(records: Iterable[Record]) -> bytes:
        # A stream at the ceiling has next offset 2^63, one past what an i64
        # holds; its mark stays 2^63-1 (no offset is left to hand out anyway).
        payload = b"".join(
            _U32.pack(len(k) | (_DELETED_FLAG if d else 0)) + k + _I64.pack(min(m, MAX_OFFSET))
            for k, m, d in records
        )
        return _OFS_BATCH.pack(len(payload), zlib.crc32(payload)) + payload

    def load(self) -> dict[bytes, int]:
        """Read the table; returns the live marks (`deleted` is filled too).
        Damage before the last batch refuses. A last batch cut short is cut
        off: torn by a power loss it was never fsynced (so never
        acknowledged), but a file damaged at its end looks the same, so every
        mark, and every key still readable in it, is raised by
        TORN_BATCH_MARGIN and the file is rewritten with the raised marks."""
        live: dict[bytes, int] = {}
        deleted: dict[bytes, int] = {}
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            self.marks, self.deleted = live, deleted
            return live
        except OSError as exc:
            raise PersistenceError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        pos, old_format = self._header_end(data)
        self.header_torn = pos == 0
        if pos == 0:
            data = b""
        valid = pos
        while pos < len(data):
            if len(data) - pos < _OFS_BATCH.size:
                break
            length, crc = _OFS_BATCH.unpack_from(data, pos)
            end = pos + _OFS_BATCH.size + length
            if end > len(data):
                # Torn last batch, or a damaged length field with batches
                # after it: those would be lost if this were read as the end.
                later = _complete_batch_after(data, pos + 1)
                if later is not None:
                    raise PersistenceError(
                        f"{self.path}: corrupt file (the batch at byte offset {pos} claims "
                        f"{length} bytes, past the end of the file, but a complete batch "
                        f"follows at byte offset {later})"
                    )
                break
            payload = data[pos + _OFS_BATCH.size : end]
            if zlib.crc32(payload) != crc:
                if end == len(data):
                    break  # torn last batch
                raise PersistenceError(
                    f"{self.path}: checksum mismatch at byte offset {pos}: corrupt file"
                )
            try:
                for key, mark, was_deleted in _iter_records(payload):
                    if was_deleted:
                        live.pop(key, None)
                        deleted[key] = max(deleted.get(key, 0), mark)
                    elif mark < 0:
                        live.pop(key, None)
                        deleted.pop(key, None)
                    else:
                        live[key] = mark
            except struct.error as exc:
                raise PersistenceError(
                    f"{self.path}: corrupt record in batch at byte offset {pos}"
                ) from exc
            pos = end
            valid = end
        self.marks, self.deleted = live, deleted
        self.file_size = valid
        if valid < len(data):
            log.warning(
                "Offsets file %s: the last batch (%d bytes at byte offset %d) is cut short; "
                "every reservation is raised by %d so that no offset it may have covered "
                "is handed out again",
                self.path,
                len(data) - valid,
                valid,
                TORN_BATCH_MARGIN,
            )
            live, deleted = _raise_after_torn_batch(live, deleted, data[valid:])
        if valid < len(data) or old_format:
            try:
                self.rewrite(live, deleted)
            except OSError as exc:
                raise PersistenceError(f"{self.path}: cannot rewrite: {exc.strerror}") from exc
        return live

    def _header_end(self, data: bytes) -> tuple[int, bool]:
        """Where the batches start (0: no header yet, read as empty) and
        whether the file has the version 1 layout."""
        v1_header = OFFSETS_MAGIC + struct.pack("<H", 1)
        if len(data) < len(_OFS_HEADER) and (
            _OFS_HEADER.startswith(data) or v1_header.startswith(data)
        ):
            return 0, False  # created, but its header never fully reached the disk
        if data.startswith(_OFS_HEADER):
            return len(_OFS_HEADER), False
        if data.startswith(v1_header):
            if len(data) < len(v1_header) + _V1_SLOT_SIZE:
                return 0, False  # its header and slot never fully reached the disk
            return len(v1_header) + _V1_SLOT_SIZE, True
        if data.startswith(OFFSETS_MAGIC) and len(data) >= len(_OFS_HEADER):
            (version,) = struct.unpack_from("<H", data, len(OFFSETS_MAGIC))
            raise PersistenceError(
                f"{self.path}: unsupported offsets file version {version} at byte offset "
                f"{len(OFFSETS_MAGIC)}"
            )
        raise PersistenceError(
            f"{self.path}: not an rcp11 offsets file (bad header, {len(data)} bytes)"
        )

    def _open(self) -> int:
        if self._fd < 0:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            size = os.fstat(fd).st_size
            if size < len(_OFS_HEADER):
                try:
                    os.ftruncate(fd, 0)
                    write_all(fd, _OFS_HEADER)
                    os.fsync(fd)
                except OSError:
                    os.close(fd)
                    raise
                size = len(_OFS_HEADER)
                fsync_dir(os.path.dirname(self.path))
            self._fd = fd
            self.file_size = size
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def reserve(self, key: bytes, new_next: int, current_next: int) -> None:
        """Make a mark >= new_next durable for key. Raises OSError."""
        now = time.monotonic()
        step, last = self._pace.get(key, (RESERVATION_MIN_STEP, -1e9))
        if now - last < 1.0:
            step = min(step * 2, RESERVATION_MAX_STEP)
        elif now - last > 10.0:
            step = max(RESERVATION_MIN_STEP, step // 2)
        batch = max(0, new_next - current_next)
        mark = min(new_next + max(step, 2 * batch), MAX_OFFSET)
        # Written now, so a full disk refuses the write before it runs;
        # fsynced by sync(), which flush() calls before any reply leaves:
        # one fsync covers every reservation of an event-loop iteration.
        self.write([(key, mark, False)], durable=False)
        self.unsynced = True
        self.marks[key] = mark
        self._pace[key] = (step, now)

    def delete(self, key: bytes) -> bool:
        """The stream at key left the keyspace; False if it had no mark.
        Its mark moves to `deleted` (queued for the file, written by the
        next write without fsync: if that record is lost, the live mark it
        replaces brings the key back as an empty stream at most)."""
        mark = self.marks.pop(key, None)
        if mark is None:
            return False
        self._pace.pop(key, None)
        mark = max(mark, self.deleted.get(key, 0))
        self.deleted[key] = mark
        self._pending.append((key, mark, True))
        return True

    def forget_deleted(self, key: bytes) -> None:
        """The deletion of key is durable: no file can bring the old stream
        back, so its old mark goes (a stream created since keeps its own)."""
        if self.deleted.pop(key, None) is None:
            return
        self._pending.append((key, -1, False))
        if key in self.marks:
            self._pending.append((key, self.marks[key], False))

    def revive(self, key: bytes, mark: int) -> None:
        """A deleted stream came back from the files (its deletion was lost):
        it is live again with `mark`."""
        self.deleted.pop(key, None)
        self.marks[key] = mark
        self._pending.append((key, -1, False))
        self._pending.append((key, mark, False))

    def queue_drop(self, key: bytes) -> None:
        """Forget every mark of key."""
        self.marks.pop(key, None)
        self.deleted.pop(key, None)
        self._pace.pop(key, None)
        self._pending.append((key, -1, False))

    def write(self, records: list[Record], durable: bool) -> None:
        """Append records (after any queued ones); fsync when durable."""
        batch = self._pending + records
        fd = self._open()
        if batch:
            data = self._encode(batch)
            try:
                write_all(fd, data)
            except OSError as exc:
                # A partial batch is a torn record the loader would take for
                # the end of the file: cut it off so later batches stay
                # readable.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self.file_size)
                raise exc
            self.file_size += len(data)
            self._pending = []
        if durable:
            os.fsync(fd)
            self.fsyncs += 1
            self.unsynced = False

    def write_best_effort(self, records: list[Record]) -> bool:
        """Append records and any queued ones without fsync, for records whose
        loss costs only a gap; False (logged) when the write failed."""
        if not records and not self._pending:
            return True
        try:
            self.write(records, durable=False)
        except OSError as exc:
            log.warning("Cannot update the offsets file %s: %s", self.path, exc.strerror or exc)
            return False
        return True

    def sync(self) -> None:
        """fsync reservations written since the last sync. Raises OSError."""
        if self.unsynced:
            os.fsync(self._open())
            self.fsyncs += 1
            self.unsynced = False

    def compact_if_large(self) -> None:
        if self.file_size <= 256 * 1024:
            return
        live = sum(16 + len(k) for k in self.marks) + sum(16 + len(k) for k in self.deleted)
        if self.file_size > 4 * live:
            self.sync()
            self.rewrite(dict(self.marks), dict(self.deleted))

    def rewrite(self, marks: dict[bytes, int], deleted: dict[bytes, int] | None = None) -> None:
        """Replace the file atomically by exactly `marks` (and `deleted`)."""
        # A temporary name the start-up sweep removes if a crash leaves it.
        tmp = os.path.join(
            os.path.dirname(self.path), f"{SNAPSHOT_TEMP_PREFIX}offsets-{os.getpid()}.tmp"
        )
        deleted = dict(deleted or {})
        data = _OFS_HEADER
        # Deleted records first: at load one drops the key's live mark.
        records = [(k, m, True) for k, m in deleted.items()]
        records += [(k, m, False) for k, m in marks.items()]
        if records:
            data += self._encode(records)
        replace_atomically(self.path, lambda file: file.write(data), temp_path=tmp)
        self.close()
        self.marks = dict(marks)
        self.deleted = deleted
        self._pending = []
        self.file_size = len(data)
        self.fsyncs += 1
        self.unsynced = False


# ---------------------------------------------------------------------------
# The persistence engine
# ---------------------------------------------------------------------------


_FALLOCATE_WORKS = [True]


def _fallocate_keep_size(fd: int, offset: int, length: int) -> int:
    """fallocate(FALLOC_FL_KEEP_SIZE); 0 or an errno."""
    try:
        libc = _libc()
        if libc is None:
            return errno.EOPNOTSUPP
        if libc.fallocate(fd, 1, ctypes.c_longlong(offset), ctypes.c_longlong(length)) == 0:
            return 0
        return ctypes.get_errno() or errno.EIO
    except (AttributeError, OSError):
        return errno.EOPNOTSUPP


_LIBC: list[Any] = []


def _libc() -> Any:
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.fallocate.argtypes = [
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_longlong,
                ctypes.c_longlong,
            ]
            _LIBC.append(libc)
        except (AttributeError, OSError):
            _LIBC.append(None)
    return _LIBC[0]


def _stream_nexts(state: ServerState) -> dict[bytes, int]:
    return {k: v.next_offset for k, v in state.keyspace.data.items() if not isinstance(v, bytes)}


def _close_in_background(fd: int) -> None:
    """Close an fd off the event loop: closing the last fd of a replaced AOF
    frees all its blocks, which takes long for a big file (Redis closes it
    in a background thread for the same reason)."""

    def close() -> None:
        with contextlib.suppress(OSError):
            os.close(fd)

    threading.Thread(target=close, name="rcp11-close", daemon=True).start()


def _resolve_dir(configured: str) -> str:
    # The server chdir()s into `dir` before persistence starts (as Redis
    # does), so a relative `dir` names the current directory by then;
    # in-process users that did not chdir get it resolved normally.
    if os.path.isabs(configured):
        return configured
    if os.path.isdir(configured) and not os.path.samefile(configured, "."):
        return os.path.abspath(configured)
    return os.getcwd()


class _Child:
    def __init__(self, kind: str, pid: int, tmp_path: str) -> None:
        self.kind = kind  # "rdb" | "aof"
        self.pid = pid
        self.tmp_path = tmp_path
        self.started = time.time()
        self.dirty_at_fork = 0
        self.removal_seq_at_fork = 0
        self.stream_keys: dict[bytes, int] = {}  # stream -> next offset at fork
        # AOF rewrite, after the child exited: moving the tail in.
        self.finishing = False
        self.fd = -1
        self.base_size = 0
        self.tail_written = 0
        self.sync_thread: threading.Thread | None = None
        self.sync_error: str | None = None

    def sync_in_background(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            self.sync_error = f"fdatasync: {exc.strerror or exc}"


Replay = Callable[[ServerState, ClientState, list[bytes]], Any]


class Persistence:
    """PersistenceHooks for a real server: snapshot + AOF + reservations.

    replay: how a logged command is run again while the AOF loads (the
    command layer's execute; given by whoever builds the server, so this
    package needs nothing above the state)."""

    def __init__(self, state: ServerState, replay: Replay) -> None:
        self.state = state
        self._replay_command = replay
        config = state.config
        self.dir = _resolve_dir(str(config.get("dir")))
        self.snapshot_path = os.path.join(self.dir, str(config.get("dbfilename")))
        self.aof_path = os.path.join(self.dir, str(config.get("appendfilename")))
        self.reservations = OffsetReservations(
            os.path.join(self.dir, offsets_name(str(config.get("dbfilename"))))
        )
        # AOF: "off", "on", or "wait_rewrite" (turned on at runtime; its
        # first file is being written by a rewrite child).
        self.aof_state = "off"
        self._aof_fd = -1
        self._aof_buf: list[bytes] = []
        self._aof_buf_len = 0
        self._rewrite_buf: list[bytes] | None = None
        self._rewrite_buf_len = 0
        self.aof_current_size = 0
        self.aof_base_size = 0
        self._aof_written = 0  # bytes handed to the kernel (all files, monotonic)
        self._aof_synced = 0  # bytes known fsynced
        self._aof_error: str | None = None
        self.aof_last_write_status = "ok"
        self.aof_last_bgrewrite_status = "ok"
        self.aof_last_rewrite_time_sec = -1
        self.aof_rewrite_scheduled = False
        self.rdb_bgsave_scheduled = False
        self._rewrite_not_before = 0.0
        self.aof_rewrites = 0
        self.aof_delayed_fsync = 0
        self.latest_fork_usec = 0
        self._aof_reserved_until = 0  # file offset up to which blocks are preallocated
        self._aof_space_low = False
        # The everysec fsync thread and the fd hand-over with it.
        self._lock = threading.Lock()
        self._fsync_fd = -1  # fd the thread is fsyncing right now
        self._fsync_target = 0  # _aof_written when that fsync started
        self._fsync_error: str | None = None
        self._deferred_close: list[int] = []
        self._thread: threading.Thread | None = None
        self._thread_stop = threading.Event()
        # Snapshots.
        self._lastsave = int(time.time())
        self.rdb_last_bgsave_status = "ok"
        self.rdb_last_bgsave_time_sec = -1
        self.rdb_saves = 0
        self._last_bgsave_try = 0.0
        self._snapshot_stream_keys: set[bytes] = set()
        self._child: _Child | None = None
        # Reservations: drops waiting until the deletion is durable.
        self._removal_seq = 0
        self._snapshot_removal_seq = 0  # removals the on-disk snapshot already reflects
        self._drops: list[tuple[bytes, int, int | None]] = []  # key, seq, aof position
        self._reservation_error: str | None = None
        self.loading = False
        config.on_change("appendonly", self._on_appendonly_change)
        config.on_change("appendfsync", self._on_appendfsync_change)
        config.on_change("dir", self._on_paths_change)
        config.on_change("dbfilename", self._on_paths_change)

    # -- configuration ---------------------------------------------------

    def _conf(self, name: str) -> Any:
        return self.state.config.get(name)

    def _save_rules(self) -> list[tuple[int, int]]:
        rules = self._conf("save") or []
        if isinstance(rules, str):
            numbers = rules.split()
            return [(int(a), int(b)) for a, b in zip(numbers[::2], numbers[1::2], strict=False)]
        return [(int(seconds), int(changes)) for seconds, changes in rules]

    def _yes(self, name: str) -> bool:
        value = self._conf(name)
        if isinstance(value, str):
            return value.lower() == "yes"
        return bool(value)

    def _fsync_mode(self) -> str:
        return str(self._conf("appendfsync")).lower()

    # -- start-up --------------------------------------------------------

    def load(self) -> None:
        """Load snapshot or AOF, then apply offset reservations. Raises
        PersistenceError naming the file and the problem."""
        state = self.state
        self.lock_dir()
        self._remove_temp_files()
        state.loading = self.loading = True
        started = time.monotonic()
        try:
            # Read first: a damaged offsets file refuses the start before
            # the AOF loader truncates anything.
            self.reservations.load()
            if self._yes("appendonly"):
                if os.path.exists(self.aof_path):
                    self._load_aof()
                elif os.path.exists(self.snapshot_path):
                    self._snapshot_stream_keys = set(self._load_snapshot_file())
            elif os.path.exists(self.snapshot_path):
                self._snapshot_stream_keys = set(self._load_snapshot_file())
            if self.reservations.header_torn:
                self._mark_streams_after_torn_header()
            # Never trust that the files hold every acknowledged write (the
            # module docstring): every stream goes up to its mark.
            raises = self._apply_reservations()
        finally:
            state.loading = self.loading = False
        log.info(
            "DB loaded from disk: %d keys in %.3f seconds",
            len(state.keyspace),
            time.monotonic() - started,
        )
        if self._yes("appendonly"):
            if not os.path.exists(self.aof_path):
                # First start with the AOF on: its base must hold what the
                # snapshot had before anything is appended to it.
                self._write_aof_base_sync()
            self._open_aof()
            self.aof_state = "on"
            for key, mark in raises:
                self.propagate([RAISE_NEXT, key, b"%d" % mark])
            if raises and not self._flush_aof(force_fsync=True):
                raise PersistenceError(f"{self.aof_path}: cannot append: {self._aof_error}")
            self._start_fsync_thread()
        state.dirty = 0

    def lock_dir(self) -> None:
        """Take the data directory (rcp11/datafiles.py) before any file in it
        is touched: a second server there would delete this one's temporary
        files and write over its AOF. Raises PersistenceError naming the
        process that holds it."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            lock_data_dir(self.dir)
        except DirectoryInUse as exc:
            raise PersistenceError(f"Can't start: {exc}") from None
        except OSError as exc:
            raise PersistenceError(
                f"{self.dir}: cannot lock the data directory: {exc.strerror or exc}"
            ) from exc

    def _remove_temp_files(self) -> None:
        with contextlib.suppress(OSError):
            for name in os.listdir(self.dir):
                if name.startswith(TEMP_PREFIXES):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.dir, name))

    def _load_snapshot_file(self) -> list[bytes]:
        path = self.snapshot_path
        try:
            with open(path, "rb", buffering=1 << 20) as file:
                size = os.fstat(file.fileno()).st_size
                reader = _CrcReader(file, path, size)
                keys = read_snapshot(reader, self.state)
                if reader.pos != size:
                    raise reader.fail("corrupt file (bytes after the checksum)")
        except OSError as exc:
            raise PersistenceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        log.info("Snapshot %s loaded: %d keys", path, len(self.state.keyspace))
        return keys

    def _load_aof(self) -> None:
        """Replay the AOF; a torn tail is cut off (aof-load-truncated) or
        refuses the start."""
        execute = self._replay_command
        path = self.aof_path
        state = self.state
        client = ClientState(addr="aof-loader", authenticated=True, resp=2)
        try:
            file = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed by `with` below
        except OSError as exc:
            raise PersistenceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        with file:
            size = os.fstat(file.fileno()).st_size
            start = 0
            head = file.read(len(SNAP_MAGIC))
            file.seek(0)
            if head == SNAP_MAGIC:
                reader = _CrcReader(file, path, size)
                read_snapshot(reader, state)
                start = reader.pos
            self.aof_base_size = start
            # Commands of an open MULTI wait here until their EXEC is read.
            pending: list[list[bytes]] | None = None
            multi_at = 0
            valid = start
            torn_at: int | None = None
            try:
                for argv, at, end in iter_aof_commands(file, start):
                    name = argv[0].lower()
                    if pending is not None:
                        if name == b"exec":
                            self._replay(execute, client, [b"MULTI"], path, multi_at)
                            for queued in pending:
                                self._replay(execute, client, queued, path, multi_at)
                            self._replay(execute, client, argv, path, multi_at)
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
                        self._replay_raise(argv, path, at)
                    else:
                        self._replay(execute, client, argv, path, at)
                    valid = end
            except _BadBytes as exc:
                raise PersistenceError(
                    f"{path}: corrupt AOF at byte offset {exc.offset} ({exc.problem}); "
                    "refusing to start"
                ) from None
            except _TornTail as exc:
                torn_at = exc.offset
            if pending is not None and torn_at is None:
                torn_at = multi_at  # a transaction without its EXEC
        if torn_at is not None:
            cut = valid
            if not self._yes("aof-load-truncated"):
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
        log.info("AOF %s loaded: %d keys", path, len(state.keyspace))

    def _replay(
        self,
        execute: Callable[[ServerState, ClientState, list[bytes]], Any],
        client: ClientState,
        argv: list[bytes],
        path: str,
        at: int,
    ) -> None:
        reply = execute(self.state, client, argv)
        if isinstance(reply, Error):
            name = argv[0].decode("utf-8", "replace")
            raise PersistenceError(
                f"{path}: command {name!r} at byte offset {at} failed on replay: "
                f"{reply.message}; refusing to start"
            )

    def _replay_raise(self, argv: list[bytes], path: str, at: int) -> None:
        # Written only by this module as RAISE-NEXT key offset, offset in
        # 0..2^63 (a stream at the ceiling has next offset 2^63).
        problem = None
        if len(argv) != 3:
            problem = f"{len(argv) - 1} arguments instead of 2"
        elif not argv[2].isdigit() or int(argv[2]) > NEXT_OFFSET_CEILING:
            problem = f"offset {argv[2][:30]!r} is not an integer from 0 to 2^63"
        elif isinstance(self.state.keyspace.data.get(argv[1]), bytes):
            problem = "the key holds a string"
        if problem is not None:
            raise PersistenceError(
                f"{path}: bad {RAISE_NEXT.decode()} record at byte offset {at} ({problem}); "
                "refusing to start"
            )
        self._raise_stream(argv[1], int(argv[2]))

    def _raise_stream(self, key: bytes, mark: int) -> bool:
        """Make key's stream have next offset >= mark. Returns whether that
        changed anything. A non-stream key is left alone."""
        keyspace = self.state.keyspace
        value = keyspace.data.get(key)
        if isinstance(value, bytes):
            return False
        if value is None:
            value = self.state.new_stream()
            if mark > 0:
                value.raise_next_offset(mark)
            keyspace.set(key, value)
            return True
        if value.next_offset < mark:
            value.raise_next_offset(mark)
            keyspace.touch(key)
            return True
        return False

    def _mark_streams_after_torn_header(self) -> None:
        """The offsets file was cut inside its header, so no mark is known.
        A crash while creating it leaves that, and then no stream has
        reserved anything yet; but a damaged file looks the same, so, as
        for a torn last batch, every stream the files brought back gets a
        mark TORN_BATCH_MARGIN above its next offset, durably."""
        reservations = self.reservations
        raised = 0
        for key, value in self.state.keyspace.data.items():
            if isinstance(value, bytes):
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

    def _apply_reservations(self) -> list[tuple[bytes, int]]:
        """Raise every reserved stream to its mark (module docstring).
        Returns the raises, for the AOF."""
        reservations = self.reservations
        live, deleted = reservations.marks, reservations.deleted
        raised: list[tuple[bytes, int]] = []
        stale: list[bytes] = []
        revived: list[tuple[bytes, int]] = []
        for key in [*live, *(k for k in deleted if k not in live)]:
            value = self.state.keyspace.data.get(key)
            if isinstance(value, bytes):
                stale.append(key)  # the stream was replaced by a string durably
                continue
            if value is None and key not in live:
                stale.append(key)  # deleted, and the files hold its deletion
                continue
            mark = live.get(key, 0)
            if value is not None and key in deleted:
                # Its deletion did not reach the files: the old stream is
                # back and must go up to its old mark too.
                mark = max(mark, deleted[key])
                revived.append((key, mark))
            if self._raise_stream(key, mark):
                raised.append((key, mark))
                log.warning(
                    "Stream %r: next offset raised to its reservation %d (writes after the "
                    "last durable point were lost; their offsets read as null)",
                    key,
                    mark,
                )
        for key in stale:
            reservations.queue_drop(key)
        for key, mark in revived:
            reservations.revive(key, mark)
        return raised

    def _write_aof_base_sync(self) -> None:
        tmp = os.path.join(self.dir, f"{REWRITE_TEMP_PREFIX}{os.getpid()}.aof")
        try:
            size = _write_snapshot_file(self.state, self.aof_path, tmp)
        except OSError as exc:
            raise PersistenceError(f"{self.aof_path}: cannot create: {exc.strerror}") from exc
        self.aof_base_size = size

    def _open_aof(self) -> None:
        fd = os.open(self.aof_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.aof_current_size = os.fstat(fd).st_size
        # As Redis: growth for auto-aof-rewrite counts from the size at start.
        self.aof_base_size = self.aof_current_size
        with self._lock:
            self._aof_fd = fd
        self._aof_reserved_until = 0
        self._reserve_aof_space()

    def _reserve_aof_space(self) -> bool:
        """Preallocate disk blocks past the AOF's end (without changing its
        size), so that a full disk shows up here, before a write command
        runs, instead of as a failed write of a command that already ran.
        False when the disk has no room for even the smallest slice."""
        if not _FALLOCATE_WORKS[0] or self._aof_fd < 0:
            return True
        end = self.aof_current_size + self._aof_buf_len
        for size in AOF_SPACE_SLICES:
            result = _fallocate_keep_size(self._aof_fd, end, size)
            if result == 0:
                self._aof_reserved_until = end + size
                if self._aof_space_low:
                    log.warning("The disk of %s has room again: accepting writes.", self.aof_path)
                    self._aof_space_low = False
                    if self._aof_error is None:
                        self.aof_last_write_status = "ok"
                return True
            if result != errno.ENOSPC:
                _FALLOCATE_WORKS[0] = False  # not supported here: rely on write errors
                return True
        if not self._aof_space_low:
            log.warning(
                "No room left on the disk of %s: refusing writes until there is", self.aof_path
            )
            self._aof_space_low = True
            self.aof_last_write_status = "err"
        return False

    def _release_preallocated(self) -> None:
        # Truncating to the current size gives back the blocks reserved past
        # the end, so a stopped server does not keep them.
        if self._aof_fd >= 0 and not self._aof_buf:
            with contextlib.suppress(OSError):
                os.ftruncate(self._aof_fd, os.fstat(self._aof_fd).st_size)
        self._aof_reserved_until = 0

    # -- hooks called by the command layer and the server -----------------

    def propagate(self, argv: list[bytes]) -> None:
        if self.aof_state == "off":
            return
        data = encode_command(argv)
        if self.aof_state == "on":
            self._aof_buf.append(data)
            self._aof_buf_len += len(data)
        if self._rewrite_buf is not None:
            self._rewrite_buf.append(data)
            self._rewrite_buf_len += len(data)

    def propagate_encoded(self, data: bytes) -> None:
        if self.aof_state == "off":
            return
        if self.aof_state == "on":
            self._aof_buf.append(data)
            self._aof_buf_len += len(data)
        if self._rewrite_buf is not None:
            self._rewrite_buf.append(data)
            self._rewrite_buf_len += len(data)

    def aof_room(self) -> int:
        if self.aof_state != "on":
            return MAX_OFFSET
        # write_refused() reserves more once this margin is reached.
        used = self.aof_current_size + self._aof_buf_len + AOF_SPACE_MARGIN
        return max(self._aof_reserved_until - used, 0)

    def reserved_next_offset(self, key: bytes) -> int:
        if self.loading:
            return MAX_OFFSET
        mark = self.reservations.marks.get(key)
        return -1 if mark is None else mark

    def flush(self) -> bool:
        """Hand buffered AOF commands to the kernel (fsync with `always`).
        Returns False when that failed: the caller must not send the replies
        of this iteration's write commands as successes."""
        ok = True
        if self.reservations.unsynced:
            try:
                self.reservations.sync()
            except OSError as exc:
                self._set_reservation_error(exc)
                ok = False
        if self.reservations.pending:
            # Deleted-stream records before the AOF gets the DEL: a kill -9
            # in between must not leave a DEL whose key comes back at its
            # mark (the reverse order only costs a gap).
            self.reservations.write_best_effort([])
        if self._aof_buf:
            ok = self._flush_aof(force_fsync=self._fsync_mode() == "always") and ok
        if self._drops:
            self._settle_drops()
        return ok

    def _flush_aof(self, force_fsync: bool) -> bool:
        if self._aof_buf:
            data = b"".join(self._aof_buf) if len(self._aof_buf) > 1 else self._aof_buf[0]
            try:
                written = write_all(self._aof_fd, data)
            except OSError as exc:
                written = getattr(exc, "written", 0)
                rest = data[written:]
                self._aof_buf = [rest]
                self._aof_buf_len = len(rest)
                self._aof_written += written
                self.aof_current_size += written
                self._set_aof_error(f"write: {exc.strerror or exc}")
                return False
            self._aof_buf = []
            self._aof_buf_len = 0
            self._aof_written += written
            self.aof_current_size += written
        if force_fsync:
            try:
                os.fsync(self._aof_fd)
            except OSError as exc:
                self._set_aof_error(f"fsync: {exc.strerror or exc}")
                return False
            self._aof_synced = self._aof_written
        if self._aof_error is not None and self._fsync_error is None:
            log.warning("AOF write error looks solved, rcp11 can write again.")
            self._aof_error = None
            self.aof_last_write_status = "ok"
        return True

    def _set_aof_error(self, problem: str) -> None:
        if self._aof_error is None:
            log.warning(
                "Error writing to the AOF file %s (%s): refusing writes until it works",
                self.aof_path,
                problem,
            )
        self._aof_error = problem
        self.aof_last_write_status = "err"

    def before_stream_write(self, key: bytes, new_next_offset: int) -> None:
        if self.loading:
            return
        reservations = self.reservations
        mark = reservations.marks.get(key)
        if mark is not None and min(new_next_offset, MAX_OFFSET) <= mark:
            return
        value = self.state.keyspace.data.get(key)
        current = 0 if value is None or isinstance(value, bytes) else value.next_offset
        try:
            reservations.reserve(key, new_next_offset, current)
        except OSError as exc:
            self._set_reservation_error(exc)
            raise CommandError(errors.MISCONF) from exc
        if self._reservation_error is not None:
            log.warning("Offsets file %s can be written again.", reservations.path)
            self._reservation_error = None

    def _set_reservation_error(self, exc: OSError) -> None:
        if self._reservation_error is None:
            log.warning(
                "Cannot write the offsets file %s (%s): refusing writes until it works",
                self.reservations.path,
                exc.strerror or exc,
            )
        self._reservation_error = exc.strerror or str(exc)

    def on_key_removed(self, key: bytes) -> None:
        if self.loading or not self.reservations.delete(key):
            return
        self._removal_seq += 1
        self._drops.append((key, self._removal_seq, None))

    def _settle_drops(self) -> None:
        """Forget the marks of deleted streams whose deletion is now durable
        (module docstring); a key deleted again meanwhile waits for that."""
        keep: list[tuple[bytes, int, int | None]] = []
        aof_on = self.aof_state != "off"
        for key, seq, pos in self._drops:
            if aof_on:
                if pos is None:
                    # flush() runs after the DEL was propagated: once the
                    # file is synced up to here, the DEL is durable.
                    pos = self._aof_written + self._aof_buf_len
                durable = self._aof_synced >= pos
            else:
                # No snapshot on disk, or about to be on disk, holds the key.
                child = self._child
                durable = seq <= self._snapshot_removal_seq or (
                    key not in self._snapshot_stream_keys
                    and (child is None or child.kind != "rdb" or key not in child.stream_keys)
                )
            if not durable:
                keep.append((key, seq, pos))
        waiting = {key for key, _seq, _pos in keep}
        for key, _seq, _pos in self._drops:
            if key not in waiting:
                self.reservations.forget_deleted(key)
        self._drops = keep
        # Into the page cache now, so that a kill -9 right after the DEL
        # became durable does not bring the stream back empty. No fsync: a
        # lost record only leaves an empty stream with a gap.
        self.reservations.write_best_effort([])

    def write_refused(self) -> str | None:
        if self._aof_error is not None or self._reservation_error is not None:
            return errors.MISCONF
        if (
            self.aof_state == "on"
            and self.aof_current_size + self._aof_buf_len + AOF_SPACE_MARGIN
            > self._aof_reserved_until
            and not self._reserve_aof_space()
        ):
            return errors.MISCONF
        if (
            self.rdb_last_bgsave_status == "err"
            and self._save_rules()
            and self._yes("stop-writes-on-bgsave-error")
        ):
            return errors.MISCONF
        return None

    def info(self) -> dict[str, Any]:
        now = time.time()
        child = self._child
        rdb_child = child is not None and child.kind == "rdb"
        aof_child = child is not None and child.kind == "aof"
        fields: dict[str, Any] = {
            "loading": int(self.loading),
            "async_loading": 0,
            "rdb_changes_since_last_save": self.state.dirty,
            "rdb_bgsave_in_progress": int(rdb_child),
            "rdb_last_save_time": self._lastsave,
            "rdb_last_bgsave_status": self.rdb_last_bgsave_status,
            "rdb_last_bgsave_time_sec": self.rdb_last_bgsave_time_sec,
            "rdb_current_bgsave_time_sec": int(now - child.started) if rdb_child else -1,
            "rdb_saves": self.rdb_saves,
            "aof_enabled": int(self.aof_state != "off"),
            "aof_rewrite_in_progress": int(aof_child),
            "aof_rewrite_scheduled": int(self.aof_rewrite_scheduled),
            "aof_last_rewrite_time_sec": self.aof_last_rewrite_time_sec,
            "aof_current_rewrite_time_sec": int(now - child.started) if aof_child else -1,
            "aof_last_bgrewrite_status": self.aof_last_bgrewrite_status,
            "aof_rewrites": self.aof_rewrites,
            "aof_last_write_status": self.aof_last_write_status,
            "latest_fork_usec": self.latest_fork_usec,
        }
        if self.aof_state != "off":
            fields.update(
                {
                    "aof_current_size": self.aof_current_size,
                    "aof_base_size": self.aof_base_size,
                    "aof_pending_rewrite": int(self.aof_rewrite_scheduled),
                    "aof_buffer_length": self._aof_buf_len,
                    "aof_pending_bio_fsync": int(self._fsync_fd >= 0),
                    "aof_delayed_fsync": self.aof_delayed_fsync,
                }
            )
        fields["offset_reservations"] = len(self.reservations.marks)
        fields["offset_reservation_fsyncs"] = self.reservations.fsyncs
        return fields

    def tick(self, now: float) -> None:
        now = time.time()  # whatever clock the caller uses, save rules use wall time
        self._reap_child()
        self._close_deferred_fds()
        if self._fsync_error is not None:
            self._set_aof_error(self._fsync_error)
            self._fsync_error = None
        if self._aof_error is not None and self.aof_state == "on":
            self._flush_aof(force_fsync=True)
        if self._drops:
            self._settle_drops()
        try:
            self.reservations.sync()
            if self.reservations.pending:
                self.reservations.write([], durable=False)
            self.reservations.compact_if_large()
            if self._reservation_error is not None:
                self.reservations.write([], durable=True)
                log.warning("Offsets file %s can be written again.", self.reservations.path)
                self._reservation_error = None
        except OSError as exc:
            self._set_reservation_error(exc)
        if self._child is None:
            self._maybe_start_child(now)

    def _maybe_start_child(self, now: float) -> None:
        if self.aof_rewrite_scheduled and time.monotonic() >= self._rewrite_not_before:
            self._start_rewrite()
            return
        if self.rdb_bgsave_scheduled:
            self.rdb_bgsave_scheduled = False
            if self._start_bgsave():
                return
        for seconds, changes in self._save_rules():
            if (
                self.state.dirty >= changes
                and now - self._lastsave > seconds
                and (
                    self.rdb_last_bgsave_status == "ok"
                    or now - self._last_bgsave_try > _BGSAVE_RETRY_DELAY
                )
            ):
                log.info("%d changes in %d seconds. Saving...", changes, seconds)
                self._start_bgsave()
                return
        if self.aof_state == "on" and self._aof_error is None:
            percentage = int(self._conf("auto-aof-rewrite-percentage") or 0)
            min_size = int(self._conf("auto-aof-rewrite-min-size") or 0)
            base = self.aof_base_size or 1
            if (
                percentage > 0
                and self.aof_current_size > min_size
                and (self.aof_current_size - base) * 100 // base >= percentage
                and time.monotonic() >= self._rewrite_not_before
            ):
                log.info(
                    "Starting automatic rewriting of AOF on %d%% growth",
                    (self.aof_current_size - base) * 100 // base,
                )
                self._start_rewrite()

    # -- commands --------------------------------------------------------

    def lastsave(self) -> int:
        """LASTSAVE: unix time of the last successful snapshot."""
        return self._lastsave

    def save(self) -> str:
        """SAVE: a synchronous snapshot."""
        if self._child is not None and self._child.kind == "rdb":
            raise CommandError(errors.BGSAVE_IN_PROGRESS)
        if self._save_sync():
            return "OK"
        raise CommandError(errors.SAVE_FAILED)

    def _save_sync(self) -> bool:
        tmp = os.path.join(self.dir, f"{SNAPSHOT_TEMP_PREFIX}{os.getpid()}.snap")
        keys = _stream_nexts(self.state)
        started = time.monotonic()
        try:
            _write_snapshot_file(self.state, self.snapshot_path, tmp)
        except OSError as exc:
            log.warning("Failed saving the DB to %s: %s", self.snapshot_path, exc.strerror or exc)
            self.rdb_last_bgsave_status = "err"
            return False
        log.info("DB saved on disk in %.3f seconds", time.monotonic() - started)
        self._snapshot_done(self.state.dirty, keys, self._removal_seq)
        return True

    def _snapshot_done(self, dirty_at_start: int, keys: dict[bytes, int], removal_seq: int) -> None:
        self.state.dirty = max(0, self.state.dirty - dirty_at_start)
        self._lastsave = int(time.time())
        self.rdb_last_bgsave_status = "ok"
        self.rdb_saves += 1
        self._snapshot_stream_keys = set(keys)
        self._snapshot_removal_seq = removal_seq
        self._settle_drops()
        # Also with the AOF on: a restart may come without it (appendonly
        # switched off), and a stream written after the snapshot reserves
        # above its lowered mark again before any reply.
        self._tighten_after_snapshot(keys)

    def _tighten_after_snapshot(self, nexts: dict[bytes, int]) -> None:
        """The snapshot just written is what the next start loads. A stream
        not written since it was taken has every offset it ever handed out
        below its next offset in that file: its mark can come down to that,
        so a crash right after SAVE/BGSAVE leaves no gap. Not fsynced: if
        the lowering is lost, the old (higher) mark only means a gap."""
        marks = self.reservations.marks
        lowered: list[tuple[bytes, int]] = []
        for key, next_offset in nexts.items():
            value = self.state.keyspace.data.get(key)
            if (
                value is not None
                and not isinstance(value, bytes)
                and value.next_offset == next_offset
                and marks.get(key, -1) > next_offset
            ):
                lowered.append((key, next_offset))
        if lowered and self.reservations.write_best_effort([(k, m, False) for k, m in lowered]):
            for key, next_offset in lowered:
                marks[key] = next_offset

    def bgsave(self, schedule: bool = False) -> str:
        if self._child is not None:
            if self._child.kind == "rdb":
                raise CommandError(errors.BGSAVE_IN_PROGRESS)
            if schedule:
                # Started by the cron once the AOF rewrite is done.
                self.rdb_bgsave_scheduled = True
                return "Background saving scheduled"
            raise CommandError(errors.BGSAVE_CHILD_ACTIVE)
        if not self._start_bgsave():
            raise CommandError(errors.BGSAVE_FORK_FAILED)
        return "Background saving started"

    def flushall(self) -> None:
        """After FLUSHALL, as redis-server does: a BGSAVE in progress is
        killed (its snapshot holds the flushed data), and with save points
        configured the empty dataset is saved at once, so a crash cannot
        bring the flushed keys back."""
        if self._child is not None and self._child.kind == "rdb":
            log.info("Killing the background save: FLUSHALL makes its snapshot stale")
            self._kill_child()
        self.rdb_bgsave_scheduled = False
        if self._save_rules():
            dirty = self.state.dirty
            self._save_sync()
            # The flush still counts as a change, as Redis keeps it.
            self.state.dirty = dirty

    def bgrewriteaof(self) -> str:
        if self._child is not None and self._child.kind == "aof":
            raise CommandError(errors.REWRITE_IN_PROGRESS)
        if self._child is not None:
            self.aof_rewrite_scheduled = True
            self._rewrite_not_before = 0.0
            return "Background append only file rewriting scheduled"
        if not self._start_rewrite():
            raise CommandError(errors.REWRITE_FAILED)
        return "Background append only file rewriting started"

    def shutdown(self, mode: str | None = None) -> bool:
        """Prepare to exit: finish the AOF, save if asked (or if save rules
        exist and mode is not "nosave"), write tight reservations. Returns
        False when the required save failed (the server must not exit)."""
        mode = mode.lower() if mode else None
        self._kill_child()
        with contextlib.suppress(OSError):
            self.reservations.sync()
        durable = False
        if self.aof_state == "on":
            if self._flush_aof(force_fsync=True):
                durable = True
            else:
                log.warning("Error flushing the AOF on shutdown: %s", self._aof_error)
        self._stop_fsync_thread()
        if mode == "save" or (mode != "nosave" and self._save_rules()):
            log.info("Saving the final snapshot before exiting.")
            if not self._save_sync():
                log.warning("Error trying to save the DB, can't exit.")
                if self.aof_state == "on":
                    self._start_fsync_thread()  # we keep running
                return False
            durable = durable or self.aof_state == "off"
        elif self.aof_state == "off" and not os.path.exists(self.snapshot_path):
            durable = True  # nothing on disk can come back with older offsets
        self._write_tight_reservations(durable)
        if self._aof_fd >= 0:
            self._release_preallocated()
            with contextlib.suppress(OSError):
                os.close(self._aof_fd)
            self._aof_fd = -1
        self.reservations.close()
        return True

    def _write_tight_reservations(self, durable: bool) -> None:
        """Marks = each stream's next offset, so a clean restart shows no
        gap. Deleted streams whose deletion is not durable keep their old
        marks: such a stream may come back from disk."""
        marks: dict[bytes, int] = {}
        for key, value in self.state.keyspace.data.items():
            if not isinstance(value, bytes):
                marks[key] = max(value.next_offset, 0)
        deleted = {} if durable else dict(self.reservations.deleted)
        try:
            self.reservations.rewrite(marks, deleted)
        except OSError as exc:
            log.warning("Cannot rewrite the offsets file on shutdown: %s", exc.strerror or exc)

    # -- background children ---------------------------------------------

    def _fork(self, kind: str, tmp_path: str, body: Callable[[], None]) -> _Child | None:
        forked_at = time.perf_counter()
        try:
            pid = os.fork()
        except OSError as exc:
            log.warning("Can't fork for the %s child: %s", kind, exc.strerror)
            return None
        if pid:
            self.latest_fork_usec = int((time.perf_counter() - forked_at) * 1e6)
        if pid == 0:
            code = 1
            try:
                _die_with_parent()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                body()
                code = 0
            except BaseException as exc:  # noqa: BLE001 - the child reports and exits
                with contextlib.suppress(Exception):
                    log.warning("%s child failed: %s", kind, exc)
            finally:
                os._exit(code)
        child = _Child(kind, pid, tmp_path)
        child.dirty_at_fork = self.state.dirty
        child.removal_seq_at_fork = self._removal_seq
        child.stream_keys = _stream_nexts(self.state)
        self._child = child
        return child

    def _start_bgsave(self) -> bool:
        self._last_bgsave_try = time.time()
        tmp = os.path.join(self.dir, f"{SNAPSHOT_TEMP_PREFIX}{int(time.time() * 1000)}.snap")
        state = self.state

        def body() -> None:
            _write_snapshot_file(state, self.snapshot_path, tmp)

        child = self._fork("rdb", tmp, body)
        if child is None:
            self.rdb_last_bgsave_status = "err"
            return False
        log.info("Background saving started by pid %d", child.pid)
        return True

    def _start_rewrite(self) -> bool:
        if self._child is not None:
            self.aof_rewrite_scheduled = True
            return True
        # The child's snapshot must cover everything in the AOF buffer.
        if self.aof_state == "on" and not self._flush_aof(force_fsync=False):
            return False
        tmp = os.path.join(self.dir, f"{REWRITE_TEMP_PREFIX}{int(time.time() * 1000)}.aof")
        state = self.state

        def body() -> None:
            with open(tmp, "wb", buffering=1 << 20) as file:
                write_snapshot(_CrcWriter(file), state)
                file.flush()
                os.fsync(file.fileno())

        self._rewrite_buf = []
        self._rewrite_buf_len = 0
        child = self._fork("aof", tmp, body)
        if child is None:
            self._rewrite_buf = None
            self.aof_last_bgrewrite_status = "err"
            return False
        self.aof_rewrite_scheduled = False
        log.info("Background append only file rewriting started by pid %d", child.pid)
        return True

    def _reap_child(self) -> None:
        child = self._child
        if child is None:
            return
        if child.finishing:
            self._advance_rewrite_finish(child)
            return
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = child.pid, 1 << 8  # reaped elsewhere: treat as failed
        if pid == 0:
            return
        self._child = None
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        elapsed = int(time.time() - child.started)
        if child.kind == "rdb":
            self.rdb_last_bgsave_time_sec = elapsed
            if ok:
                log.info("Background saving terminated with success")
                self._snapshot_done(
                    child.dirty_at_fork, child.stream_keys, child.removal_seq_at_fork
                )
            else:
                log.warning("Background saving error")
                self.rdb_last_bgsave_status = "err"
                with contextlib.suppress(OSError):
                    os.unlink(child.tmp_path)
            return
        self.aof_last_rewrite_time_sec = elapsed
        if not ok:
            self._rewrite_failed(child, "the child failed")
            return
        if self.aof_state == "off":
            self._rewrite_buf = None
            with contextlib.suppress(OSError):
                os.unlink(child.tmp_path)
            return
        try:
            child.fd = os.open(child.tmp_path, os.O_WRONLY | os.O_APPEND)
            child.base_size = os.fstat(child.fd).st_size
        except OSError as exc:
            self._rewrite_failed(child, f"can't open {child.tmp_path}: {exc.strerror}")
            return
        # Stays the current child (a rewrite "in progress") until the tail
        # of commands written meanwhile is in the new file.
        child.finishing = True
        self._child = child
        self._advance_rewrite_finish(child)

    def _rewrite_failed(self, child: _Child, why: str) -> None:
        log.warning("Background AOF rewrite failed: %s", why)
        self._child = None
        self.aof_last_bgrewrite_status = "err"
        self._rewrite_buf = None
        self._rewrite_buf_len = 0
        if child.fd >= 0:
            _close_in_background(child.fd)
            child.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(child.tmp_path)
        if self.aof_state == "wait_rewrite":
            self.aof_rewrite_scheduled = True
        self._rewrite_not_before = time.monotonic() + _REWRITE_RETRY_DELAY

    def _advance_rewrite_finish(self, child: _Child) -> None:
        """Move the commands logged during the rewrite into the new file a
        bounded slice per cron tick, with fdatasync in a background thread,
        so that only a small remainder is written and fsynced on the event
        loop when the files are swapped."""
        if child.sync_error is not None:
            self._rewrite_failed(child, child.sync_error)
            return
        syncing = child.sync_thread is not None and child.sync_thread.is_alive()
        buf = self._rewrite_buf if self._rewrite_buf is not None else []
        if self._rewrite_buf_len > _FINISH_SMALL:
            taken = 0
            count = 0
            while count < len(buf) and taken < _FINISH_STEP:
                taken += len(buf[count])
                count += 1
            data = b"".join(buf[:count])
            del buf[:count]
            try:
                write_all(child.fd, data)
            except OSError as exc:
                self._rewrite_failed(child, f"write: {exc.strerror or exc}")
                return
            self._rewrite_buf_len -= taken
            child.tail_written += taken
            if not syncing:
                child.sync_thread = threading.Thread(
                    target=child.sync_in_background, name="rcp11-rewrite-sync", daemon=True
                )
                child.sync_thread.start()
            return
        if syncing:
            return  # at most until the next tick
        if self._finish_rewrite(child):
            self._child = None
            self.aof_last_bgrewrite_status = "ok"
            self.aof_rewrites += 1
            log.info("Background AOF rewrite finished successfully")
        else:
            self._rewrite_failed(child, "can't swap the files")

    def _finish_rewrite(self, child: _Child) -> bool:
        """Append the last commands, fsync, swap the new file in."""
        tail = b"".join(self._rewrite_buf or [])
        fd = child.fd
        try:
            write_all(fd, tail)
            os.fsync(fd)
            # Hold the old file open so that its blocks are freed by a
            # background close, not inside rename() on the event loop.
            try:
                old_fd = os.open(self.aof_path, os.O_RDONLY)
            except OSError:
                old_fd = -1
            try:
                os.replace(child.tmp_path, self.aof_path)
            finally:
                if old_fd >= 0:
                    _close_in_background(old_fd)
        except OSError as exc:
            log.warning("Can't finish the AOF rewrite: %s", exc.strerror or exc)
            return False
        child.fd = -1  # now the AOF's fd
        try:
            fsync_dir(self.dir)
        except OSError as exc:
            # The new file is in place already: it must become the AOF now.
            log.warning("Can't fsync %s after the AOF rewrite: %s", self.dir, exc.strerror)
        tail_size = child.tail_written + len(tail)
        self._rewrite_buf = None
        self._rewrite_buf_len = 0
        # Everything logged so far is in the new, fsynced file.
        self._aof_buf = []
        self._aof_buf_len = 0
        self._aof_written += tail_size
        self._aof_synced = self._aof_written
        self._swap_aof_fd(fd)
        self.aof_base_size = child.base_size
        self.aof_current_size = child.base_size + tail_size
        self._reserve_aof_space()
        if self._aof_error is not None:
            self._aof_error = None
            self.aof_last_write_status = "ok"
        if self.aof_state == "wait_rewrite":
            self.aof_state = "on"
            self._start_fsync_thread()
            log.info("AOF %s is on: its first file is complete", self.aof_path)
        self._settle_drops()
        return True

    def _kill_child(self) -> None:
        child = self._child
        if child is None:
            return
        if child.finishing:
            # Already reaped: its pid may belong to someone else by now.
            if child.fd >= 0:
                _close_in_background(child.fd)
                child.fd = -1
        else:
            with contextlib.suppress(OSError):
                os.kill(child.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, 0)
        with contextlib.suppress(OSError):
            os.unlink(child.tmp_path)
        self._child = None
        self._rewrite_buf = None
        self._rewrite_buf_len = 0

    # -- the AOF fd and the everysec thread --------------------------------

    def _swap_aof_fd(self, new_fd: int) -> None:
        with self._lock:
            old = self._aof_fd
            self._aof_fd = new_fd
            self._aof_reserved_until = 0
            if old >= 0:
                if old == self._fsync_fd:
                    self._deferred_close.append(old)
                else:
                    _close_in_background(old)

    def _close_deferred_fds(self) -> None:
        if not self._deferred_close:
            return
        with self._lock:
            still = []
            for fd in self._deferred_close:
                if fd == self._fsync_fd:
                    still.append(fd)
                else:
                    _close_in_background(fd)
            self._deferred_close = still

    def _start_fsync_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread_stop.clear()
        self._thread = threading.Thread(
            target=self._fsync_loop, name="rcp11-aof-fsync", daemon=True
        )
        self._thread.start()

    def _stop_fsync_thread(self) -> None:
        if self._thread is not None:
            self._thread_stop.set()
            self._thread.join(timeout=5)
            self._thread = None

    def _fsync_loop(self) -> None:
        # Runs off the event loop: the only thing it touches besides the fd
        # is a few integers, under self._lock.
        while not self._thread_stop.wait(1.0):
            if self.aof_state != "on" or self._fsync_mode() != "everysec":
                continue
            with self._lock:
                fd = self._aof_fd
                target = self._aof_written
                if fd < 0 or target <= self._aof_synced:
                    continue
                self._fsync_fd = fd
            try:
                os.fsync(fd)
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    self._fsync_error = f"fsync: {exc.strerror or exc}"
            else:
                with self._lock:
                    if fd == self._aof_fd:
                        self._aof_synced = max(self._aof_synced, target)
            finally:
                with self._lock:
                    self._fsync_fd = -1

    # -- CONFIG SET appendonly / appendfsync --------------------------------

    def _on_appendonly_change(self, *args: Any) -> None:
        on = self._yes("appendonly")
        if on and self.aof_state == "off":
            self.aof_state = "wait_rewrite"
            if self._child is not None and self._child.kind == "aof":
                self._kill_child()
            if self._child is None:
                if not self._start_rewrite():
                    self.aof_rewrite_scheduled = True
            else:
                self.aof_rewrite_scheduled = True
        elif not on and self.aof_state != "off":
            if self.aof_state == "on":
                self._flush_aof(force_fsync=True)
            if self._child is not None and self._child.kind == "aof":
                self._kill_child()
            self.aof_state = "off"
            self.aof_rewrite_scheduled = False
            self._stop_fsync_thread()
            self._release_preallocated()
            self._swap_aof_fd(-1)
            self._aof_buf = []
            self._aof_buf_len = 0
            self._aof_error = None
            self.aof_last_write_status = "ok"

    def _on_paths_change(self, *args: Any) -> None:
        """CONFIG SET dir / dbfilename: later snapshots go to the new place,
        and the offsets table moves along (it must sit next to the snapshot
        that the next start will load). The open AOF stays where it is."""
        from rcp11.config import ConfigError

        configured = str(self._conf("dir"))
        # The server has chdir()ed into a new `dir` by now.
        new_dir = configured if os.path.isabs(configured) else os.getcwd()
        if os.path.realpath(new_dir) != os.path.realpath(self.dir):
            try:
                lock_data_dir(new_dir)
            except DirectoryInUse as exc:
                raise ConfigError(str(exc)) from None
            except OSError as exc:
                raise ConfigError(f"can't lock {new_dir}: {exc.strerror or exc}") from None
        dbfilename = str(self._conf("dbfilename"))
        snapshot_path = os.path.join(new_dir, dbfilename)
        new_offsets = os.path.join(new_dir, offsets_name(dbfilename))
        if new_offsets != self.reservations.path:
            old_path = self.reservations.path
            self.reservations.path = new_offsets
            try:
                self.reservations.rewrite(
                    dict(self.reservations.marks), dict(self.reservations.deleted)
                )
            except OSError as exc:
                self.reservations.path = old_path
                raise ConfigError(f"can't write {new_offsets}: {exc.strerror}") from None
        self.dir = new_dir
        self.snapshot_path = snapshot_path

    def _on_appendfsync_change(self, *args: Any) -> None:
        if self.aof_state == "on":
            self._start_fsync_thread()


__all__ = [
    "OffsetReservations",
    "Persistence",
    "PersistenceError",
    "encode_command",
    "iter_aof_commands",
    "read_snapshot",
    "write_snapshot",
]
