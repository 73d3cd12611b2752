"""Durability: snapshots, the append-only file (AOF) and offset
reservations. docs/PERSISTENCE.md has the design and says which file of
this package owns what; engine.Persistence is what the server builds:

    persistence = Persistence(state, execute)   # execute: how the AOF replays
    state.persistence = persistence
    persistence.lock_dir(); persistence.load()
"""

from __future__ import annotations

from rcp11.errors import PersistenceError
from rcp11.persistence.aof_format import RAISE_NEXT, BadBytes, TornTail, iter_aof_commands
from rcp11.persistence.engine import Persistence
from rcp11.persistence.offsets_file import OFFSETS_MAGIC
from rcp11.persistence.reservations import OffsetReservations
from rcp11.persistence.snapshot import CrcReader, CrcWriter, read_snapshot, write_snapshot
from rcp11.resp import encode_command

__all__ = [
    "OFFSETS_MAGIC",
    "RAISE_NEXT",
    "BadBytes",
    "CrcReader",
    "CrcWriter",
    "OffsetReservations",
    "Persistence",
    "PersistenceError",
    "TornTail",
    "encode_command",
    "iter_aof_commands",
    "read_snapshot",
    "write_snapshot",
]
