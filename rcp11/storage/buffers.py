"""The C buffers (mn_buf) Stream's calls fill: a reply buffer kept per
thread between reads, and fresh ones for serialized blobs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rcp11.storage.binding import ffi, lib
from rcp11.storage.errors import check

# Read replies are formatted into a per-thread C buffer that is kept
# between calls (cffi releases the GIL during C calls, so threads must not
# share one). Buffers that grew past this are freed after use.
_SCRATCH_KEEP_BYTES = 1 << 20
_scratch = threading.local()


def scratch_buffer() -> Any:
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = ffi.new("mn_buf *")
    buf.len = 0
    return buf


def release_scratch(buf: Any) -> None:
    if buf.cap > _SCRATCH_KEEP_BYTES:
        lib.mn_buf_free(buf)


def serialized(serialize: Callable[[object, object], int], obj: object) -> bytes:
    """Run a C serializer into a fresh mn_buf and return its bytes."""
    buf = ffi.new("mn_buf *")
    try:
        check(serialize(obj, buf))
        return ffi.unpack(buf.data, buf.len)
    finally:
        lib.mn_buf_free(buf)


__all__ = ["release_scratch", "scratch_buffer", "serialized"]
