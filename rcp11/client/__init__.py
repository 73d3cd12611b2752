"""A redis-py client for rcp11 streams: TWRITE, TREAD, TEVICT and consumers.

``Client`` is a ``redis.Redis`` (and ``AsyncClient`` a ``redis.asyncio.Redis``)
that knows the three RCP 11 commands and parses their replies the same way in
RESP2 and RESP3. Everything a plain redis-py client does still works::

    from rcp11.client import Client

    r = Client(port=6379)
    first = r.twrite("events", b"a", b"b", b"c")      # -> offset of b"a"
    r.tread("events", first, 10)                       # -> [b"a", b"b", b"c"]
    info = r.tread("events", 0, 0, withinfo=True)      # -> ReadResult(...)
    for offset, message in r.follow("events", start=-10):
        ...                                            # waits with BLOCK
    for offset, message in r.follow_group("jobs", "{jobs}:workers", lease_ms=30_000):
        ...            # at least once: a batch is acknowledged (TACK) once
                       # the loop asks for more; a consumer that dies gets
                       # it delivered again to the group when its lease ends

Pipelines (with or without MULTI/EXEC) have the same methods; their replies
go through the same callbacks. ``ClusterClient`` is the same for a Redis
Cluster of redis-servers with the rcp11 module (a ``redis.cluster.RedisCluster``).

This module talks to a server over the network only: importing it loads
redis-py and nothing of rcp11's server or C core.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.client
import redis.client
import redis.cluster
from redis.exceptions import DataError

# STREAM_CALLBACKS and parse_tgroup were public names of the one module
# rcp11.client was: still importable from here.
from rcp11.client.replies import (  # noqa: F401
    STREAM_CALLBACKS,
    TACK,
    TEVICT,
    TGROUP,
    TREAD,
    TWRITE,
    GroupConsumer,
    GroupInfo,
    PendingRange,
    ReadResult,
    parse_tgroup,
    parse_tread,
    register_callbacks,
)

__all__ = [
    "TWRITE",
    "TREAD",
    "TEVICT",
    "TACK",
    "TGROUP",
    "GroupConsumer",
    "GroupInfo",
    "PendingRange",
    "ReadResult",
    "StreamCommands",
    "Client",
    "Pipeline",
    "AsyncClient",
    "AsyncPipeline",
    "ClusterClient",
    "parse_tread",
    "register_callbacks",
]


# Reads issued by the consumer helpers: large enough to amortise a round
# trip, small enough that one reply stays a few megabytes at most.
DEFAULT_BATCH = 1000
# Consumers wake up this often even when nothing arrives, so a caller that
# stops iterating is never stuck in a server-side wait for long.
DEFAULT_BLOCK_MS = 1000
# How long an acknowledged consumer holds a batch before the group gives it
# to someone else: the longest a batch may take to process.
DEFAULT_LEASE_MS = 30_000


def _check_batch(batch: int) -> int:
    # A zero batch would make a consumer spin on empty replies forever.
    if _check_offset("batch", batch) < 1:
        raise DataError(f"batch must be at least 1, got {batch}")
    return batch


def _check_offset(name: str, value: object) -> int:
    # bool is an int subclass; passing True as an offset is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{name} must be an integer, got {value!r}")
    return value


class StreamCommands:
    """TWRITE / TREAD / TEVICT for any redis-py command executor.

    Each method only builds arguments and calls ``self.execute_command``, so
    the same code serves a sync client (returns the parsed reply), an asyncio
    client (returns an awaitable) and a pipeline (queues the command and
    returns the pipeline).
    """

    # Provided by the redis-py class this is mixed into; a bare annotation
    # (no value) so it never shadows the real method in the MRO.
    execute_command: Callable[..., Any]

    def twrite(self, key: Any, *entries: Any, backlog: int | None = None) -> Any:
        """Append ``entries`` to the stream ``key`` atomically.

        Returns the offset given to the first entry; the others follow
        consecutively. ``backlog=n`` then evicts so that only the newest ``n``
        messages stay readable.
        """
        if not entries:
            raise DataError("twrite needs at least one entry")
        args: list[Any] = [TWRITE, key]
        if backlog is not None:
            args += ["BACKLOG", _check_offset("backlog", backlog)]
        if len(entries) > 1 or backlog is not None:
            # The simple form `TWRITE key entry` is ambiguous with options, so
            # anything else goes through the explicit ENTRIES form.
            args.append("ENTRIES")
        args.extend(entries)
        return self.execute_command(*args)

    def tread(
        self,
        key: Any,
        offset: int,
        count: int,
        block: int | None = None,
        group: Any = None,
        groupnew: Any = None,
        withinfo: bool = False,
        lease: int | None = None,
        consumer: Any = None,
        ack: tuple[int, int] | ReadResult | None = None,
        withtimes: bool = False,
        nonulls: bool = False,
    ) -> Any:
        """Read up to ``count`` messages of ``key`` starting at ``offset``.

        ``offset < 0`` counts back from the stream's next offset. The reply is
        a list with one element per offset, ``None`` where a message was
        evicted (or lost in a crash); with ``withinfo=True`` a ``ReadResult``.
        ``withtimes=True`` adds each message's append time (unix ms):
        ``(message, time)`` pairs in the list, ``ReadResult.times`` with
        ``withinfo``. ``nonulls=True`` starts at the first readable offset at
        or after ``offset`` and stops before the next ``None``: a gap is
        stepped over in one request (``ReadResult.start`` says where the
        reply starts). ``block=ms`` waits (0 = forever) when nothing exists
        at ``offset`` yet (with ``nonulls``, nothing readable); a timeout
        returns ``None``. ``group``/``groupnew`` name a string key holding a
        consumer group's next offset; ``offset`` is then ignored by the
        server.

        ``lease=ms`` makes it an acknowledged group read: the messages are
        leased to ``consumer`` for that long and come back (a ``ReadResult``
        with ``deliveries``) to the group if not acknowledged in time;
        ``ack=(start, count)`` (or the previous ``ReadResult``) acknowledges
        a batch first, as ``tack`` does. A lease read keeps its nulls (no
        ``nonulls``) and has no times (no ``withtimes``): its reply is the
        range to acknowledge.
        """
        _check_offset("offset", offset)
        _check_offset("count", count)
        if group is not None and groupnew is not None:
            raise DataError("tread takes group or groupnew, not both")
        if lease is None and (consumer is not None or ack is not None):
            raise DataError("consumer and ack need lease")
        args: list[Any] = [TREAD, key, offset, count]
        if block is not None:
            args += ["BLOCK", _check_offset("block", block)]
        if group is not None:
            args += ["GROUP", group]
        elif groupnew is not None:
            args += ["GROUPNEW", groupnew]
        if withinfo or withtimes:
            args.append("WITHINFO")
        if nonulls:
            args.append("NONULLS")
        if lease is not None:
            args += ["LEASE", _check_offset("lease", lease)]
            if consumer is not None:
                args += ["CONSUMER", consumer]
            if ack is not None:
                start, n = (ack.start, ack.count) if isinstance(ack, ReadResult) else ack
                args += ["ACK", _check_offset("ack start", start), _check_offset("ack count", n)]
        if withtimes:
            args.append("WITHTIMES")
            return self.execute_command(*args, withtimes=True, withinfo=withinfo)
        return self.execute_command(*args)

    def tack(self, group: Any, start: int, count: int) -> Any:
        """Acknowledge offsets ``start .. start+count-1`` of an acknowledged
        group: they are never delivered again. Returns how many were
        pending."""
        return self.execute_command(
            TACK, group, _check_offset("start", start), _check_offset("count", count)
        )

    def tgroup_info(self, key: Any, group: Any) -> Any:
        """The group ``group`` of the stream ``key``: a ``GroupInfo``."""
        return self.execute_command(TGROUP, "INFO", key, group, tgroup="info")

    def tgroup_pending(self, key: Any, group: Any, offset: int = 0, count: int = 100) -> Any:
        """Up to ``count`` pending ranges of an acknowledged group from
        ``offset`` on: a list of ``PendingRange``."""
        return self.execute_command(
            TGROUP,
            "PENDING",
            key,
            group,
            _check_offset("offset", offset),
            _check_offset("count", count),
            tgroup="pending",
        )

    def tevict(self, key: Any, offset: int) -> Any:
        """Make every message of ``key`` at or before ``offset`` unreadable.

        ``offset = -n`` keeps the newest ``n`` messages instead. Returns how
        many messages this call evicted.
        """
        return self.execute_command(TEVICT, key, _check_offset("offset", offset))


class _GroupReads:
    """The reads of follow_group(): their arguments, and in acknowledged
    mode what to acknowledge next (the whole last batch, in the next read)
    or on the way out (what was taken before the message the loop stopped
    at)."""

    def __init__(
        self, key: Any, group: Any, new: bool, batch: int, lease_ms: int | None, consumer: Any
    ) -> None:
        self.key = key
        self.batch = _check_batch(batch)
        self.group = {"groupnew": group} if new else {"group": group}
        # A plain group steps over nulls (NONULLS); a lease read keeps them.
        self.mode = (
            {"nonulls": True} if lease_ms is None else {"lease": lease_ms, "consumer": consumer}
        )
        self.ack: ReadResult | None = None
        self.taken = 0  # of the batch being handed out: how many were asked past

    def args(self) -> tuple[Any, int, int]:
        return self.key, 0, self.batch

    def options(self) -> dict[str, Any]:
        options = {"withinfo": True, **self.group, **self.mode}
        if self.ack is not None:
            options["ack"] = self.ack
            self.ack = None
        return options

    def done(self, result: ReadResult) -> None:
        if "lease" in self.mode:
            self.ack = result


class Pipeline(StreamCommands, redis.client.Pipeline):
    """A redis-py pipeline that also queues TWRITE / TREAD / TEVICT."""


class _Connecting:
    """What Client and AsyncClient add to redis-py's constructors: the rcp11
    reply callbacks, and ``socket_timeout`` None by default (a TREAD BLOCK
    longer than a socket timeout would fail with TimeoutError)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "connection_pool" not in kwargs:
            kwargs.setdefault("socket_timeout", None)
        super().__init__(*args, **kwargs)
        register_callbacks(self)  # type: ignore[arg-type]

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Any:
        """A client for ``redis://[[user]:[password]@]host[:port][/db]`` (see redis-py)."""
        kwargs.setdefault("socket_timeout", None)
        return super().from_url(url, **kwargs)  # type: ignore[misc]


