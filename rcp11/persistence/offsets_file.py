"""The offsets file's format: a header (with the AOF slot), then batches of
(key, mark) records, each batch framed with its length and CRC32
(docs/PERSISTENCE.md, offset reservations). Reading it decides what a
damaged or torn file means; the policy that writes it is reservations.py.

The header is the magic, the version, then the 64-byte AOF slot, which is
overwritten in place after every AOF write (docs/PERSISTENCE.md, when the
AOF is whole)::

    offset  size  field
         0    16  boot id (Linux boot_id) of the boot that wrote the slot
        16     8  the AOF's st_dev           \
        24     8  the AOF's st_ino            | which file, how long it was
        32     8  its length when written     | and how its last bytes read
        40     4  CRC32 of its last min(length, 256) bytes before length
        44     1  flags: 1 = an AOF is being written (the slot means
                  something), 2 = every acknowledged write is fsynced in it
        45    15  zero
        60     4  CRC32 of bytes 0..59 (a torn slot fails it: "unknown")

A record is: u32 key length | key | i64 mark. Bit 31 of the key length
(keys are far shorter than 2 GB) marks a deleted stream's record; without
it a mark of -1 forgets the key::

    kind      key-length bit 31   mark     meaning at load
    live      0                   >= 0     the stream's reservation mark
    deleted   1                   >= 0     the stream was deleted; should an
                                           older file bring it back, it still
                                           goes up to this mark
    forget    0                   -1       no mark at all for the key
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from rcp11.errors import PersistenceError
from rcp11.limits import MAX_OFFSET, TORN_BATCH_MARGIN

OFFSETS_MAGIC = b"RCP11OFS"
OFFSETS_VERSION = 3
# The header: magic and version, then the AOF slot. Version 1 files had a
# 64-byte slot of another meaning there (the "AOF of this boot is complete"
# shortcut, docs/PERSISTENCE.md), version 2 files none; both are read as
# "nothing known about the AOF" and rewritten as version 3.
MAGIC_AND_VERSION = OFFSETS_MAGIC + struct.pack("<H", OFFSETS_VERSION)
SLOT_SIZE = 64
SLOT_AT = len(MAGIC_AND_VERSION)
_V1_HEADER = OFFSETS_MAGIC + struct.pack("<H", 1)
_V2_HEADER = OFFSETS_MAGIC + struct.pack("<H", 2)
_V1_SLOT_SIZE = 64
# How many of the AOF's last bytes the slot's CRC covers.
AOF_TAIL_BYTES = 256
_SLOT = struct.Struct("<16sQQqIB15x")
_SLOT_WRITING = 1
_SLOT_SYNCED = 2
_U64_MASK = 2**64 - 1

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_BATCH = struct.Struct("<II")
_DELETED_FLAG = 1 << 31
_KEY_LEN_MASK = _DELETED_FLAG - 1
Record = tuple[bytes, int, bool]  # key, mark, deleted

# Finding a complete batch after a damaged length reads at most this many
# bytes through crc32 (a few hundred ms): past it the damage is taken for a
# torn tail, as before the search.
_BATCH_SEARCH_BUDGET = 256 << 20


class AofSlot(NamedTuple):
    """What the offsets file says about the AOF: written during boot `boot`,
    the file (dev, ino) was `length` bytes long and its last bytes had CRC32
    `tail_crc`; `synced`: every write acknowledged so far was fsynced in it
    (appendfsync always). `writing` False: no AOF is vouched for. (A named
    tuple: one is made after every AOF write, and compared with the last.)"""

    writing: bool = False
    boot: bytes = b"\0" * 16
    dev: int = 0
    ino: int = 0
    length: int = 0
    tail_crc: int = 0
    synced: bool = False


NO_AOF = AofSlot()


def encode_slot(slot: AofSlot) -> bytes:
    writing, boot, dev, ino, length, tail_crc, synced = slot
    flags = (_SLOT_WRITING if writing else 0) | (_SLOT_SYNCED if synced else 0)
    body = _SLOT.pack(boot, dev & _U64_MASK, ino & _U64_MASK, length, tail_crc, flags)
    return body + _U32.pack(zlib.crc32(body))


def decode_slot(data: bytes) -> AofSlot:
    """The slot's meaning; NO_AOF when it fails its CRC (torn or damaged:
    nothing is known about the AOF, which is always the safe answer)."""
    if len(data) != SLOT_SIZE or zlib.crc32(data[:-4]) != _U32.unpack_from(data, SLOT_SIZE - 4)[0]:
        return NO_AOF
    boot, dev, ino, length, tail_crc, flags = _SLOT.unpack_from(data)
    if not flags & _SLOT_WRITING or length < 0:
        return NO_AOF
    return AofSlot(True, boot, dev, ino, length, tail_crc, bool(flags & _SLOT_SYNCED))


def header(slot: AofSlot) -> bytes:
    return MAGIC_AND_VERSION + encode_slot(slot)


HEADER_SIZE = SLOT_AT + SLOT_SIZE


# struct.pack of a whole record by its key's length: one call per record
# instead of two packs and two concatenations (twice as fast; one TCONCAT
# or DEL of many streams writes a record for each).
_RECORD_PACKERS: dict[int, Callable[..., bytes]] = {}


def _record_packer(key_len: int) -> Callable[..., bytes]:
    if len(_RECORD_PACKERS) >= 1024:
        _RECORD_PACKERS.clear()  # keys of a thousand lengths: start again
    pack = _RECORD_PACKERS[key_len] = struct.Struct(f"<I{key_len}sq").pack
    return pack


def encode_batch(records: Iterable[Record]) -> bytes:
    """One batch: length, CRC32, then the records."""
    # A stream at the ceiling has next offset 2^63, one past what an i64
    # holds; its mark stays 2^63-1 (no offset is left to hand out anyway).
    top = MAX_OFFSET
    packer = _RECORD_PACKERS.get
    payload = b"".join(
        [
            (packer(len(k)) or _record_packer(len(k)))(
                len(k) | (_DELETED_FLAG if d else 0), k, m if m < top else top
            )
            for k, m, d in records
        ]
    )
    return _BATCH.pack(len(payload), zlib.crc32(payload)) + payload


def iter_records(payload: bytes) -> Iterator[Record]:
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


@dataclass
class Contents:
    """What a file holds: the live and deleted marks of every complete
    batch, where the last complete batch ends (`valid`), how long the file
    is, and whether it must be rewritten (old layout) or was cut inside its
    header (`header_torn`: no mark known at all)."""

    live: dict[bytes, int] = field(default_factory=dict)
    deleted: dict[bytes, int] = field(default_factory=dict)
    valid: int = 0
    size: int = 0
    old_format: bool = False
    header_torn: bool = False
    torn: bytes = b""  # the bytes after `valid` (a last batch cut short)
    slot: AofSlot = NO_AOF


def read_contents(path: str, data: bytes) -> Contents:
    """Parse a whole offsets file. A last batch cut short is left out (it is
    in `torn`); damage anywhere before it raises PersistenceError naming
    the file and the byte offset."""
    pos, old_format = _header_end(path, data)
    contents = Contents(old_format=old_format, header_torn=pos == 0)
    if pos == 0:
        data = b""
    elif not old_format:
        contents.slot = decode_slot(data[SLOT_AT:HEADER_SIZE])
    live, deleted = contents.live, contents.deleted
    valid = pos
    while pos < len(data):
        if len(data) - pos < _BATCH.size:
            break
        length, crc = _BATCH.unpack_from(data, pos)
        end = pos + _BATCH.size + length
        if end > len(data):
            # Torn last batch, or a damaged length field with batches
            # after it: those would be lost if this were read as the end.
            later = _complete_batch_after(data, pos + 1)
            if later is not None:
                raise PersistenceError(
                    f"{path}: corrupt file (the batch at byte offset {pos} claims "
                    f"{length} bytes, past the end of the file, but a complete batch "
                    f"follows at byte offset {later})"
                )
            break
        payload = data[pos + _BATCH.size : end]
        if zlib.crc32(payload) != crc:
            if end == len(data):
                break  # torn last batch
            raise PersistenceError(f"{path}: checksum mismatch at byte offset {pos}: corrupt file")
        try:
            for key, mark, was_deleted in iter_records(payload):
                if was_deleted:
                    live.pop(key, None)
                    deleted[key] = max(deleted.get(key, 0), mark)
                elif mark < 0:
                    live.pop(key, None)
                    deleted.pop(key, None)
                else:
                    live[key] = mark
        except struct.error as exc:
            raise PersistenceError(f"{path}: corrupt record in batch at byte offset {pos}") from exc
        pos = end
        valid = end
    contents.valid = valid
    contents.size = len(data)
    contents.torn = data[valid:]
    return contents


def _header_end(path: str, data: bytes) -> tuple[int, bool]:
    """Where the batches start (0: no header yet, read as empty) and
    whether the file has an older layout (to be rewritten)."""
    short = len(data) < SLOT_AT
    if short and any(h.startswith(data) for h in (MAGIC_AND_VERSION, _V1_HEADER, _V2_HEADER)):
        return 0, False  # created, but its header never fully reached the disk
    if data.startswith(_V2_HEADER):
        return SLOT_AT, True
    for head, slot_size in ((MAGIC_AND_VERSION, SLOT_SIZE), (_V1_HEADER, _V1_SLOT_SIZE)):
        if data.startswith(head):
            if len(data) < len(head) + slot_size:
                return 0, False  # its header and slot never fully reached the disk
            return len(head) + slot_size, head != MAGIC_AND_VERSION
    if data.startswith(OFFSETS_MAGIC) and len(data) >= SLOT_AT:
        (version,) = struct.unpack_from("<H", data, len(OFFSETS_MAGIC))
        raise PersistenceError(
            f"{path}: unsupported offsets file version {version} at byte offset "
            f"{len(OFFSETS_MAGIC)}"
        )
    raise PersistenceError(f"{path}: not an rcp11 offsets file (bad header, {len(data)} bytes)")


def _complete_batch_after(data: bytes, start: int) -> int | None:
    """The offset of a complete, checksummed, non-empty batch at or after
    `start`, if any. A batch torn by a crash is the file's last bytes, so
    such a batch after it proves the length before it was damaged."""
    budget = _BATCH_SEARCH_BUDGET
    size = len(data)
    for pos in range(start, size - _BATCH.size - 12 + 1):
        length, crc = _BATCH.unpack_from(data, pos)
        if length < 12 or length > size - pos - _BATCH.size:
            continue
        budget -= length
        if budget < 0:
            return None
        payload = data[pos + _BATCH.size : pos + _BATCH.size + length]
        if zlib.crc32(payload) != crc:
            continue
        try:
            for _record in iter_records(payload):
                pass
        except struct.error:
            continue
        return pos
    return None


def raise_after_torn_batch(
    live: dict[bytes, int], deleted: dict[bytes, int], torn: bytes
) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """Marks for a file whose last batch (torn, unverified) was cut off:
    every known mark and every key still readable in the cut batch (as a
    live mark), raised by TORN_BATCH_MARGIN. Marks only go up, so reading
    garbage costs a gap at most."""

    def up(mark: int) -> int:
        return min(max(mark, 0) + TORN_BATCH_MARGIN, MAX_OFFSET)

    raised = {key: up(mark) for key, mark in live.items()}
    raised_deleted = {key: up(mark) for key, mark in deleted.items()}
    payload = torn[_BATCH.size :]
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


__all__ = [
    "AOF_TAIL_BYTES",
    "HEADER_SIZE",
    "NO_AOF",
    "OFFSETS_MAGIC",
    "OFFSETS_VERSION",
    "SLOT_AT",
    "AofSlot",
    "Contents",
    "Record",
    "decode_slot",
    "encode_batch",
    "encode_slot",
    "header",
    "iter_records",
    "raise_after_torn_batch",
    "read_contents",
]
