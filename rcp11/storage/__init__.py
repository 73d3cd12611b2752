"""The storage layer: the only door to the C core (rcp11._macronode, built
from src/). Everything above it sees :class:`Stream`, :class:`AckGroup`,
the C lane's :class:`LaneCall`, the C loop's :class:`CLoop` and the
exceptions below, never ``ffi`` or ``lib``.

    binding.py    the one import of rcp11._macronode; the core's limits
    errors.py     MN_ERR_* return codes as exceptions; argument checks
    buffers.py    the C buffers Stream's calls fill
    records.py    Evicted, NodeInfo, the MUTATIONS clock
    stream.py     Stream (src/macronode.c)
    ackgroups.py  AckGroup, an acknowledged group's state (src/ackgroup.c)
    lane.py       LaneCall, the C lane's call (src/lane.c)
    netloop.py    CLoop and CConnection, the C lane's event loop (src/netloop.c)
"""

from rcp11.storage.binding import (
    DEFAULT_MAX_ENTRIES,
    FORMAT_VERSION,
    MAX_COMPRESSION_DEPTH,
    MAX_MAX_ENTRIES,
    MAX_MESSAGE_BYTES,
    MAX_OFFSET,
    wall_ms,
)
from rcp11.storage.errors import (
    CorruptDataError,
    InvalidArgumentError,
    MessageTooBigError,
    OffsetOverflowError,
    StorageError,
    StorageMemoryError,
)
from rcp11.storage.records import MUTATIONS, Evicted, MutationClock, NodeInfo
from rcp11.storage.stream import Stream, total_length, validate_node_blob

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "FORMAT_VERSION",
    "MAX_COMPRESSION_DEPTH",
    "MAX_MAX_ENTRIES",
    "MAX_MESSAGE_BYTES",
    "MAX_OFFSET",
    "MUTATIONS",
    "CorruptDataError",
    "Evicted",
    "InvalidArgumentError",
    "MessageTooBigError",
    "MutationClock",
    "NodeInfo",
    "OffsetOverflowError",
    "StorageError",
    "StorageMemoryError",
    "Stream",
    "total_length",
    "validate_node_blob",
    "wall_ms",
]
