"""Reading a stream: the stream at a key, and TREAD's reply for a range of
its offsets. Shared by TREAD (tread.py), acknowledged group reads
(groups.py) and the stream writers (streams.py)."""

from __future__ import annotations

from dataclasses import dataclass

from rcp11 import errors
from rcp11.errors import CommandError
from rcp11.limits import MAX_OFFSET
from rcp11.resp import Raw, array_header
from rcp11.state import ClientState, ServerState
from rcp11.storage import Stream


@dataclass(frozen=True)
class ReplyForm:
    """How TREAD shapes its reply (docs/PROTOCOL.md section 3): the
    WITHINFO header, each message's append time (WITHTIMES: RESP2 two
    elements per offset, RESP3 a pair), and the PACKED form (the messages,
    and times, in two or three bulk strings whatever the count)."""

    withinfo: bool = False
    withtimes: bool = False
    packed: bool = False


PLAIN = ReplyForm()
WITHINFO = ReplyForm(withinfo=True)


def stream_reply(
    stream: Stream | None,
    start: int,
    count: int,
    form: ReplyForm,
    resp3: bool,
    next_offset: int | None = None,
    extra: tuple[int, ...] = (),
) -> tuple[Raw, int]:
    """TREAD's reply for offsets start.. (at most count of them) as Raw
    RESP bytes, and how many offsets it holds (nulls included).
    next_offset: the stream's, when the caller already has it. extra: more
    integers after WITHINFO's four (a lease read's deliveries and deadline)."""
    reply, n = _stream_reply(stream, start, count, form, resp3, next_offset, extra, None)
    assert type(reply) is Raw
    return reply, n


def reply_for(
    client: ClientState,
    stream: Stream | None,
    start: int,
    count: int,
    form: ReplyForm,
    next_offset: int,
    extra: tuple[int, ...] = (),
) -> tuple[Raw, int]:
    """stream_reply() for client, held to its output limit as Redis's
    addReply holds a reply: a reply that would take it past its hard limit
    closes it and is not built, nor is any once it is being closed
    (ClientState.output_dropped). The count is the read's either way: a
    group read still moves its group, a lease read still leases (the lease
    runs out and the offsets go to the group again)."""
    if client.output_dropped:
        return Raw(b""), _span(start, count, next_offset)  # never sent
    room = client.output_room()
    resp3 = client.resp == 3
    reply, n = _stream_reply(stream, start, count, form, resp3, next_offset, extra, room)
    if type(reply) is int:
        client.output_overflow(reply)
        client.output_dropped = True
        return Raw(b""), n  # never sent
    return reply, n  # type: ignore[return-value]


def _span(start: int, count: int, next_offset: int) -> int:
    """How many offsets a read of count from start holds (nulls included)."""
    return min(count, next_offset - start) if start < next_offset else 0


def _stream_reply(
    stream: Stream | None,
    start: int,
    count: int,
    form: ReplyForm,
    resp3: bool,
    next_offset: int | None,
    extra: tuple[int, ...],
    cap: int | None,
) -> tuple[Raw | int, int]:
    """stream_reply(), or when the reply would be over cap bytes (None: no
    cap) its size instead, unbuilt."""
    if next_offset is None:
        next_offset = stream.next_offset if stream is not None else 0
    n = _span(start, count, next_offset)
    if form.packed:
        elements = 3 if form.withtimes else 2
    else:
        elements = 2 * n if form.withtimes and not resp3 else n
    if form.withinfo:
        first = stream.first_offset if stream is not None else 0
        # A stream that wrote offset 2^63-1 has next offset 2^63, which no
        # RESP integer holds: the info reports the ceiling instead.
        info = (min(first, MAX_OFFSET), next_offset - 1, min(start, MAX_OFFSET), n, *extra)
        # Integers and arrays are written alike in RESP2 and RESP3.
        head = array_header(elements + 1) + b"*%d\r\n" % len(info)
        head += b"".join([b":%d\r\n" % v for v in info])
    else:
        head = array_header(elements)
    if n <= 0:  # PACKED of nothing: empty bulk strings
        return Raw(head + b"$0\r\n\r\n" * elements if form.packed else head), n
    # The core writes the header and the messages into one buffer: no
    # second copy of a large reply to join them.
    if form.packed:
        body = stream.read_packed_capped(start, n, form.withtimes, head, cap)  # type: ignore[union-attr]
    else:
        body = stream.read_resp_capped(start, n, resp3, head, cap, form.withtimes)  # type: ignore[union-attr]
    return (Raw(body) if type(body) is bytes else body), n


def readable_part(stream: Stream | None, start: int, count: int) -> tuple[int, int]:
    """TREAD ... NONULLS: where the read starts (the first readable offset
    at or after start, past evicted offsets and crash gaps) and how many
    offsets it covers (readable ones in a row, at most count)."""
    if stream is None:
        return start, 0
    return stream.readable_run(start, count)


def lookup_stream(state: ServerState, key: bytes) -> Stream | None:
    """The stream at key (None when missing); -WRONGTYPE for anything else."""
    value = state.keyspace.get(key)
    if value is not None and not isinstance(value, Stream):
        raise CommandError(errors.WRONGTYPE)
    return value


__all__ = [
    "PLAIN",
    "WITHINFO",
    "ReplyForm",
    "lookup_stream",
    "readable_part",
    "reply_for",
    "stream_reply",
]
