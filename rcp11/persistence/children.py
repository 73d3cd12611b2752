"""Forked children: BGSAVE, the AOF rewrite and the rewrite's tail
(docs/PERSISTENCE.md, the rewrite), and the cron's decision to start one
(save rules, auto-aof-rewrite-*, a scheduled BGSAVE or rewrite).

At most one child runs. A rewrite stays "in progress" after its child
exited, while the commands logged meanwhile move into the new file a slice
per cron tick; then the new file replaces the AOF.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from rcp11.datafiles import REWRITE_TEMP_PREFIX, SNAPSHOT_TEMP_PREFIX
from rcp11.files import fsync_dir, write_all
from rcp11.persistence.aof_writer import close_in_background
from rcp11.persistence.parts import Engine
from rcp11.persistence.snapshot import CrcWriter, write_snapshot, write_snapshot_file

log = logging.getLogger("rcp11.persistence")

_REWRITE_RETRY_DELAY = 5.0
_BGSAVE_RETRY_DELAY = 5.0
# Finishing an AOF rewrite: the commands logged meanwhile move into the new
# file _FINISH_STEP bytes per cron tick until at most _FINISH_SMALL remain.
_FINISH_STEP = 32 << 20
_FINISH_SMALL = 4 << 20


class Child:
    def __init__(self, kind: str, pid: int, tmp_path: str) -> None:
        self.kind = kind  # "rdb" | "aof"
        self.pid = pid
        self.tmp_path = tmp_path
        self.started = time.time()
        self.dirty_at_fork = 0
        self.removals_at_fork = 0
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


class Children:
    """The child (at most one) of a Persistence engine, and the rewrite's
    status fields of INFO persistence."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.child: Child | None = None
        self.latest_fork_usec = 0
        self.rewrite_scheduled = False
        self._rewrite_not_before = 0.0
        self.last_bgrewrite_status = "ok"
        self.last_rewrite_time_sec = -1
        self.rewrites = 0

    def running(self, kind: str) -> bool:
        return self.child is not None and self.child.kind == kind

    def saving_streams(self) -> set[bytes] | None:
        """The streams of the snapshot a BGSAVE child is writing, if any."""
        child = self.child
        return set(child.stream_keys) if child is not None and child.kind == "rdb" else None

    def schedule_rewrite(self) -> None:
        self.rewrite_scheduled = True
        self._rewrite_not_before = 0.0

    # -- starting ----------------------------------------------------------

    def maybe_start(self, now: float) -> None:
        """From the cron when no child runs: a scheduled rewrite or BGSAVE,
        a save rule that is due, or an automatic rewrite on AOF growth."""
        engine = self.engine
        if self.rewrite_scheduled and time.monotonic() >= self._rewrite_not_before:
            self.start_rewrite()
            return
        saves = engine.saves
        if saves.bgsave_scheduled:
            saves.bgsave_scheduled = False
            if self.start_bgsave():
                return
        for seconds, changes in engine.save_rules():
            if (
                engine.state.dirty >= changes
                and now - engine.lastsave() > seconds
                and (saves.last_status == "ok" or now - saves.last_bgsave_try > _BGSAVE_RETRY_DELAY)
            ):
                log.info("%d changes in %d seconds. Saving...", changes, seconds)
                self.start_bgsave()
                return
        aof = engine.aof
        if aof.state == "on" and aof.error is None:
            percentage = int(engine.conf("auto-aof-rewrite-percentage") or 0)
            min_size = int(engine.conf("auto-aof-rewrite-min-size") or 0)
            base = aof.base_size or 1
            growth = (aof.current_size - base) * 100 // base
            if (
                percentage > 0
                and aof.current_size > min_size
                and growth >= percentage
                and time.monotonic() >= self._rewrite_not_before
            ):
                log.info("Starting automatic rewriting of AOF on %d%% growth", growth)
                self.start_rewrite()

    def _fork(self, kind: str, tmp_path: str, body: Callable[[], None]) -> Child | None:
        engine = self.engine
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
        child = Child(kind, pid, tmp_path)
        child.dirty_at_fork = engine.state.dirty
        child.removals_at_fork = engine.deletions.removals
        child.stream_keys = engine.stream_nexts()
        self.child = child
        return child

    def start_bgsave(self) -> bool:
        engine = self.engine
        engine.saves.last_bgsave_try = time.time()
        tmp = os.path.join(engine.dir, f"{SNAPSHOT_TEMP_PREFIX}{int(time.time() * 1000)}.snap")
        state, path = engine.state, engine.snapshot_path

        def body() -> None:
            write_snapshot_file(state, path, tmp)

        child = self._fork("rdb", tmp, body)
        if child is None:
            engine.saves.last_status = "err"
            return False
        log.info("Background saving started by pid %d", child.pid)
        return True

    def start_rewrite(self) -> bool:
        engine = self.engine
        aof = engine.aof
        if self.child is not None:
            self.rewrite_scheduled = True
            return True
        # The child's snapshot must cover everything in the AOF buffer.
        if aof.state == "on" and not aof.flush(force_fsync=False):
            return False
        tmp = os.path.join(engine.dir, f"{REWRITE_TEMP_PREFIX}{int(time.time() * 1000)}.aof")
        state = engine.state

        def body() -> None:
            with open(tmp, "wb", buffering=1 << 20) as file:
                write_snapshot(CrcWriter(file), state)
                file.flush()
                os.fsync(file.fileno())

        aof.start_rewrite_buffer()
        child = self._fork("aof", tmp, body)
        if child is None:
            aof.rewrite_buf = None
            self.last_bgrewrite_status = "err"
            return False
        self.rewrite_scheduled = False
        log.info("Background append only file rewriting started by pid %d", child.pid)
        return True

    # -- reaping and finishing ---------------------------------------------

    def reap(self) -> None:
        """From the cron: a child that exited, or the next slice of a
        rewrite's tail."""
        child = self.child
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
        self.child = None
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        elapsed = int(time.time() - child.started)
        engine = self.engine
        if child.kind == "rdb":
            engine.saves.bgsave_done(child, ok, elapsed)
            return
        self.last_rewrite_time_sec = elapsed
        if not ok:
            self._rewrite_failed(child, "the child failed")
            return
        aof = engine.aof
        if aof.state == "off":
            aof.rewrite_buf = None
            with contextlib.suppress(OSError):
                os.unlink(child.tmp_path)
            return
        try:
            child.fd = os.open(child.tmp_path, os.O_RDWR | os.O_APPEND)
            child.base_size = os.fstat(child.fd).st_size
        except OSError as exc:
            self._rewrite_failed(child, f"can't open {child.tmp_path}: {exc.strerror}")
            return
        # Stays the current child (a rewrite "in progress") until the tail
        # of commands written meanwhile is in the new file.
        child.finishing = True
        self.child = child
        self._advance_rewrite_finish(child)

    def _rewrite_failed(self, child: Child, why: str) -> None:
        log.warning("Background AOF rewrite failed: %s", why)
        aof = self.engine.aof
        self.child = None
        self.last_bgrewrite_status = "err"
        aof.rewrite_buf = None
        aof.rewrite_buf_len = 0
        if child.fd >= 0:
            close_in_background(child.fd)
            child.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(child.tmp_path)
        if aof.state == "wait_rewrite":
            self.rewrite_scheduled = True
        self._rewrite_not_before = time.monotonic() + _REWRITE_RETRY_DELAY

    def _advance_rewrite_finish(self, child: Child) -> None:
        """Move the commands logged during the rewrite into the new file a
        bounded slice per cron tick, with fdatasync in a background thread,
        so that only a small remainder is written and fsynced on the event
        loop when the files are swapped."""
        if child.sync_error is not None:
            self._rewrite_failed(child, child.sync_error)
            return
        aof = self.engine.aof
        syncing = child.sync_thread is not None and child.sync_thread.is_alive()
        buf = aof.rewrite_buf if aof.rewrite_buf is not None else []
        if aof.rewrite_buf_len > _FINISH_SMALL:
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
            aof.rewrite_buf_len -= taken
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
            self.child = None
            self.last_bgrewrite_status = "ok"
            self.rewrites += 1
            log.info("Background AOF rewrite finished successfully")
        else:
            self._rewrite_failed(child, "can't swap the files")

    def _finish_rewrite(self, child: Child) -> bool:
        """Append the last commands, fsync, swap the new file in."""
        engine = self.engine
        aof = engine.aof
        tail = b"".join(aof.rewrite_buf or [])
        fd = child.fd
        try:
            write_all(fd, tail)
            os.fsync(fd)
            # Hold the old file open so that its blocks are freed by a
            # background close, not inside rename() on the event loop.
            try:
                old_fd = os.open(aof.path, os.O_RDONLY)
            except OSError:
                old_fd = -1
            try:
                os.replace(child.tmp_path, aof.path)
            finally:
                if old_fd >= 0:
                    close_in_background(old_fd)
        except OSError as exc:
            log.warning("Can't finish the AOF rewrite: %s", exc.strerror or exc)
            return False
        child.fd = -1  # now the AOF's fd
        try:
            fsync_dir(engine.dir)
        except OSError as exc:
            # The new file is in place already: it must become the AOF now.
            log.warning("Can't fsync %s after the AOF rewrite: %s", engine.dir, exc.strerror)
        tail_size = child.tail_written + len(tail)
        aof.rewrite_buf = None
        aof.rewrite_buf_len = 0
        # Everything logged so far is in the new, fsynced file.
        aof.buf = []
        aof.buf_len = 0
        aof.written += tail_size
        aof.synced = aof.written
        aof.swap_fd(fd)
        aof.base_size = child.base_size
        aof.current_size = child.base_size + tail_size
        aof.reserve_space()
        if aof.error is not None:
            aof.error = None
            aof.last_write_status = "ok"
        if aof.state == "wait_rewrite":
            aof.state = "on"
            aof.start_fsync_thread()
            log.info("AOF %s is on: its first file is complete", aof.path)
        # The offsets file's AOF slot names the new file from now on (a
        # kill -9 before this leaves it naming the old one: not whole, the
        # reservation marks apply).
        engine.record_aof()
        engine.settle_deletions()
        return True

    def kill(self) -> None:
        """Stop the child (SHUTDOWN, FLUSHALL, CONFIG SET appendonly)."""
        child = self.child
        if child is None:
            return
        if child.finishing:
            # Already reaped: its pid may belong to someone else by now.
            if child.fd >= 0:
                close_in_background(child.fd)
                child.fd = -1
        else:
            with contextlib.suppress(OSError):
                os.kill(child.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, 0)
        with contextlib.suppress(OSError):
            os.unlink(child.tmp_path)
        self.child = None
        aof = self.engine.aof
        aof.rewrite_buf = None
        aof.rewrite_buf_len = 0


def _die_with_parent() -> None:
    # A forked child must not outlive a killed server (it would go on
    # writing files nobody waits for).
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


__all__ = ["Child", "Children"]
