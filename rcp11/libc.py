"""The few C library calls Python does not offer: fallocate() (the AOF's
disk-space reservation), malloc_trim() (giving freed memory back to the
system), mallopt() (how malloc gets memory for large buffers) and
mallinfo2() (the allocator's statistics, MEMORY MALLOC-STATS). Loaded
once; None where the C library lacks them (not glibc)."""

from __future__ import annotations

import ctypes
import errno
import os
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


def _function(name: str, argtypes: list[Any], restype: Any = ctypes.c_int) -> Any:
    """The C library's function `name` with its signature set, or None where
    the library or the function is missing (not glibc, an older glibc)."""
    lib = libc()
    func = getattr(lib, name, None) if lib is not None else None
    if func is not None:
        func.argtypes = argtypes
        func.restype = restype
    return func


def fallocate_keep_size(fd: int, offset: int, length: int) -> int:
    """fallocate(FALLOC_FL_KEEP_SIZE); 0 or an errno."""
    fallocate = _function(
        "fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    )
    if fallocate is None:
        return errno.EOPNOTSUPP
    try:
        if fallocate(fd, 1, offset, length) == 0:
            return 0
        return ctypes.get_errno() or errno.EIO
    except OSError:
        return errno.EOPNOTSUPP


def malloc_trim() -> bool:
    """glibc's malloc_trim(0): return the free memory at the top of the heap
    and the free pages inside it to the system. False where unavailable."""
    trim = _function("malloc_trim", [ctypes.c_size_t])
    if trim is None:
        return False
    trim(0)
    return True


# glibc's mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD); True when
    both were taken (False where unavailable: not glibc)."""
    mallopt = _function("mallopt", [ctypes.c_int, ctypes.c_int])
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )


class _Mallinfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (2.33 and later): every field a size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes taken from the system with brk, all arenas
            "ordblks",  # free chunks
            "smblks",  # free fastbin chunks
            "hblks",  # chunks served by mmap
            "hblkhd",  # bytes in those mmap'd chunks
            "usmblks",  # always 0
            "fsmblks",  # bytes in free fastbin chunks
            "uordblks",  # bytes in use
            "fordblks",  # bytes free
            "keepcost",  # free bytes at the top of the heap malloc_trim can release
        )
    ]


def mallinfo() -> dict[str, int] | None:
    """glibc's mallinfo2(), its fields by name; None where the C library has
    none (not glibc, or glibc before 2.33, whose int fields wrap at 2 GB)."""
    call = _function("mallinfo2", [], _Mallinfo2)
    if call is None:
        return None
    info = call()
    return {name: getattr(info, name) for name, _ in _Mallinfo2._fields_}


def libc_version() -> str | None:
    """glibc's version ("2.36"), or None where the C library is not glibc."""
    get = _function("gnu_get_libc_version", [], ctypes.c_char_p)
    return None if get is None else get().decode()


def anonymous_bytes() -> int | None:
    """The process's anonymous memory in RAM (/proc/self/statm: resident
    pages less the shared ones, which are the files it maps: the
    interpreter, the libraries): every page it allocated itself."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _heap_resident_bytes() -> int | None:
    """The main heap's pages in RAM (its Rss in /proc/self/smaps), or None
    where it cannot be read. malloc_trim() gives back free pages inside the
    heap without shrinking it, so mallinfo2's `arena` (its size) is not what
    it holds. The heap comes right after the executable's own mappings:
    reading stops there, before the kernel measures the rest."""
    try:
        with open("/proc/self/smaps", "rb") as smaps:
            in_heap = False
            for line in smaps:
                if in_heap and line.startswith(b"Rss:"):
                    return int(line.split()[1]) * 1024
                if line.endswith(b"[heap]\n"):
                    in_heap = True
    except (OSError, ValueError, IndexError):
        return None
    return None


def allocated_bytes() -> int | None:
    """What the process has allocated and holds: the C heap's blocks in use
    (mallinfo2: the storage core's nodes, the libraries') plus the anonymous
    memory malloc did not hand out (Python's object arenas, thread stacks),
    so free blocks malloc keeps are not counted. None where neither the C
    library nor /proc says (then the caller falls back on its own count)."""
    info = mallinfo()
    anonymous = anonymous_bytes()
    if info is None:
        return anonymous
    in_use = info["uordblks"] + info["hblkhd"]
    if anonymous is None:
        return in_use
    # The heap's own pages (in use or free) are part of the anonymous
    # memory: what it holds in RAM, or its size where /proc does not say.
    heap = _heap_resident_bytes()
    if heap is None:
        heap = info["arena"]
    return in_use + max(anonymous - heap - info["hblkhd"], 0)


def can_measure_unused() -> bool:
    """Whether memory malloc keeps can be told from memory in use
    (mallinfo2 and /proc/self/statm both answer): only then can the cron
    decide when to give it back (rcp11/server/trim.py)."""
    return mallinfo() is not None and anonymous_bytes() is not None
