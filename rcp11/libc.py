"""The few C library calls Python does not offer: fallocate() (the AOF's
disk-space reservation), malloc_trim() (giving freed memory back to the
system) and mallopt() (how malloc gets memory for large buffers). Loaded
once; None where the C library lacks them (not glibc)."""

from __future__ import annotations

import ctypes
import errno
from typing import Any

_LIBC: list[Any] = []


def libc() -> Any:
    """The process's C library through ctypes, or None."""
    if not _LIBC:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
        except OSError:
            lib = None
        _LIBC.append(lib)
    return _LIBC[0]


def fallocate_keep_size(fd: int, offset: int, length: int) -> int:
    """fallocate(FALLOC_FL_KEEP_SIZE); 0 or an errno."""
    try:
        lib = libc()
        if lib is None:
            return errno.EOPNOTSUPP
        fallocate = lib.fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        if fallocate(fd, 1, ctypes.c_longlong(offset), ctypes.c_longlong(length)) == 0:
            return 0
        return ctypes.get_errno() or errno.EIO
    except (AttributeError, OSError):
        return errno.EOPNOTSUPP


def malloc_trim() -> bool:
    """glibc's malloc_trim(0): return the free memory at the top of the heap
    and the free pages inside it to the system. False where unavailable."""
    lib = libc()
    if lib is None:
        return False
    try:
        trim = lib.malloc_trim
    except AttributeError:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True


# glibc's mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD); True when
    both were taken (False where unavailable: not glibc)."""
    lib = libc()
    if lib is None:
        return False
    try:
        mallopt = lib.mallopt
    except AttributeError:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
