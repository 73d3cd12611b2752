"""The data directory: the names of the files the server keeps in `dir`, the
names they must never share, and the lock that gives one server the
directory.

A leaf: config.py checks names with it, rcp11/persistence/ names its files and
takes the lock with it.

Files in `dir`::

    <dbfilename>              the snapshot
    <dbfilename>.offsets      offset reservations, beside the snapshot
    <appendfilename>          the AOF
    temp-rcp11-*              snapshot and offsets files being written
    temp-rewriteaof-rcp11-*   an AOF rewrite being written
    rcp11.lock                held (POSIX lock) by the server using `dir`,
                              removed when it shuts down cleanly

A snapshot saved over the AOF (or the AOF appended to the offsets file...)
destroys acknowledged writes, and a start-up removes leftover temp-* files,
so every one of these names must be distinct, and dbfilename/appendfilename
may not take a temporary or the lock file's name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from rcp11 import errors

OFFSETS_SUFFIX = ".offsets"
SNAPSHOT_TEMP_PREFIX = "temp-rcp11-"
REWRITE_TEMP_PREFIX = "temp-rewriteaof-rcp11-"
TEMP_PREFIXES = (SNAPSHOT_TEMP_PREFIX, REWRITE_TEMP_PREFIX)
LOCK_NAME = "rcp11.lock"


def offsets_name(dbfilename: str) -> str:
    """The offsets file that goes with a snapshot name."""
    return dbfilename + OFFSETS_SUFFIX


def filename_problem(directive: str, name: str) -> str | None:
    """Why `name` cannot be the value of dbfilename/appendfilename, or None.
    Texts follow redis-server's where it has one."""
    if name == "":
        return errors.filename_empty(directive)
    if "/" in name or "\\" in name or name in (".", ".."):
        return errors.filename_is_path(directive)
    for prefix in TEMP_PREFIXES:
        if name.startswith(prefix):
            return errors.filename_temp_prefix(directive, prefix)
    if name == LOCK_NAME:
        return errors.filename_is_lock(directive, LOCK_NAME)
    return None


def names_clash(dbfilename: str, appendfilename: str) -> str | None:
    """Why the snapshot and AOF names cannot go together, or None."""
    if dbfilename == appendfilename:
        return errors.FILENAMES_SAME
    if offsets_name(dbfilename) == appendfilename:
        return errors.filename_offsets_clash(offsets_name(dbfilename))
    return None


def data_paths(directory: str, dbfilename: str, appendfilename: str) -> dict[str, str]:
    """What each file of the data directory is called, as absolute paths."""
    directory = os.path.abspath(directory)
    return {
        "dbfilename": os.path.join(directory, dbfilename),
        "the offsets file": os.path.join(directory, offsets_name(dbfilename)),
        "appendfilename": os.path.join(directory, appendfilename),
        "the lock file": os.path.join(directory, LOCK_NAME),
    }


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (links and `..` resolved)."""
    return os.path.realpath(a) == os.path.realpath(b)


class DirectoryInUse(Exception):
    """Another process holds the data directory's lock."""


# Locks this process holds, by real path. POSIX locks belong to the process,
# and closing any descriptor of the file drops them, so a directory is
# opened once and its descriptor kept for the life of the process.
_held: dict[str, int] = {}


def lock_data_dir(directory: str) -> str:
    """Take the data directory's lock (the lock file is created if needed)
    and write our pid into it; returns the lock file's path. Raises
    DirectoryInUse naming the process that holds it, or OSError.

    A POSIX record lock (lockf): the kernel drops it when the holder dies,
    kill -9 included, so a stale lock file never blocks a restart; forked
    children (BGSAVE) do not inherit it. A clean shutdown removes the file
    (release_data_dirs); a lock taken on a file removed meanwhile is no
    lock, so it is taken again on the file the name now gives."""
    path = os.path.join(os.path.realpath(directory), LOCK_NAME)
    if path in _held:
        return path
    for _ in range(100):
        fd = _lock_file(path)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # removed by a server that was shutting down: again
    else:
        raise OSError(errno.EAGAIN, f"{path} keeps being removed while it is locked")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"%d\n" % os.getpid(), 0)
    except OSError:
        os.close(fd)
        raise
    _held[path] = fd
    return path


def _lock_file(path: str) -> int:
    """The lock file, open and locked; DirectoryInUse when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = b""
        with contextlib.suppress(OSError):
            holder = os.pread(fd, 32, 0).strip()
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            who = f"pid {holder.decode('ascii', 'replace')}" if holder else "another process"
            raise DirectoryInUse(
                errors.directory_in_use(os.path.dirname(path), who, path)
            ) from None
        raise
    return fd


def release_data_dirs() -> None:
    """At a clean exit, when every file of the directory is written: remove
    the lock files this process holds, then let go of the locks (removed
    first, so no other server can lock the file in between)."""
    for path, fd in list(_held.items()):
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
        del _held[path]


__all__ = [
    "LOCK_NAME",
    "release_data_dirs",
    "OFFSETS_SUFFIX",
    "TEMP_PREFIXES",
    "DirectoryInUse",
    "data_paths",
    "filename_problem",
    "lock_data_dir",
    "names_clash",
    "offsets_name",
    "same_file",
]
