"""The storage core's errors: each MN_ERR_* return code of src/macronode.c
becomes one of these exceptions here, in :func:`check` and :func:`error`;
and the argument checks that refuse, before a C call, what the core would
refuse with MN_ERR_ARG."""

from __future__ import annotations

from rcp11.storage.binding import MAX_COMPRESSION_DEPTH, UINT64_MAX, lib


class StorageError(Exception):
    """A storage core call failed; ``code`` is the MN_ERR_* value."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class OffsetOverflowError(StorageError):
    """The write would give a message an offset past 2^63-1."""


class CorruptDataError(StorageError):
    """A serialized blob failed validation."""


class MessageTooBigError(StorageError, ValueError):
    """A message is larger than MAX_MESSAGE_BYTES."""


class InvalidArgumentError(StorageError, ValueError):
    """An argument outside its documented range."""


class StorageMemoryError(StorageError, MemoryError):
    """The C allocator failed; nothing was changed."""


_ERRORS: dict[int, tuple[type[StorageError], str]] = {
    lib.MN_ERR_NOMEM: (StorageMemoryError, "out of memory"),
    lib.MN_ERR_OVERFLOW: (OffsetOverflowError, "offset would pass 2^63-1"),
    lib.MN_ERR_TOOBIG: (MessageTooBigError, "message or node too big"),
    lib.MN_ERR_CORRUPT: (CorruptDataError, "corrupt stream data"),
    lib.MN_ERR_ARG: (InvalidArgumentError, "argument out of range"),
}


def error(rc: int) -> StorageError:
    """The exception for the MN_ERR_* code rc."""
    cls, message = _ERRORS.get(rc, (StorageError, f"storage error {rc}"))
    return cls(message, rc)


def check(rc: int) -> int:
    """Return rc when it is not an error, else raise the matching exception."""
    if rc >= 0:
        return rc
    raise error(rc)


# -- argument checks (MN_ERR_ARG, before the C call) ------------------------


def range_error(start: int, count: int, next_offset: int) -> InvalidArgumentError:
    return InvalidArgumentError(f"range {start}+{count} outside 0..{next_offset}", lib.MN_ERR_ARG)


def max_nodes_arg(max_nodes: int | None) -> int:
    """A node budget for the core (None: no budget)."""
    if max_nodes is None:
        return UINT64_MAX
    if max_nodes < 0:
        raise InvalidArgumentError("max_nodes must be >= 0", lib.MN_ERR_ARG)
    return min(max_nodes, UINT64_MAX)


def check_depth(depth: int) -> None:
    if not 0 <= depth <= MAX_COMPRESSION_DEPTH:
        raise InvalidArgumentError(
            f"compression depth must be between 0 and {MAX_COMPRESSION_DEPTH}", lib.MN_ERR_ARG
        )


def check_level(level: int) -> None:
    if not 0 <= level <= 9:
        raise InvalidArgumentError("compression level must be between 0 and 9", lib.MN_ERR_ARG)


__all__ = [
    "CorruptDataError",
    "InvalidArgumentError",
    "MessageTooBigError",
    "OffsetOverflowError",
    "StorageError",
    "StorageMemoryError",
    "check",
    "check_depth",
    "check_level",
    "error",
    "max_nodes_arg",
    "range_error",
]
