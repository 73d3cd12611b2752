"""The storage core's errors: each MN_ERR_* return code of src/macronode.c
becomes one of these exceptions here, in :func:`check` and :func:`error`."""

from __future__ import annotations

from rcp11.storage.binding import lib


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


__all__ = [
    "CorruptDataError",
    "InvalidArgumentError",
    "MessageTooBigError",
    "OffsetOverflowError",
    "StorageError",
    "StorageMemoryError",
    "check",
    "error",
]
