"""Snapshots taken: SAVE on the event loop, the results of BGSAVE children,
and what a complete snapshot means for the rest (LASTSAVE, the save rules'
change count, deleted streams' marks, reservation marks coming down).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from rcp11.datafiles import SNAPSHOT_TEMP_PREFIX
from rcp11.persistence.children import Child
from rcp11.persistence.parts import Engine
from rcp11.persistence.snapshot import write_snapshot_file
from rcp11.storage import Stream

log = logging.getLogger("rcp11.persistence")


class Saves:
    """The snapshot status fields of INFO persistence, and taking one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.lastsave = int(time.time())
        self.last_status = "ok"  # rdb_last_bgsave_status
        self.last_bgsave_time_sec = -1
        self.saves = 0
        self.bgsave_scheduled = False
        self.last_bgsave_try = 0.0

    def save_now(self) -> bool:
        """A snapshot on the event loop (SAVE, SHUTDOWN, FLUSHALL); False
        (logged) when it could not be written."""
        engine = self.engine
        tmp = os.path.join(engine.dir, f"{SNAPSHOT_TEMP_PREFIX}{os.getpid()}.snap")
        keys = engine.stream_nexts()
        started = time.monotonic()
        try:
            write_snapshot_file(engine.state, engine.snapshot_path, tmp)
        except OSError as exc:
            log.warning("Failed saving the DB to %s: %s", engine.snapshot_path, exc.strerror or exc)
            self.last_status = "err"
            return False
        log.info("DB saved on disk in %.3f seconds", time.monotonic() - started)
        self._done(engine.state.dirty, keys, engine.deletions.removals)
        return True

    def bgsave_done(self, child: Child, ok: bool, elapsed: int) -> None:
        """A BGSAVE child exited (children.py reaped it)."""
        self.last_bgsave_time_sec = elapsed
        if ok:
            log.info("Background saving terminated with success")
            self._done(child.dirty_at_fork, child.stream_keys, child.removals_at_fork)
        else:
            log.warning("Background saving error")
            self.last_status = "err"
            with contextlib.suppress(OSError):
                os.unlink(child.tmp_path)

    def _done(self, dirty_at_start: int, keys: dict[bytes, int], removals: int) -> None:
        """A snapshot holding the streams `keys` (with these next offsets) and
        `removals` deletions is on disk: it is what the next start loads."""
        engine = self.engine
        state = engine.state
        state.dirty = max(0, state.dirty - dirty_at_start)
        self.lastsave = int(time.time())
        self.last_status = "ok"
        self.saves += 1
        engine.deletions.snapshot_done(set(keys), removals)
        engine.settle_deletions()
        # Also with the AOF on: a restart may come without it (appendonly
        # switched off), and a stream written after the snapshot reserves
        # above its lowered mark again before any reply.
        data = state.keyspace.data

        def current(key: bytes) -> int | None:
            value = data.get(key)
            return value.next_offset if isinstance(value, Stream) else None

        engine.reservations.lower_to(keys, current)


__all__ = ["Saves"]
