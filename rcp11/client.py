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

Pipelines (with or without MULTI/EXEC) have the same methods; their replies
go through the same callbacks. ``ClusterClient`` is the same for a Redis
Cluster of redis-servers with the rcp11 module (a ``redis.cluster.RedisCluster``).

This module talks to a server over the network only: importing it loads
redis-py and nothing of rcp11's server or C core.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.client
import redis.client
import redis.cluster
from redis.exceptions import DataError

__all__ = [
    "TWRITE",
    "TREAD",
    "TEVICT",
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

TWRITE = "TWRITE"
TREAD = "TREAD"
TEVICT = "TEVICT"

# Reads issued by the consumer helpers: large enough to amortise a round
# trip, small enough that one reply stays a few megabytes at most.
DEFAULT_BATCH = 1000
# Consumers wake up this often even when nothing arrives, so a caller that
# stops iterating is never stuck in a server-side wait for long.
DEFAULT_BLOCK_MS = 1000


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


def parse_tread(response: Any, **_options: Any) -> Any:
    """Response callback for TREAD, the same for RESP2 and RESP3.

    A BLOCK timeout (null array) is ``None``. A WITHINFO reply becomes a
    ``ReadResult``: it is recognised by its first element being an array,
    which a message never is, so raw ``execute_command("TREAD", ...)``
    calls parse correctly too. Anything else is the list of messages.
    """
    if response is None:
        return None
    if response and isinstance(response[0], (list, tuple)):
        info = response[0]
        return ReadResult(
            first_offset=int(info[0]),
            last_offset=int(info[1]),
            start=int(info[2]),
            count=int(info[3]),
            messages=list(response[1:]),
        )
    return list(response)


def _parse_int(response: Any, **_options: Any) -> Any:
    return int(response) if isinstance(response, (bytes, str, int)) else response


STREAM_CALLBACKS: dict[str, Any] = {TWRITE: _parse_int, TREAD: parse_tread, TEVICT: _parse_int}


def register_callbacks(client: redis.Redis | redis.asyncio.Redis) -> None:
    """Teach an existing redis-py client (sync or asyncio) to parse rcp11 replies.

    Pipelines created afterwards share the client's callback table.
    """
    for name, callback in STREAM_CALLBACKS.items():
        client.set_response_callback(name, callback)


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
        nonulls: bool = False,
    ) -> Any:
        """Read up to ``count`` messages of ``key`` starting at ``offset``.

        ``offset < 0`` counts back from the stream's next offset. The reply is
        a list with one element per offset, ``None`` where a message was
        evicted (or lost in a crash); with ``withinfo=True`` a ``ReadResult``.
        ``nonulls=True`` starts at the first readable offset at or after
        ``offset`` and stops before the next ``None``: a gap is stepped over
        in one request (``ReadResult.start`` says where the reply starts).
        ``block=ms`` waits (0 = forever) when nothing exists at ``offset`` yet
        (with ``nonulls``, nothing readable); a timeout returns ``None``.
        ``group``/``groupnew`` name a string key holding a consumer group's
        next offset; ``offset`` is then ignored by the server.
        """
        _check_offset("offset", offset)
        _check_offset("count", count)
        if group is not None and groupnew is not None:
            raise DataError("tread takes group or groupnew, not both")
        args: list[Any] = [TREAD, key, offset, count]
        if block is not None:
            args += ["BLOCK", _check_offset("block", block)]
        if group is not None:
            args += ["GROUP", group]
        elif groupnew is not None:
            args += ["GROUPNEW", groupnew]
        if withinfo:
            args.append("WITHINFO")
        if nonulls:
            args.append("NONULLS")
        return self.execute_command(*args)

    def tevict(self, key: Any, offset: int) -> Any:
        """Make every message of ``key`` at or before ``offset`` unreadable.

        ``offset = -n`` keeps the newest ``n`` messages instead. Returns how
        many messages this call evicted.
        """
        return self.execute_command(TEVICT, key, _check_offset("offset", offset))


class Pipeline(StreamCommands, redis.client.Pipeline):
    """A redis-py pipeline that also queues TWRITE / TREAD / TEVICT."""


class Client(StreamCommands, redis.Redis):
    """``redis.Redis`` plus rcp11 stream commands and consumer helpers.

    Unlike redis-py, ``socket_timeout`` defaults to ``None``: a TREAD BLOCK
    longer than the socket timeout would otherwise fail with TimeoutError.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "connection_pool" not in kwargs:
            kwargs.setdefault("socket_timeout", None)
        super().__init__(*args, **kwargs)
        register_callbacks(self)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        """A client for ``redis://[[user]:[password]@]host[:port][/db]`` (see redis-py)."""
        kwargs.setdefault("socket_timeout", None)
        return super().from_url(url, **kwargs)

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
    ) -> Iterator[tuple[int, Any]]:
        """Yield ``(offset, message)`` consumed through the group key ``group``.

        Several consumers of one group share the messages: each read moves the
        group past what it returned. A missing group starts at the oldest
        readable message, or with ``new=True`` at the next one written.
        Evicted offsets and crash gaps are stepped over (the group moves past
        them in one request).
        """
        option = {"groupnew": group} if new else {"group": group}
        _check_batch(batch)
        while True:
            result = self.tread(
                key, 0, batch, block=block_ms, withinfo=True, nonulls=True, **option
            )
            if result is not None:
                yield from result.items()


class ClusterClient(StreamCommands, redis.cluster.RedisCluster):
    """redis-py's ``RedisCluster`` plus the stream commands, for a Redis
    Cluster of redis-servers with the rcp11 module: each command goes to the
    node that owns its key (the module declares its keys to Redis)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        register_callbacks(self)  # type: ignore[arg-type]


class AsyncPipeline(StreamCommands, redis.asyncio.client.Pipeline):
    """An asyncio pipeline that also queues TWRITE / TREAD / TEVICT."""


class AsyncClient(StreamCommands, redis.asyncio.Redis):
    """``redis.asyncio.Redis`` plus rcp11 stream commands and consumer helpers.

    ``await client.twrite(...)``, ``await client.tread(...)`` and
    ``await client.tevict(...)`` return the same values as ``Client``;
    ``socket_timeout`` defaults to ``None`` for the same reason.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "connection_pool" not in kwargs:
            kwargs.setdefault("socket_timeout", None)
        super().__init__(*args, **kwargs)
        register_callbacks(self)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncClient:
        """An asyncio client for a ``redis://`` URL (see redis-py)."""
        kwargs.setdefault("socket_timeout", None)
        return super().from_url(url, **kwargs)

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
    ) -> AsyncIterator[tuple[int, Any]]:
        """Async version of ``Client.follow_group``."""
        option = {"groupnew": group} if new else {"group": group}
        _check_batch(batch)
        while True:
            result = await self.tread(
                key, 0, batch, block=block_ms, withinfo=True, nonulls=True, **option
            )
            if result is not None:
                for item in result.items():
                    yield item
