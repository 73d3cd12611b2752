"""File helpers every writer shares: the atomic replace, the directory
fsync, a write that survives short writes.

replace_atomically() is the only way the server replaces a file (the
snapshot, the offsets file, the AOF's first base, CONFIG REWRITE's config
file): write a temporary file in the same directory, fsync it, rename it
over the target, fsync the directory. A crash at any point leaves the old
file or the new one, whole, never half of one; without the directory fsync
the rename itself may not survive a power loss.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO, TypeVar

T = TypeVar("T")

# os.write() slices: one call for a huge buffer would hold it all in the
# kernel's copy at once and report a short write late.
WRITE_CHUNK = 8 << 20


def fsync_dir(path: str) -> None:
    """Make a rename (or a file creation) in directory `path` durable."""
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> int:
    """os.write until done; returns the bytes written. On an error the
    exception carries `.written` so the caller can keep the unwritten rest."""
    view = memoryview(data)
    written = 0
    while written < len(view):
        try:
            written += os.write(fd, view[written : written + WRITE_CHUNK])
        except OSError as exc:
            exc.written = written  # type: ignore[attr-defined]
            raise
    return written


def replace_atomically(
    path: str,
    write: Callable[[BinaryIO], T],
    *,
    temp_path: str | None = None,
    keep_mode: bool = False,
) -> T:
    """Replace the file at `path` by what write(file) writes, atomically and
    durably; returns what write() returned. Raises OSError (the temporary
    file is removed, `path` is untouched).

    temp_path: the temporary file's name (it must be in path's directory;
    the persistence engine uses names its start-up sweep removes); default a
    fresh hidden name there. keep_mode: the new file gets the old one's
    permission bits (a config file someone made private stays private).
    """
    directory = os.path.dirname(os.path.abspath(path))
    if temp_path is None:
        fd, temp_path = tempfile.mkstemp(prefix=".rcp11-tmp-", dir=directory)
        file = os.fdopen(fd, "wb", buffering=1 << 20)
    else:
        file = open(temp_path, "wb", buffering=1 << 20)  # noqa: SIM115 - closed below
    try:
        with file:
            result = write(file)
            file.flush()
            os.fsync(file.fileno())
        if keep_mode:
            with contextlib.suppress(OSError):
                os.chmod(temp_path, os.stat(path).st_mode & 0o7777)
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_path)
        raise
    fsync_dir(directory)
    return result


__all__ = ["WRITE_CHUNK", "fsync_dir", "replace_atomically", "write_all"]