class Client(_Connecting, StreamCommands, redis.Redis):
    """``redis.Redis`` plus rcp11 stream commands and consumer helpers.

    Unlike redis-py, ``socket_timeout`` defaults to ``None``: a TREAD BLOCK
    longer than the socket timeout would otherwise fail with TimeoutError.
    """

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        """A pipeline (MULTI/EXEC when ``transaction``) with the stream commands."""
        return Pipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)

    def follow(
        self,
        key: Any,
        start: int = 0,
        batch: int = DEFAULT_BATCH,
        block_ms: int = DEFAULT_BLOCK_MS,
    ) -> Iterator[tuple[int, Any]]:
        """Yield ``(offset, message)`` for every message from ``start`` on, forever.

        Waits with TREAD BLOCK when caught up. ``start < 0`` begins that many
        offsets before the end. Evicted offsets and the gap a crash may leave
        are stepped over in one request each (TREAD ... NONULLS), and a
        reader that fell behind eviction jumps to the oldest readable message.
        """
        offset = start
        _check_batch(batch)
        if offset < 0:
            # Counted from the end once, now: sent again after a BLOCK that
            # ran out, it would count from the end as it is then, past the
            # messages written in between.
            offset = self.tread(key, offset, 0, withinfo=True).start
        while True:
            result = self.tread(key, offset, batch, block=block_ms, withinfo=True, nonulls=True)
            if result is None:
                continue
            yield from result.items()
            offset = result.end

    def follow_group(
        self,
        key: Any,
        group: Any,
        new: bool = False,
        batch: int = DEFAULT_BATCH,
        block_ms: int = DEFAULT_BLOCK_MS,
        lease_ms: int | None = None,
        consumer: Any = None,
    ) -> Iterator[tuple[int, Any]]:
        """Yield ``(offset, message)`` consumed through the group key ``group``.

        Several consumers of one group share the messages: each read moves the
        group past what it returned. A missing group starts at the oldest
        readable message, or with ``new=True`` at the next one written.
        Evicted offsets and crash gaps are stepped over (the group moves past
        them in one request).

        With ``lease_ms`` the group is acknowledged (at least once): each
        batch is leased to ``consumer`` for ``lease_ms`` and acknowledged
        once the loop asks for the message after its last (with the next
        read). A loop that stops (``break``, an exception) acknowledges the
        messages before the one it stopped at; a consumer that dies
        acknowledges nothing, and its batch goes to the group's next reader
        when the lease runs out (``ReadResult.deliveries`` counts that).
        """
        reads = _GroupReads(key, group, new, batch, lease_ms, consumer)
        while True:
            result = self.tread(*reads.args(), block=block_ms, **reads.options())
            if result is None:
                continue
            if lease_ms is None:
                yield from result.items()
                continue
            try:
                for index, message in enumerate(result.messages):
                    reads.taken = index  # the ones before it were asked past
                    if message is not None:
                        yield result.start + index, message
            except GeneratorExit:
                if reads.taken:
                    with contextlib.suppress(redis.RedisError):
                        self.tack(group, result.start, reads.taken)
                raise
            reads.done(result)


