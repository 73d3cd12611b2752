"""The one import of the compiled C core (rcp11._macronode, built from
src/ by src/build_macronode.py): ``ffi`` and ``lib`` for the other modules
of this package, the core's limits, and the check that the extension is
not stale. Nothing outside rcp11/storage/ imports ``rcp11._macronode``
(tests/test_layers.py keeps it so).
"""

from __future__ import annotations

import time

try:
    from rcp11._macronode import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "rcp11._macronode is not built; run `pip install -e .` in the rcp11 checkout"
    ) from exc

EXPECTED_ABI_VERSION = 13

if lib.mn_abi_version() != EXPECTED_ABI_VERSION:  # pragma: no cover - stale build only
    raise ImportError(
        f"rcp11._macronode has ABI version {lib.mn_abi_version()}, rcp11.storage expects "
        f"{EXPECTED_ABI_VERSION}: the extension is stale, rebuild it with `pip install -e .`"
    )

MAX_OFFSET: int = lib.MN_MAX_OFFSET
MAX_MESSAGE_BYTES: int = lib.MN_MAX_MESSAGE_BYTES
DEFAULT_MAX_ENTRIES: int = lib.MN_DEFAULT_MAX_ENTRIES
MAX_MAX_ENTRIES: int = lib.MN_MAX_MAX_ENTRIES
FORMAT_VERSION: int = lib.MN_FORMAT_VERSION
MAX_COMPRESSION_DEPTH: int = lib.MN_MAX_COMPRESSION_DEPTH

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1

# now_ms for "the wall clock, read by the core": cheaper than reading it
# here (a Python call, a big-integer division and a slower conversion of a
# 13-digit int cost ~1,700 instructions per append, 35% of a one-message
# append through Stream).
NOW: int = lib.MN_NOW


def wall_ms() -> int:
    """The wall clock in unix milliseconds (what MN_NOW makes the core use)."""
    return time.time_ns() // 1_000_000


def clamp_ms(ms: int) -> int:
    """A time in unix ms brought into int64's range."""
    return INT64_MIN if ms < INT64_MIN else INT64_MAX if ms > INT64_MAX else ms


__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "FORMAT_VERSION",
    "MAX_COMPRESSION_DEPTH",
    "MAX_MAX_ENTRIES",
    "MAX_MESSAGE_BYTES",
    "MAX_OFFSET",
    "NOW",
    "clamp_ms",
    "ffi",
    "lib",
    "wall_ms",
]
