"""Persistence: the PersistenceHooks of a real server (rcp11/state.py),
wiring the pieces of this package (docs/PERSISTENCE.md has the design):

    aof_writer.AofWriter         the open AOF and its fsync policy
    reservations.OffsetReservations / Deletions
                                 offset marks and when a deleted stream's
                                 mark may go
    children.Children            BGSAVE, the AOF rewrite, the save rules
    loader                       start-up

It answers the commands (SAVE, BGSAVE, BGREWRITEAOF, LASTSAVE, FLUSHALL's
save, SHUTDOWN), the server's flush() before replies and tick() from the
cron, and CONFIG SET appendonly/appendfsync/dir/dbfilename.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from rcp11 import errors
from rcp11.config import ConfigError
from rcp11.datafiles import (
    TEMP_PREFIXES,
    DirectoryInUse,
    lock_data_dir,
    offsets_name,
)
from rcp11.errors import CommandError, PersistenceError
from rcp11.limits import MAX_OFFSET
from rcp11.persistence import loader
from rcp11.persistence.aof_format import RAISE_NEXT
from rcp11.persistence.aof_whole import slot_for
from rcp11.persistence.aof_writer import AofWriter
from rcp11.persistence.children import Children
from rcp11.persistence.offsets_file import NO_AOF, AofSlot
from rcp11.persistence.parts import Replay
from rcp11.persistence.reservations import Deletions, OffsetReservations
from rcp11.persistence.saves import Saves
from rcp11.state import ServerState
from rcp11.storage import Stream

log = logging.getLogger("rcp11.persistence")


class Persistence:
    """PersistenceHooks for a real server: snapshot + AOF + reservations.

    replay: how a logged command is run again while the AOF loads (the
    command layer's execute; given by whoever builds the server, so this
    package needs nothing above the state)."""

    def __init__(self, state: ServerState, replay: Replay) -> None:
        self.state = state
        self.replay = replay
        config = state.config
        self.dir = _resolve_dir(str(config.get("dir")))
        self.snapshot_path = os.path.join(self.dir, str(config.get("dbfilename")))
        self.aof = AofWriter(
            os.path.join(self.dir, str(config.get("appendfilename"))),
            lambda: str(config.get("appendfsync")).lower(),
        )
        self.reservations = OffsetReservations(
            os.path.join(self.dir, offsets_name(str(config.get("dbfilename"))))
        )
        self.deletions = Deletions(self.reservations)
        self.children = Children(self)
        self.saves = Saves(self)
        self._reservation_error: str | None = None
        self.loading = False
        # aof.written as of the last flush(): bytes written since by anyone
        # else (a rewrite's start writes the buffer out) still need the
        # policy's fsync and the slot before a reply.
        self._flushed_written = 0
        config.on_change("appendonly", self._on_appendonly_change)
        config.on_change("appendfsync", self._on_appendfsync_change)
        config.on_change("dir", self._on_paths_change)
        config.on_change("dbfilename", self._on_paths_change)

    @property
    def aof_state(self) -> str:
        """ "off", "on" or "wait_rewrite" (aof_writer.py)."""
        return self.aof.state

    # -- configuration ---------------------------------------------------

    def conf(self, name: str) -> Any:
        return self.state.config.get(name)

    def save_rules(self) -> list[tuple[int, int]]:
        return [(int(seconds), int(changes)) for seconds, changes in self.conf("save") or []]

    def yes(self, name: str) -> bool:
        return bool(self.conf(name))

    def stream_nexts(self) -> dict[bytes, int]:
        """Every stream's next offset (what a snapshot taken now holds)."""
        data = self.state.keyspace.data
        return {k: v.next_offset for k, v in data.items() if isinstance(v, Stream)}

    # -- start-up --------------------------------------------------------

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

    def load(self) -> None:
        """Load the files (loader.py), then open the AOF when it is on.
        Raises PersistenceError naming the file and the problem."""
        state = self.state
        self.lock_dir()
        with contextlib.suppress(OSError):
            for name in os.listdir(self.dir):
                if name.startswith(TEMP_PREFIXES):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.dir, name))
        state.loading = self.loading = True
        started = time.monotonic()
        try:
            raises = loader.load_files(self)
        finally:
            state.loading = self.loading = False
        log.info(
            "DB loaded from disk: %d keys in %.3f seconds",
            len(state.keyspace),
            time.monotonic() - started,
        )
        aof = self.aof
        aof_on = self.yes("appendonly")
        if aof_on:
            if not os.path.exists(aof.path):
                loader.write_aof_base(self)
            try:
                aof.open()
            except OSError as exc:
                raise PersistenceError(f"{aof.path}: cannot open: {exc.strerror or exc}") from exc
            aof.state = "on"
            for key, mark in raises:
                aof.append([RAISE_NEXT, key, b"%d" % mark])
            if raises and not aof.flush(force_fsync=True):
                raise PersistenceError(f"{aof.path}: cannot append: {aof.error}")
            aof.start_fsync_thread()
        if aof_on or self.reservations.slot.writing:
            # From now on the slot describes this AOF (or, with the AOF off,
            # vouches for none: a stale AOF a later start finds must not be
            # taken as whole), durably before anything is acknowledged.
            if not self.record_aof():
                raise PersistenceError(
                    f"{self.reservations.path}: cannot write: {self._reservation_error}"
                )
            try:
                self.reservations.sync()
            except OSError as exc:
                raise PersistenceError(
                    f"{self.reservations.path}: cannot fsync: {exc.strerror or exc}"
                ) from exc
        state.dirty = 0

    # -- hooks called by the command layer and the server -----------------

    def propagate(self, argv: list[bytes]) -> None:
        self.aof.append(argv)

    def propagate_encoded(self, data: bytes) -> None:
        self.aof.append_encoded(data)

    def date_writes(self, ms: int) -> None:
        self.aof.date(ms)

    def aof_room(self) -> int:
        return self.aof.room()

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
        reservations = self.reservations
        if reservations.unsynced:
            try:
                reservations.sync()
            except OSError as exc:
                self._set_reservation_error(exc)
                ok = False
        if reservations.pending:
            # Deleted-stream records before the AOF gets the DEL: a kill -9
            # in between must not leave a DEL whose key comes back at its
            # mark (the reverse order only costs a gap).
            reservations.write_best_effort([])
        aof = self.aof
        if aof.state == "on" and (aof.buf or aof.written != self._flushed_written):
            # Also when the buffer was written out since the last flush by
            # something else (BGREWRITEAOF, the cron's rewrite): those
            # writes' replies leave now too, so they get appendfsync's
            # fsync and the slot like any other.
            ok = aof.flush_per_policy() and ok
            self._flushed_written = aof.written
            # Before the replies: what the AOF now holds, for the next start.
            ok = self.record_aof() and ok
        if self.deletions:
            self.settle_deletions()
        return ok

    def record_aof(self, final: bool = False) -> bool:
        """Overwrite the offsets file's AOF slot with what the AOF holds now
        (aof_whole.py), or with "no AOF" while it is off or failing. final:
        a clean shutdown's last flush, fsynced whatever appendfsync says.
        False (writes refused) when the offsets file cannot be written."""
        aof = self.aof
        slot: AofSlot = NO_AOF
        if aof.state == "on" and aof.error is None:
            always = final or str(self.conf("appendfsync")).lower() == "always"
            try:
                slot = slot_for(aof, always)
            except OSError as exc:
                log.warning("Cannot read the end of the AOF %s: %s", aof.path, exc.strerror or exc)
        try:
            self.reservations.set_slot(slot)
        except OSError as exc:
            self._set_reservation_error(exc)
            return False
        return True

    def before_stream_write(self, key: bytes, new_next_offset: int) -> None:
        if self.loading:
            return
        reservations = self.reservations
        mark = reservations.marks.get(key)
        if mark is not None and min(new_next_offset, MAX_OFFSET) <= mark:
            return
        value = self.state.keyspace.data.get(key)
        current = value.next_offset if isinstance(value, Stream) else 0
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

    def on_keys_removed(self, keys: Sequence[bytes]) -> None:
        if not self.loading:
            self.deletions.removed(keys)

    def settle_deletions(self) -> None:
        aof = self.aof
        aof_end = aof.end if aof.state != "off" else None
        self.deletions.settle(aof_end, aof.synced, self.children.saving_streams())

    def flushed(self) -> bool:
        """True when flush() would have nothing to log or sync and nothing
        failed. While the AOF or the offsets file fails, every flush fails
        and drops the replies behind it (a reply must not show what is not
        logged): the C loop then sends nothing on its own."""
        aof = self.aof
        reservations = self.reservations
        return not (
            aof.error is not None
            or self._reservation_error is not None
            or reservations.unsynced
            or reservations.pending
            or (aof.state == "on" and (aof.buf or aof.written != self._flushed_written))
        )

    def write_refused(self) -> str | None:
        if self.aof.error is not None or self._reservation_error is not None:
            return errors.MISCONF
        if self.aof.space_refused():
            return errors.MISCONF
        if (
            self.saves.last_status == "err"
            and self.save_rules()
            and self.yes("stop-writes-on-bgsave-error")
        ):
            return errors.MISCONF
        return None

    def info(self) -> dict[str, Any]:
        children, aof, saves = self.children, self.aof, self.saves
        child = children.child
        running = int(time.time() - child.started) if child is not None else -1
        rdb_child = children.running("rdb")
        aof_child = children.running("aof")
        fields: dict[str, Any] = {
            "loading": int(self.loading),
            "async_loading": 0,
            "rdb_changes_since_last_save": self.state.dirty,
            "rdb_bgsave_in_progress": int(rdb_child),
            "rdb_last_save_time": saves.lastsave,
            "rdb_last_bgsave_status": saves.last_status,
            "rdb_last_bgsave_time_sec": saves.last_bgsave_time_sec,
            "rdb_current_bgsave_time_sec": running if rdb_child else -1,
            "rdb_saves": saves.saves,
            "aof_enabled": int(aof.state != "off"),
            "aof_rewrite_in_progress": int(aof_child),
            "aof_rewrite_scheduled": int(children.rewrite_scheduled),
            "aof_last_rewrite_time_sec": children.last_rewrite_time_sec,
            "aof_current_rewrite_time_sec": running if aof_child else -1,
            "aof_last_bgrewrite_status": children.last_bgrewrite_status,
            "aof_rewrites": children.rewrites,
            "aof_last_write_status": aof.last_write_status,
            "latest_fork_usec": children.latest_fork_usec,
        }
        if aof.state != "off":
            fields.update(
                {
                    "aof_current_size": aof.current_size,
                    "aof_base_size": aof.base_size,
                    "aof_pending_rewrite": int(children.rewrite_scheduled),
                    "aof_buffer_length": aof.buf_len,
                    "aof_pending_bio_fsync": int(aof.fsync_pending),
                    "aof_delayed_fsync": aof.delayed_fsync,
                }
            )
        fields["offset_reservations"] = len(self.reservations.marks)
        fields["offset_reservation_fsyncs"] = self.reservations.fsyncs
        return fields

    def tick(self, now: float) -> None:
        now = time.time()  # whatever clock the caller uses, save rules use wall time
        self.children.reap()
        self.aof.tick()
        if self.aof.state == "on":
            self.record_aof()  # a failed write retried, or still failing
        if self.deletions:
            self.settle_deletions()
        reservations = self.reservations
        try:
            reservations.sync()
            if reservations.pending:
                reservations.write([], durable=False)
            reservations.compact_if_large()
            if self._reservation_error is not None:
                reservations.write([], durable=True)
                log.warning("Offsets file %s can be written again.", reservations.path)
                self._reservation_error = None
        except OSError as exc:
            self._set_reservation_error(exc)
        if self.children.child is None:
            self.children.maybe_start(now)

    # -- commands --------------------------------------------------------

    def lastsave(self) -> int:
        """LASTSAVE: unix time of the last successful snapshot."""
        return self.saves.lastsave

    def save(self) -> str:
        """SAVE: a synchronous snapshot."""
        if self.children.running("rdb"):
            raise CommandError(errors.BGSAVE_IN_PROGRESS)
        if self.saves.save_now():
            return "OK"
        raise CommandError(errors.SAVE_FAILED)

    def bgsave(self, schedule: bool = False) -> str:
        children = self.children
        in_exec = self.state.in_transaction_log
        if children.child is not None or in_exec:
            if children.running("rdb"):
                raise CommandError(errors.BGSAVE_IN_PROGRESS)
            if schedule or in_exec:
                # Started by the cron once the AOF rewrite is done, or
                # after the EXEC this runs in (a snapshot of the whole
                # transaction, as Redis schedules it).
                self.saves.bgsave_scheduled = True
                return "Background saving scheduled"
            raise CommandError(errors.BGSAVE_CHILD_ACTIVE)
        if not children.start_bgsave():
            raise CommandError(errors.BGSAVE_FORK_FAILED)
        return "Background saving started"

    def flushall(self) -> None:
        """After FLUSHALL, as redis-server does: a BGSAVE in progress is
        killed (its snapshot holds the flushed data), and with save points
        configured the empty dataset is saved at once, so a crash cannot
        bring the flushed keys back."""
        if self.children.running("rdb"):
            log.info("Killing the background save: FLUSHALL makes its snapshot stale")
            self.children.kill()
        self.saves.bgsave_scheduled = False
        if self.save_rules():
            dirty = self.state.dirty
            self.saves.save_now()
            # The flush still counts as a change, as Redis keeps it.
            self.state.dirty = dirty

    def bgrewriteaof(self) -> str:
        children = self.children
        if children.running("aof"):
            raise CommandError(errors.REWRITE_IN_PROGRESS)
        # Inside EXEC, as in Redis, the rewrite waits for the cron: forked
        # now, its snapshot would hold the transaction's first commands and
        # the new file the transaction's log from its middle on (an EXEC
        # without its MULTI, refused at the next start).
        if children.child is not None or self.state.in_transaction_log:
            children.schedule_rewrite()
            return "Background append only file rewriting scheduled"
        if not children.start_rewrite():
            raise CommandError(errors.REWRITE_FAILED)
        return "Background append only file rewriting started"

    def shutdown(self, mode: str | None = None) -> bool:
        """Prepare to exit: finish the AOF, save if asked (or if save rules
        exist and mode is not "nosave"), write tight reservations. Returns
        False when the required save failed (the server must not exit)."""
        mode = mode.lower() if mode else None
        aof = self.aof
        self.children.kill()
        with contextlib.suppress(OSError):
            self.reservations.sync()
        durable = False
        if aof.state == "on":
            if aof.flush(force_fsync=True):
                durable = True
            else:
                log.warning("Error flushing the AOF on shutdown: %s", aof.error)
            self.record_aof(final=True)
        aof.stop_fsync_thread()
        if mode == "save" or (mode != "nosave" and self.save_rules()):
            log.info("Saving the final snapshot before exiting.")
            if not self.saves.save_now():
                log.warning("Error trying to save the DB, can't exit.")
                if aof.state == "on":
                    aof.start_fsync_thread()  # we keep running
                return False
            durable = durable or aof.state == "off"
        elif aof.state == "off" and not os.path.exists(self.snapshot_path):
            durable = True  # nothing on disk can come back with older offsets
        self.reservations.write_tight(self.stream_nexts(), durable)
        aof.close()
        self.reservations.close()
        return True

    # -- CONFIG SET appendonly / appendfsync / dir / dbfilename -------------

    def _on_appendonly_change(self, *args: Any) -> None:
        on = self.yes("appendonly")
        aof, children = self.aof, self.children
        if on and aof.state == "off":
            aof.state = "wait_rewrite"
            if children.running("aof"):
                children.kill()
            if children.child is None and not self.state.in_transaction_log:
                if not children.start_rewrite():
                    children.rewrite_scheduled = True
            else:
                # After the running child, or after the EXEC this runs in
                # (bgrewriteaof() says why).
                children.schedule_rewrite()
        elif not on and aof.state != "off":
            if aof.state == "on":
                aof.flush(force_fsync=True)
            if children.running("aof"):
                children.kill()
            children.rewrite_scheduled = False
            aof.turn_off()
        # No AOF vouched for until the first file is complete (children.py),
        # and none once it is off: fsynced before any reply.
        self.record_aof()

    def _on_paths_change(self, *args: Any) -> None:
        """CONFIG SET dir / dbfilename: later snapshots go to the new place,
        and the offsets table moves along (it must sit next to the snapshot
        that the next start will load). The open AOF stays where it is."""
        configured = str(self.conf("dir"))
        # The server has chdir()ed into a new `dir` by now.
        new_dir = configured if os.path.isabs(configured) else os.getcwd()
        if os.path.realpath(new_dir) != os.path.realpath(self.dir):
            try:
                lock_data_dir(new_dir)
            except DirectoryInUse as exc:
                raise ConfigError(str(exc)) from None
            except OSError as exc:
                raise ConfigError(errors.cant_lock(new_dir, exc.strerror or str(exc))) from None
        dbfilename = str(self.conf("dbfilename"))
        new_offsets = os.path.join(new_dir, offsets_name(dbfilename))
        reservations = self.reservations
        if new_offsets != reservations.path:
            old_path = reservations.path
            reservations.path = new_offsets
            try:
                reservations.rewrite(dict(reservations.marks), dict(reservations.deleted))
            except OSError as exc:
                reservations.path = old_path
                raise ConfigError(
                    errors.cant_write(new_offsets, exc.strerror or str(exc))
                ) from None
        self.dir = new_dir
        self.snapshot_path = os.path.join(new_dir, dbfilename)

    def _on_appendfsync_change(self, *args: Any) -> None:
        if self.aof.state == "on":
            self.aof.start_fsync_thread()
            # Leaving `always` takes back "every write is fsynced": durably
            # before any write is acknowledged without an fsync.
            self.record_aof()


def _resolve_dir(configured: str) -> str:
    # The server chdir()s into `dir` before persistence starts (as Redis
    # does), so a relative `dir` names the current directory by then;
    # in-process users that did not chdir get it resolved normally.
    if os.path.isabs(configured):
        return configured
    if os.path.isdir(configured) and not os.path.samefile(configured, "."):
        return os.path.abspath(configured)
    return os.getcwd()


__all__ = ["Persistence"]
