"""Whether the AOF found at start-up holds every write that was
acknowledged, so that streams can go on at their next offsets instead of
jumping to their reservation marks (docs/PERSISTENCE.md, when the AOF is
whole).

After every AOF write, before any reply leaves, the engine overwrites the
AOF slot in the offsets file's header (offsets_file.py) with what it has
just written: the file (device, inode), its length, a CRC32 of its last
bytes, the boot it runs in, and whether every acknowledged write is fsynced
(appendfsync always). The slot is a pwrite without fsync: a kill -9 cannot
lose it, the kernel keeps it as it keeps the AOF's own bytes.

At start-up the AOF is whole when the slot vouches for an AOF and the file
found is that file, at least that long, with those last bytes, its
complete commands reaching that length, and either it is the same boot
(nothing in the page cache was lost) or every write was fsynced before its
reply (a power loss under appendfsync always loses no acknowledged write).
Anything else -- a cut, emptied, replaced or damaged AOF, a reboot under
everysec or no, an offsets file that says nothing -- cannot be told from a
lost tail, and the reservation marks apply as before.
"""

from __future__ import annotations

import functools
import logging
import uuid
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from rcp11.persistence.aof_writer import AofWriter
from rcp11.persistence.offsets_file import AOF_TAIL_BYTES, AofSlot

log = logging.getLogger("rcp11.persistence")

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
UNKNOWN_BOOT = b"\0" * 16


@functools.cache
def current_boot() -> bytes:
    """This boot's id (16 bytes), UNKNOWN_BOOT where Linux gives none: a
    slot is then never taken for one of this boot."""
    try:
        with open(_BOOT_ID_PATH) as file:
            return uuid.UUID(file.read().strip()).bytes
    except (OSError, ValueError):
        return UNKNOWN_BOOT


@dataclass
class FoundAof:
    """The AOF as the loader found it: which file, how long, the CRC32 of
    the bytes before the slot's length (as the slot computes it), and
    where its last complete command ends (set once it is read)."""

    dev: int
    ino: int
    size: int
    tail_crc: int
    complete_end: int = 0


def tail_crc_of(file: BinaryIO, length: int) -> int:
    """CRC32 of the file's min(length, AOF_TAIL_BYTES) bytes before byte
    `length` (the caller checked the file is that long)."""
    want = min(length, AOF_TAIL_BYTES)
    file.seek(length - want)
    return zlib.crc32(file.read(want))


def doubt(slot: AofSlot, found: FoundAof | None, boot: bytes) -> str | None:
    """Why the AOF found may lack acknowledged writes, or None when it holds
    them all (the module docstring)."""
    if found is None:
        return "there is no AOF"
    if not slot.writing:
        return "the offsets file vouches for no AOF (an older version, or the AOF was off)"
    same_boot = boot != UNKNOWN_BOOT and slot.boot == boot
    # Device numbers may differ after a reboot (they are given out at
    # mount time); the inode, length and last bytes still tell the file.
    if found.ino != slot.ino or (same_boot and found.dev != slot.dev):
        return "it is not the file the server last wrote (another inode)"
    if found.size < slot.length:
        return f"it is {found.size} bytes long, the server had written {slot.length}"
    if found.tail_crc != slot.tail_crc:
        return f"its bytes before byte offset {slot.length} are not those the server wrote"
    if found.complete_end < slot.length:
        return (
            f"its complete commands end at byte offset {found.complete_end}, "
            f"the server had written {slot.length}"
        )
    if not same_boot and not slot.synced:
        return "the machine restarted since, and appendfsync was not always"
    return None


def slot_for(aof: AofWriter, always: bool) -> AofSlot:
    """The slot that describes the open AOF right after a flush. always:
    appendfsync is always (every write fsynced before its reply). Raises
    OSError (reading the file's last bytes)."""
    dev, ino = aof.identity
    # Positional: this runs after every AOF write.
    return AofSlot(
        True, current_boot(), dev, ino, aof.current_size, aof.tail_crc(), always and aof.all_synced
    )


__all__ = ["UNKNOWN_BOOT", "FoundAof", "current_boot", "doubt", "slot_for", "tail_crc_of"]
