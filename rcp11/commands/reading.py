"""Reading a stream: the stream at a key, and TREAD's reply for a range of
its offsets. Shared by TREAD (tread.py), acknowledged group reads
(groups.py) and the stream writers (streams.py)."""

from __future__ import annotations

from rcp11 import errors
from rcp11.errors import CommandError
from rcp11.limits import MAX_OFFSET
from rcp11.resp import Raw, array_header
from rcp11.state import ServerState
from rcp11.storage import Stream


def stream_reply(
    stream: Stream | None,
    start: int,
    count: int,
    withinfo: bool,
    resp3: bool,
    next_offset: int | None = None,
    extra: tuple[int, ...] = (),
) -> tuple[Raw, int]:
    """TREAD's reply for offsets start.. (at most count of them) as Raw
    RESP bytes, and how many offsets it holds (nulls included).
    next_offset: the stream's, when the caller already has it. extra: more
    integers after WITHINFO's four (a lease read's deliveries and deadline)."""
    if next_offset is None:
        next_offset = stream.next_offset if stream is not None else 0
    n = min(count, next_offset - start) if start < next_offset else 0
    if withinfo:
        first = stream.first_offset if stream is not None else 0
        # A stream that wrote offset 2^63-1 has next offset 2^63, which no
        # RESP integer holds: the info reports the ceiling instead.
        info = (min(first, MAX_OFFSET), next_offset - 1, min(start, MAX_OFFSET), n, *extra)
        # Integers and arrays are written alike in RESP2 and RESP3.
        head = b"*%d\r\n*%d\r\n" % (n + 1, len(info)) + b"".join([b":%d\r\n" % v for v in info])
    else:
        head = array_header(n)
    if n <= 0:
        return Raw(head), n
    # The core writes the header and the messages into one buffer: no
    # second copy of a large reply to join them.
    return Raw(stream.read_resp(start, n, resp3, head)), n  # type: ignore[union-attr]


def lookup_stream(state: ServerState, key: bytes) -> Stream | None:
    """The stream at key (None when missing); -WRONGTYPE for anything else."""
    value = state.keyspace.get(key)
    if value is not None and not isinstance(value, Stream):
        raise CommandError(errors.WRONGTYPE)
    return value


__all__ = ["lookup_stream", "stream_reply"]