class ClusterClient(StreamCommands, redis.cluster.RedisCluster):
    """redis-py's ``RedisCluster`` plus the stream commands, for a Redis
    Cluster of redis-servers with the rcp11 module: each command goes to the
    node that owns its key (the module declares its keys to Redis)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        register_callbacks(self)  # type: ignore[arg-type]


class AsyncPipeline(StreamCommands, redis.asyncio.client.Pipeline):
    """An asyncio pipeline that also queues TWRITE / TREAD / TEVICT."""


class AsyncClient(_Connecting, StreamCommands, redis.asyncio.Redis):
    """``redis.asyncio.Redis`` plus rcp11 stream commands and consumer helpers.

    ``await client.twrite(...)``, ``await client.tread(...)`` and
    ``await client.tevict(...)`` return the same values as ``Client``;
    ``socket_timeout`` defaults to ``None`` for the same reason.
    """

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> AsyncPipeline:
        """An asyncio pipeline (MULTI/EXEC when ``transaction``) with the stream commands."""
        return AsyncPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)

    async def follow(
        self,
        key: Any,
        start: int = 0,
        batch: int = DEFAULT_BATCH,
        block_ms: int = DEFAULT_BLOCK_MS,
    ) -> AsyncIterator[tuple[int, Any]]:
        """Async version of ``Client.follow``."""
        offset = start
        _check_batch(batch)
        if offset < 0:  # counted from the end once (Client.follow)
            offset = (await self.tread(key, offset, 0, withinfo=True)).start
        while True:
            result = await self.tread(
                key, offset, batch, block=block_ms, withinfo=True, nonulls=True
            )
            if result is None:
                continue
            for item in result.items():
                yield item
            offset = result.end

    async def follow_group(
        self,
        key: Any,
        group: Any,
        new: bool = False,
        batch: int = DEFAULT_BATCH,
        block_ms: int = DEFAULT_BLOCK_MS,
        lease_ms: int | None = None,
        consumer: Any = None,
    ) -> AsyncIterator[tuple[int, Any]]:
        """Async version of ``Client.follow_group``. Leaving an ``async for``
        early does not close an async generator: wrap it in
        ``contextlib.aclosing()`` so that a loop that stops acknowledges what
        it took."""
        reads = _GroupReads(key, group, new, batch, lease_ms, consumer)
        while True:
            result = await self.tread(*reads.args(), block=block_ms, **reads.options())
            if result is None:
                continue
            try:
                for index, message in enumerate(result.messages):
                    reads.taken = index  # the ones before it were asked past
                    if message is not None:
                        yield result.start + index, message
            except GeneratorExit:
                if lease_ms is not None and reads.taken:
                    with contextlib.suppress(redis.RedisError):
                        await self.tack(group, result.start, reads.taken)
                raise
            reads.done(result)
