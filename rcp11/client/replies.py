"""Parsing rcp11's replies for redis-py: TREAD's (plain, WITHINFO,
WITHTIMES) into lists or ReadResult, TGROUP's into GroupInfo and
PendingRange, the same in RESP2 and RESP3; register_callbacks() teaches a
redis-py client (sync or asyncio) to use them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio

TWRITE = "TWRITE"
TREAD = "TREAD"
TEVICT = "TEVICT"
TACK = "TACK"
TGROUP = "TGROUP"


@dataclass(frozen=True)
class ReadResult:
    """A TREAD ... WITHINFO reply.

    ``messages[i]`` is the message at offset ``start + i``; ``None`` marks an
    offset that was evicted (or lost in a crash). ``count`` counts those
    nulls too, so ``start + count`` is where the next read continues.
    """

    first_offset: int
    """Oldest readable offset; equals ``next_offset`` when nothing is readable."""
    last_offset: int
    """Newest offset ever written (``-1`` for a never-written stream)."""
    start: int
    """Offset of ``messages[0]`` (negative request offsets come back resolved)."""
    count: int
    """Number of elements in ``messages``."""
    messages: list[Any] = field(default_factory=list)
    times: list[int | None] | None = None
    """With ``withtimes``: ``times[i]`` is the append time (unix ms) of
    ``messages[i]``, ``None`` where it was evicted; else ``None``."""
    deliveries: int = 0
    """A lease read's: how many times these messages were delivered, this
    time included (more than 1: a consumer's lease ran out on them)."""
    lease_deadline: int = 0
    """A lease read's: unix ms when the lease ends (0 for other reads)."""

    @property
    def next_offset(self) -> int:
        """Offset the next TWRITE to this stream will get."""
        return self.last_offset + 1

    @property
    def length(self) -> int:
        """Offsets in the readable range (first..last), evicted or not."""
        return self.next_offset - self.first_offset

    @property
    def end(self) -> int:
        """Offset just after the last element of this reply."""
        return self.start + self.count

    def items(self) -> Iterator[tuple[int, Any]]:
        """(offset, message) pairs, skipping evicted offsets."""
        for index, message in enumerate(self.messages):
            if message is not None:
                yield self.start + index, message

    def timed_items(self) -> Iterator[tuple[int, int, Any]]:
        """(offset, append time in unix ms, message), skipping evicted
        offsets; only for a read with ``withtimes``."""
        if self.times is None:
            raise ValueError("the read did not ask for times: tread(..., withtimes=True)")
        for index, message in enumerate(self.messages):
            if message is not None:
                yield self.start + index, self.times[index], message  # type: ignore[misc]


def _is_info(element: Any) -> bool:
    """WITHINFO's array of four integers, six for a lease read (a message is
    never an array, and a WITHTIMES pair in RESP3 has two elements)."""
    return isinstance(element, (list, tuple)) and len(element) in (4, 6)


def _split_times(elements: list[Any], count: int) -> tuple[list[Any], list[int | None]]:
    """A WITHTIMES reply's messages and times: RESP2 gives 2 x count
    elements (message, time, ...; two nulls when evicted), RESP3 count
    elements ([message, time] pairs, a null when evicted)."""
    if len(elements) == 2 * count and count:
        return list(elements[0::2]), [None if t is None else int(t) for t in elements[1::2]]
    messages: list[Any] = []
    times: list[int | None] = []
    for pair in elements:
        messages.append(None if pair is None else pair[0])
        times.append(None if pair is None else int(pair[1]))
    return messages, times


def parse_tread(
    response: Any, withtimes: bool = False, withinfo: bool = True, **_options: Any
) -> Any:
    """Response callback for TREAD, the same for RESP2 and RESP3.

    A BLOCK timeout (null array) is ``None``. A WITHINFO reply becomes a
    ``ReadResult``: it is recognised by its first element being an array of
    four integers, so raw ``execute_command("TREAD", ...)`` calls parse
    correctly too. Anything else is the list of messages. ``withtimes``
    (the client's ``tread(withtimes=True)``, which asks for WITHINFO too so
    that the count tells RESP2 from RESP3) fills ``ReadResult.times``; with
    ``withinfo=False`` the result is then a list of ``(message, time)``
    pairs, ``None`` where a message was evicted.
    """
    if response is None:
        return None
    if not (response and _is_info(response[0])):
        return list(response)
    info = response[0]
    count = int(info[3])
    messages, times = list(response[1:]), None
    if withtimes:
        messages, times = _split_times(messages, count)
        if not withinfo:
            return [None if m is None else (m, t) for m, t in zip(messages, times, strict=True)]
    lease = info[4:6] if len(info) >= 6 else (0, 0)
    return ReadResult(
        first_offset=int(info[0]),
        last_offset=int(info[1]),
        start=int(info[2]),
        count=count,
        messages=messages,
        deliveries=int(lease[0]),
        lease_deadline=int(lease[1]),
        times=times,
    )


def _parse_int(response: Any, **_options: Any) -> Any:
    return int(response) if isinstance(response, (bytes, str, int)) else response


@dataclass(frozen=True)
class GroupConsumer:
    """A consumer holding leases in an acknowledged group."""

    name: bytes
    pending: int
    expired: int
    lease_deadline: int


@dataclass(frozen=True)
class GroupInfo:
    """TGROUP INFO: a consumer group of a stream (docs/PROTOCOL.md)."""

    mode: str  # "acknowledged" or "plain"
    next_offset: int
    lag: int  # written and never delivered
    pending: int  # leased, not acknowledged
    pending_ranges: int
    expired: int  # of the pending: lease ran out, delivered next
    delivered: int
    redelivered: int
    acknowledged: int
    dropped: int  # evicted while pending
    consumers: list[GroupConsumer] = field(default_factory=list)


@dataclass(frozen=True)
class PendingRange:
    """One row of TGROUP PENDING: offsets start..start+count-1."""

    start: int
    count: int
    consumer: bytes
    deliveries: int
    lease_deadline: int


def _pairs(reply: Any) -> dict[str, Any]:
    """A map reply (RESP3) or a flat name/value array (RESP2) as a dict."""
    if isinstance(reply, (list, tuple)):
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in reply.items()}


def parse_tgroup(response: Any, **options: Any) -> Any:
    """Response callback for TGROUP: INFO becomes a GroupInfo, PENDING a
    list of PendingRange (the methods say which they asked for)."""
    sub = options.get("tgroup")
    if sub == "info":
        info = _pairs(response)
        consumers = [
            GroupConsumer(c["name"], c["pending"], c["expired"], c["lease-deadline"])
            for c in map(_pairs, info["consumers"])
        ]
        mode = info["mode"]
        return GroupInfo(
            mode.decode() if isinstance(mode, bytes) else mode,
            info["next-offset"],
            info["lag"],
            info["pending"],
            info["pending-ranges"],
            info["expired"],
            info["delivered"],
            info["redelivered"],
            info["acknowledged"],
            info["dropped"],
            consumers,
        )
    if sub == "pending":
        return [PendingRange(*row) for row in response]
    return response


STREAM_CALLBACKS: dict[str, Any] = {
    TWRITE: _parse_int,
    TREAD: parse_tread,
    TEVICT: _parse_int,
    TACK: _parse_int,
    TGROUP: parse_tgroup,
}


def register_callbacks(client: redis.Redis | redis.asyncio.Redis) -> None:
    """Teach an existing redis-py client (sync or asyncio) to parse rcp11 replies.

    Pipelines created afterwards share the client's callback table.
    """
    for name, callback in STREAM_CALLBACKS.items():
        client.set_response_callback(name, callback)
