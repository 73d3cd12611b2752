"""What the pieces of this package use of the Persistence engine that
wires them (engine.py hands itself to Children, Saves and the loader).

Stated here, below them, so that imports point down only: engine.py
imports the pieces, the pieces import this, and nothing here imports
engine.py. Persistence keeps the protocol structurally (a test checks it:
tests/test_persistence_hooks.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rcp11.persistence.aof_writer import AofWriter
from rcp11.persistence.reservations import Deletions, OffsetReservations
from rcp11.state import ClientState, ServerState

# How a logged command runs again while the AOF loads: the command layer's
# execute(), given by whoever builds the server (this package needs nothing
# above the state).
Replay = Callable[[ServerState, ClientState, list[bytes]], Any]


class SaveStatus(Protocol):
    """The snapshot bookkeeping a BGSAVE child reports to (saves.Saves)."""

    last_status: str  # "ok" | "err", INFO's rdb_last_bgsave_status
    last_bgsave_try: float  # time.time() of the last BGSAVE attempt

    def bgsave_done(self, child: Any, ok: bool, elapsed: int) -> None:
        """A BGSAVE child (children.Child) exited; elapsed in seconds."""


class Engine(Protocol):
    """The engine as its pieces see it."""

    state: ServerState
    dir: str  # the data directory, absolute
    snapshot_path: str
    aof: AofWriter
    reservations: OffsetReservations
    deletions: Deletions
    saves: SaveStatus
    replay: Replay

    def conf(self, name: str) -> Any:
        """A directive's current value."""

    def yes(self, name: str) -> bool:
        """Whether a yes/no directive is on."""

    def save_rules(self) -> list[tuple[int, int]]:
        """The `save` rules as (seconds, changes)."""

    def lastsave(self) -> int:
        """Unix time of the last successful snapshot."""

    def stream_nexts(self) -> dict[bytes, int]:
        """Every stream's next offset (what a snapshot taken now holds)."""

    def record_aof(self, final: bool = False) -> bool:
        """Write what the AOF holds now into the offsets file's AOF slot."""

    def settle_deletions(self) -> None:
        """Drop the marks of deleted streams no file can bring back."""
