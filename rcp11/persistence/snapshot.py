"""The snapshot format: a whole keyspace in one checksummed file.

    "RCP11SNAP" u16 version u64 unix-time
    records:  'S' u32 keylen key u64 len value          a string
              'T' u32 keylen key (u64 len blob)* u64 ~0  a stream (Stream.dump() blobs)
              'G' u32 keylen key u64 len blob         an acknowledged group (AckGroup.dump())
              'X' u32 keylen key u64 unix-ms             expiry of the key before
    'E' u32 crc32(everything before it, 'E' included)

Stream and group blobs carry their own CRC32 and pass the core's validators on load;
every length is checked against what is left of the file before anything is
allocated. docs/PERSISTENCE.md has the reasons. The same format is the AOF's
preamble after a rewrite.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from rcp11.errors import PersistenceError
from rcp11.files import replace_atomically
from rcp11.logs import show_arg
from rcp11.state import ServerState
from rcp11.storage import StorageError, Stream
from rcp11.storage.ackgroups import AckGroup

SNAP_MAGIC = b"RCP11SNAP"
SNAP_VERSION = 1

_END_OF_BLOBS = 0xFFFFFFFFFFFFFFFF
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class CrcWriter:
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


def write_snapshot(out: CrcWriter, state: ServerState) -> None:
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
        elif isinstance(value, AckGroup):
            blob = value.dump()
            out.write(b"G" + head + u64(len(blob)))
            out.write_self_checked(blob)
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


class CrcReader:
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


def read_snapshot(reader: CrcReader, state: ServerState) -> list[bytes]:
    """Load a snapshot from reader into state.keyspace (which should be
    empty). Returns the stream keys it loaded. Raises PersistenceError."""
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
        if tag not in (b"S", b"T", b"X", b"G"):
            raise reader.fail(f"corrupt file (unknown record type {show_arg(tag)})", record_at)
        key = reader.read(reader.u32())
        if tag != b"X" and key in keyspace.data:
            raise reader.fail(f"corrupt file (key {show_arg(key[:60])} appears twice)", record_at)
        if tag == b"S":
            keyspace.set(key, reader.read(reader.u64()))
        elif tag == b"G":
            try:
                group = AckGroup.load(reader.read_self_checked(reader.u64()))
            except StorageError as exc:
                raise reader.fail(f"corrupt group {show_arg(key)} ({exc})", record_at) from exc
            keyspace.set(key, group)
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
                raise reader.fail(f"corrupt stream {show_arg(key)} ({exc})", record_at) from exc
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


def write_snapshot_file(state: ServerState, path: str, tmp_path: str) -> int:
    """Write a complete, durable snapshot to path via tmp_path; returns its size."""

    def write(file: BinaryIO) -> int:
        out = CrcWriter(file)
        write_snapshot(out, state)
        return out.size

    return replace_atomically(path, write, temp_path=tmp_path)


__all__ = [
    "SNAP_MAGIC",
    "CrcReader",
    "CrcWriter",
    "read_snapshot",
    "write_snapshot",
    "write_snapshot_file",
]
