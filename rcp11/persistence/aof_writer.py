"""The open AOF: the buffer of commands written since the last flush, the
write before any reply leaves, the appendfsync policy (and the everysec
fsync thread), the disk space kept reserved ahead of the file's end, and
what a failing disk does to all of it (docs/PERSISTENCE.md, the AOF and
disk errors).

    state "off"           nothing is logged
          "on"            commands go to the buffer, flush() writes them
          "wait_rewrite"  turned on at runtime: the first file is being
                          written by a rewrite child (children.py); commands
                          only go to the rewrite buffer meanwhile
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import zlib
from collections.abc import Callable

from rcp11.files import write_all
from rcp11.libc import fallocate_keep_size
from rcp11.limits import AOF_SPACE_MARGIN, AOF_SPACE_SLICES, MAX_OFFSET
from rcp11.persistence.aof_format import encode_append_time
from rcp11.persistence.offsets_file import AOF_TAIL_BYTES
from rcp11.resp import encode_command

log = logging.getLogger("rcp11.persistence")


class AofWriter:
    """One AOF file being appended to. fsync_mode() reads appendfsync."""

    def __init__(self, path: str, fsync_mode: Callable[[], str]) -> None:
        self.path = path
        self._fsync_mode = fsync_mode
        self.state = "off"
        self.fd = -1
        self.buf: list[bytes] = []
        self.buf_len = 0
        # Commands logged while a rewrite child writes the new file.
        self.rewrite_buf: list[bytes] | None = None
        self.rewrite_buf_len = 0
        # The append time the last annotation logged (-1: none yet in this
        # file, or a rewrite buffer started since: date() logs one).
        self.dated_ms = -1
        self.current_size = 0
        self.base_size = 0
        self.written = 0  # bytes handed to the kernel (all files, monotonic)
        self.synced = 0  # bytes known fsynced
        # The open file's (st_dev, st_ino), and its last AOF_TAIL_BYTES
        # bytes as written (None: not known, read back from the file when
        # asked): what the offsets file's AOF slot records after each flush.
        self.identity = (0, 0)
        self._tail: bytes | None = None
        self.error: str | None = None
        self.last_write_status = "ok"
        self.delayed_fsync = 0
        self._reserved_until = 0  # file offset up to which blocks are preallocated
        self._space_low = False
        # The everysec fsync thread and the fd hand-over with it.
        self._lock = threading.Lock()
        self._fsync_fd = -1  # fd the thread is fsyncing right now
        self._fsync_error: str | None = None
        self._deferred_close: list[int] = []
        self._thread: threading.Thread | None = None
        self._thread_stop = threading.Event()

    @property
    def end(self) -> int:
        """Where the AOF will end once the buffer is written (all files)."""
        return self.written + self.buf_len

    @property
    def fsync_pending(self) -> bool:
        return self._fsync_fd >= 0

    def open(self) -> None:
        """Open the AOF for appending (created if missing). The file is
        fsynced first: what it holds from before this start (a kill -9
        leaves it in the page cache only) is on disk before anything is
        said about it, so `synced` covers the whole file."""
        # Read-write: the slot's fingerprint reads the file's last bytes.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.fsync(fd)
            stat = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        self.current_size = stat.st_size
        # As Redis: growth for auto-aof-rewrite counts from the size at start.
        self.base_size = self.current_size
        self.identity = (stat.st_dev, stat.st_ino)
        self._tail = None
        with self._lock:
            self.fd = fd
            self.synced = self.written
        self._reserved_until = 0
        self.dated_ms = -1
        self.reserve_space()

    @property
    def all_synced(self) -> bool:
        """Every byte handed to the kernel is fsynced."""
        return self.synced == self.written and not self.buf

    def tail_crc(self) -> int:
        """CRC32 of the open file's last min(size, AOF_TAIL_BYTES) bytes.
        Raises OSError."""
        tail = self._tail
        if tail is None:
            want = min(self.current_size, AOF_TAIL_BYTES)
            tail = os.pread(self.fd, want, self.current_size - want) if want else b""
            if len(tail) != want:
                raise OSError(f"{self.path}: short read of its last {want} bytes")
            self._tail = tail
        return zlib.crc32(tail)

    def date(self, ms: int) -> None:
        """The writes logged next were appended at unix time ms: log an
        append-time annotation unless the last one said the same. Buffered
        with the writes it dates, so one flush writes both: a file cut
        anywhere never holds a write without the date it had."""
        if ms != self.dated_ms and self.state != "off":
            self.dated_ms = ms
            self.append_encoded(encode_append_time(ms))

    def start_rewrite_buffer(self) -> None:
        """A rewrite child starts: commands from now on also go to the
        rewrite buffer, whose first write must carry its own date (the
        last annotation is in the old file only)."""
        self.rewrite_buf = []
        self.rewrite_buf_len = 0
        self.dated_ms = -1

    def append(self, argv: list[bytes]) -> None:
        """Log one command (state "off": nothing)."""
        if self.state != "off":
            self.append_encoded(encode_command(argv))

    def append_encoded(self, data: bytes) -> None:
        """Log commands already in their AOF form (encode_command() of
        each, back to back): the C lane's TWRITE requests, verbatim."""
        if self.state == "off":
            return
        if self.state == "on":
            self.buf.append(data)
            self.buf_len += len(data)
        if self.rewrite_buf is not None:
            self.rewrite_buf.append(data)
            self.rewrite_buf_len += len(data)

    def room(self) -> int:
        """Bytes that may still be buffered before space_refused() must be
        asked again (it reserves more disk space once the margin is reached)."""
        if self.state != "on":
            return MAX_OFFSET
        used = self.current_size + self.buf_len + AOF_SPACE_MARGIN
        return max(self._reserved_until - used, 0)

    def flush(self, force_fsync: bool) -> bool:
        """Write the buffer (and fsync when force_fsync). False when the
        write or the fsync failed: the unwritten rest is kept, in order."""
        if self.buf:
            data = b"".join(self.buf) if len(self.buf) > 1 else self.buf[0]
            try:
                written = write_all(self.fd, data)
            except OSError as exc:
                written = getattr(exc, "written", 0)
                rest = data[written:]
                self.buf = [rest]
                self.buf_len = len(rest)
                self.written += written
                self.current_size += written
                self._tail = None
                self.set_error(f"write: {exc.strerror or exc}")
                return False
            self.buf = []
            self.buf_len = 0
            self.written += written
            self.current_size += written
            if written >= AOF_TAIL_BYTES:
                self._tail = data[-AOF_TAIL_BYTES:]
            elif self._tail is not None:
                self._tail = (self._tail + data)[-AOF_TAIL_BYTES:]
        if force_fsync:
            try:
                os.fsync(self.fd)
            except OSError as exc:
                self.set_error(f"fsync: {exc.strerror or exc}")
                return False
            self.synced = self.written
        if self.error is not None and self._fsync_error is None:
            log.warning("AOF write error looks solved, rcp11 can write again.")
            self.error = None
            self.last_write_status = "ok"
        return True

    def flush_per_policy(self) -> bool:
        """flush() as appendfsync says (`always` fsyncs now)."""
        return self.flush(force_fsync=self._fsync_mode() == "always")

    def set_error(self, problem: str) -> None:
        if self.error is None:
            log.warning(
                "Error writing to the AOF file %s (%s): refusing writes until it works",
                self.path,
                problem,
            )
        self.error = problem
        self.last_write_status = "err"

    def tick(self) -> None:
        """From the cron: errors of the fsync thread, deferred closes, and a
        retry of a failed write."""
        self.close_deferred_fds()
        if self._fsync_error is not None:
            self.set_error(self._fsync_error)
            self._fsync_error = None
        if self.error is not None and self.state == "on":
            self.flush(force_fsync=True)

    def space_refused(self) -> bool:
        """Whether less than AOF_SPACE_MARGIN of reserved disk is left ahead
        of the file and no more can be reserved (a full disk)."""
        return (
            self.state == "on"
            and self.current_size + self.buf_len + AOF_SPACE_MARGIN > self._reserved_until
            and not self.reserve_space()
        )

    def reserve_space(self) -> bool:
        """Preallocate disk blocks past the AOF's end (without changing its
        size), so that a full disk shows up here, before a write command
        runs, instead of as a failed write of a command that already ran.
        False when the disk has no room for even the smallest slice."""
        if not _FALLOCATE_WORKS[0] or self.fd < 0:
            return True
        end = self.current_size + self.buf_len
        for size in AOF_SPACE_SLICES:
            result = fallocate_keep_size(self.fd, end, size)
            if result == 0:
                self._reserved_until = end + size
                if self._space_low:
                    log.warning("The disk of %s has room again: accepting writes.", self.path)
                    self._space_low = False
                    if self.error is None:
                        self.last_write_status = "ok"
                return True
            if result != errno.ENOSPC:
                _FALLOCATE_WORKS[0] = False  # not supported here: rely on write errors
                return True
        if not self._space_low:
            log.warning("No room left on the disk of %s: refusing writes until there is", self.path)
            self._space_low = True
            self.last_write_status = "err"
        return False

    def release_preallocated(self) -> None:
        # Truncating to the current size gives back the blocks reserved past
        # the end, so a stopped server does not keep them.
        if self.fd >= 0 and not self.buf:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, os.fstat(self.fd).st_size)
        self._reserved_until = 0

    def turn_off(self) -> None:
        """CONFIG SET appendonly no (after a last flush): close the file and
        forget what could not be written."""
        self.state = "off"
        self.dated_ms = -1
        self.stop_fsync_thread()
        self.release_preallocated()
        self.swap_fd(-1)
        self.buf = []
        self.buf_len = 0
        self.error = None
        self.last_write_status = "ok"

    def close(self) -> None:
        """At shutdown, after the last flush."""
        if self.fd >= 0:
            self.release_preallocated()
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    # -- the fd and the everysec thread ----------------------------------

    def swap_fd(self, new_fd: int) -> None:
        """Make new_fd the AOF's (after a rewrite); the old one is closed
        off the event loop, once the fsync thread no longer uses it."""
        if new_fd >= 0:
            stat = os.fstat(new_fd)
            self.identity = (stat.st_dev, stat.st_ino)
        self._tail = None
        with self._lock:
            old = self.fd
            self.fd = new_fd
            self._reserved_until = 0
            if old >= 0:
                if old == self._fsync_fd:
                    self._deferred_close.append(old)
                else:
                    close_in_background(old)

    def close_deferred_fds(self) -> None:
        if not self._deferred_close:
            return
        with self._lock:
            still = []
            for fd in self._deferred_close:
                if fd == self._fsync_fd:
                    still.append(fd)
                else:
                    close_in_background(fd)
            self._deferred_close = still

    def start_fsync_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread_stop.clear()
        self._thread = threading.Thread(
            target=self._fsync_loop, name="rcp11-aof-fsync", daemon=True
        )
        self._thread.start()

    def stop_fsync_thread(self) -> None:
        if self._thread is not None:
            self._thread_stop.set()
            self._thread.join(timeout=5)
            self._thread = None

    def _fsync_loop(self) -> None:
        # Runs off the event loop: the only thing it touches besides the fd
        # is a few integers, under self._lock.
        while not self._thread_stop.wait(1.0):
            if self.state != "on" or self._fsync_mode() != "everysec":
                continue
            with self._lock:
                fd = self.fd
                target = self.written
                if fd < 0 or target <= self.synced:
                    continue
                self._fsync_fd = fd
            try:
                os.fsync(fd)
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    self._fsync_error = f"fsync: {exc.strerror or exc}"
            else:
                with self._lock:
                    if fd == self.fd:
                        self.synced = max(self.synced, target)
            finally:
                with self._lock:
                    self._fsync_fd = -1


def close_in_background(fd: int) -> None:
    """Close an fd off the event loop: closing the last fd of a replaced AOF
    frees all its blocks, which takes long for a big file (Redis closes it
    in a background thread for the same reason)."""

    def close() -> None:
        with contextlib.suppress(OSError):
            os.close(fd)

    threading.Thread(target=close, name="rcp11-close", daemon=True).start()


_FALLOCATE_WORKS = [True]


__all__ = ["AofWriter", "close_in_background"]
