"""rcp11.client against a real server: commands, parsing, pipelines, consumers.
The tests that take `srv` run against rcp11-server and against redis-server
with the rcp11 module (stream_server)."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import (
    REPO,
    ServerProcess,
    start_with_gaps,
    tread_calls,
    wait_blocked,
)

from rcp11.client import AsyncClient, Client, ReadResult, parse_tread


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def rcp11_client_resp(
    request: pytest.FixtureRequest, stream_server: ServerProcess
) -> Iterator[Client]:
    """An rcp11.client.Client of stream_server in RESP2, then (a second run)
    in RESP3; the database is flushed first."""
    c = Client(host="127.0.0.1", port=stream_server.port, protocol=request.param)
    c.flushall()
    yield c
    c.close()


def new_client(srv: ServerProcess, protocol: int = 2) -> Client:
    return Client(host="127.0.0.1", port=srv.port, protocol=protocol)


# ---------------------------------------------------------------------------
# Import hygiene
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_importing_client_loads_no_server_code_and_no_rcp11_c_extension() -> None:
    code = (
        "import sys, rcp11.client\n"
        "print(sorted(m for m in sys.modules if m.startswith('rcp11')))\n"
        "print('_cffi_backend' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["['rcp11', 'rcp11.client', 'rcp11.client.replies']", "False"]


# ---------------------------------------------------------------------------
# Reply parsing without a server
# ---------------------------------------------------------------------------


def test_parse_tread_withinfo_builds_read_result() -> None:
    result = parse_tread([[3, 9, 4, 3], b"d", None, b"f"])
    assert result == ReadResult(3, 9, 4, 3, [b"d", None, b"f"])
    assert result.next_offset == 10
    assert result.length == 7
    assert result.end == 7
    assert list(result.items()) == [(4, b"d"), (6, b"f")]


def test_parse_tread_timeout_is_none_in_both_modes() -> None:
    assert parse_tread(None) is None


def test_raw_execute_command_replies_are_parsed_too(rcp11_client_resp: Client) -> None:
    rcp11_client_resp.twrite("s", b"a", b"b")
    assert rcp11_client_resp.execute_command("TREAD", "s", 1, 5) == [b"b"]
    raw = rcp11_client_resp.execute_command("TREAD", "s", 0, 5, "WITHINFO")
    assert raw == ReadResult(0, 1, 0, 2, [b"a", b"b"])
    assert rcp11_client_resp.execute_command("TWRITE", "s", "c") == 2


def test_argument_mistakes_fail_before_reaching_the_server() -> None:
    c = Client(host="127.0.0.1", port=1)  # nothing listens: must not be contacted
    with pytest.raises(redis.exceptions.DataError):
        c.twrite("k")
    with pytest.raises(redis.exceptions.DataError):
        c.tread("k", 0, 1, group="g1", groupnew="g2")
    with pytest.raises(redis.exceptions.DataError):
        c.tread("k", "0", 1)
    with pytest.raises(redis.exceptions.DataError):
        c.tevict("k", 1.5)
    with pytest.raises(redis.exceptions.DataError):
        next(c.follow("k", batch=0))


def test_blocking_reads_are_not_cut_by_redis_py_default_socket_timeout() -> None:
    assert Client(port=1).connection_pool.connection_kwargs["socket_timeout"] is None
    assert (
        Client.from_url("redis://127.0.0.1:1").connection_pool.connection_kwargs["socket_timeout"]
        is None
    )
    assert Client(port=1, socket_timeout=3).connection_pool.connection_kwargs["socket_timeout"] == 3


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------


def test_twrite_returns_first_offset_of_consecutive_entries(rcp11_client_resp: Client) -> None:
    assert rcp11_client_resp.twrite("s", b"a") == 0
    assert rcp11_client_resp.twrite("s", b"b", b"c", b"d") == 1
    assert rcp11_client_resp.twrite("s", "e") == 4
    assert rcp11_client_resp.tread("s", 0, 10) == [b"a", b"b", b"c", b"d", b"e"]


def test_single_entry_that_looks_like_an_option_is_stored_verbatim(
    rcp11_client_resp: Client,
) -> None:
    rcp11_client_resp.twrite("s", b"ENTRIES")
    rcp11_client_resp.twrite("s", b"BACKLOG")
    assert rcp11_client_resp.tread("s", 0, 10) == [b"ENTRIES", b"BACKLOG"]


def test_twrite_backlog_keeps_only_the_newest_messages(rcp11_client_resp: Client) -> None:
    rcp11_client_resp.twrite("s", *[b"m%d" % i for i in range(5)])
    assert rcp11_client_resp.twrite("s", b"m5", backlog=2) == 5
    info = rcp11_client_resp.tread("s", 0, 10, withinfo=True)
    assert (info.first_offset, info.last_offset) == (4, 5)
    assert info.messages == [None, None, None, None, b"m4", b"m5"]


def test_tread_withinfo_and_negative_offsets(rcp11_client_resp: Client) -> None:
    assert rcp11_client_resp.tread("missing", 0, 0, withinfo=True) == ReadResult(0, -1, 0, 0, [])
    rcp11_client_resp.twrite("s", *[b"%d" % i for i in range(10)])
    last_three = rcp11_client_resp.tread("s", -3, 10, withinfo=True)
    assert (last_three.start, last_three.count) == (7, 3)
    assert last_three.messages == [b"7", b"8", b"9"]
    assert rcp11_client_resp.tread("s", -3, 10) == [b"7", b"8", b"9"]
    info_only = rcp11_client_resp.tread("s", 0, 0, withinfo=True)
    assert info_only.messages == [] and info_only.next_offset == 10
    assert rcp11_client_resp.tread("s", 10, 5) == []


@pytest.mark.parametrize("transaction", [None, False, True])
def test_tread_withtimes_pairs_messages_with_their_times(
    rcp11_client_resp: Client, transaction: bool | None
) -> None:
    """The same values in RESP2 (a flat reply) and RESP3 (pairs), directly
    and in pipelines; evicted offsets are None."""
    before = time.time_ns() // 1_000_000
    rcp11_client_resp.twrite("s", b"a", b"b", b"c")
    rcp11_client_resp.tevict("s", 0)
    after = time.time_ns() // 1_000_000
    if transaction is None:
        pairs, result = (
            rcp11_client_resp.tread("s", 0, 10, withtimes=True),
            rcp11_client_resp.tread("s", -2, 10, withtimes=True, withinfo=True),
        )
    else:
        pipe = rcp11_client_resp.pipeline(transaction=transaction)
        pipe.tread("s", 0, 10, withtimes=True)
        pipe.tread("s", -2, 10, withtimes=True, withinfo=True)
        pairs, result = pipe.execute()
    t = pairs[1][1]
    assert before <= t <= after
    assert pairs == [None, (b"b", t), (b"c", t)]
    assert result == ReadResult(1, 2, 1, 2, [b"b", b"c"], [t, t])
    assert list(result.timed_items()) == [(1, t, b"b"), (2, t, b"c")]
    assert rcp11_client_resp.tread("s", 0, 1, withtimes=True) == [None]
    assert rcp11_client_resp.tread("s", 5, 1, withtimes=True) == []
    with pytest.raises(ValueError, match="withtimes"):
        list(rcp11_client_resp.tread("s", 0, 3, withinfo=True).timed_items())


def test_tevict_counts_and_leaves_nulls(rcp11_client_resp: Client) -> None:
    rcp11_client_resp.twrite("s", *[b"%d" % i for i in range(6)])
    assert rcp11_client_resp.tevict("s", 1) == 2
    assert rcp11_client_resp.tread("s", 0, 3) == [None, None, b"2"]
    assert rcp11_client_resp.tevict("s", -2) == 2  # keep the newest two
    assert rcp11_client_resp.tread("s", 0, 10) == [None, None, None, None, b"4", b"5"]
    assert rcp11_client_resp.tevict("missing", 5) == 0


def test_block_timeout_returns_none(rcp11_client_resp: Client) -> None:
    assert rcp11_client_resp.tread("s", 0, 10, block=50) is None
    assert rcp11_client_resp.tread("s", 0, 10, block=50, withinfo=True) is None


def test_blocked_tread_receives_a_later_write(
    stream_server: ServerProcess, rcp11_client_resp: Client
) -> None:
    writer = new_client(stream_server)

    def write_when_blocked() -> None:
        wait_blocked(writer, 1)
        writer.twrite("s", b"late")

    thread = threading.Thread(target=write_when_blocked)
    thread.start()
    try:
        assert rcp11_client_resp.tread("s", 0, 10, block=0) == [b"late"]
    finally:
        thread.join()
        writer.close()


def test_wrong_type_is_a_response_error(rcp11_client_resp: Client) -> None:
    rcp11_client_resp.set("plain", "x")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        rcp11_client_resp.tread("plain", 0, 1)


def test_group_reads_advance_the_group_key(rcp11_client_resp: Client) -> None:
    rcp11_client_resp.twrite("s", b"a", b"b", b"c")
    assert rcp11_client_resp.tread("s", 0, 2, group="g") == [b"a", b"b"]
    assert rcp11_client_resp.get("g") == b"2"
    assert rcp11_client_resp.tread("s", 0, 2, group="g", withinfo=True).messages == [b"c"]
    assert rcp11_client_resp.tread("s", 0, 2, groupnew="fresh") == []
    rcp11_client_resp.twrite("s", b"d")
    assert rcp11_client_resp.tread("s", 0, 2, groupnew="fresh") == [b"d"]


# ---------------------------------------------------------------------------
# Pipelines
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("transaction", [False, True], ids=["pipeline", "multi"])
def test_pipeline_replies_are_parsed(rcp11_client_resp: Client, transaction: bool) -> None:
    pipe = rcp11_client_resp.pipeline(transaction=transaction)
    pipe.twrite("s", b"a", b"b")
    pipe.twrite("s", b"c", backlog=2)
    pipe.tread("s", 0, 10)
    pipe.tread("s", 0, 10, withinfo=True)
    pipe.tevict("s", 1)
    if transaction:
        pipe.tread("s", 100, 10, block=0)  # inside MULTI a read never blocks
    results = pipe.execute()
    assert results[:3] == [0, 2, [None, b"b", b"c"]]
    assert results[3] == ReadResult(1, 2, 0, 3, [None, b"b", b"c"])
    assert results[4] == 1
    if transaction:
        assert results[5] == []


# ---------------------------------------------------------------------------
# Consumers
# ---------------------------------------------------------------------------


def test_follow_yields_existing_then_new_messages(
    stream_server: ServerProcess, rcp11_client_resp: Client
) -> None:
    rcp11_client_resp.twrite("s", b"old0", b"old1", b"old2")
    writer = new_client(stream_server)

    def write_later() -> None:
        wait_blocked(writer, 1)
        writer.twrite("s", b"new3", b"new4")

    thread = threading.Thread(target=write_later)
    thread.start()
    try:
        got = list(
            itertools.islice(rcp11_client_resp.follow("s", start=-2, batch=10, block_ms=2000), 4)
        )
    finally:
        thread.join()
        writer.close()
    assert got == [(1, b"old1"), (2, b"old2"), (3, b"new3"), (4, b"new4")]


def test_follow_skips_evicted_messages(rcp11_client_resp: Client) -> None:
    rcp11_client_resp.twrite("s", *[b"%d" % i for i in range(10)])
    rcp11_client_resp.tevict("s", 6)
    got = list(itertools.islice(rcp11_client_resp.follow("s", start=0, batch=2), 3))
    assert got == [(7, b"7"), (8, b"8"), (9, b"9")]


def test_follow_from_the_end_keeps_its_place_through_timeouts(stream_server: ServerProcess) -> None:
    """follow(start=-2) on a quiet stream: its BLOCK runs out, and messages
    written right then (before the next request) are the first it yields.
    It sent -2 again, now counted from the new end: it skipped all but the
    last two of them."""
    writer = new_client(stream_server)
    writer.delete("quiet")
    messages = [b"m%d" % i for i in range(10)]
    expected = list(enumerate(messages))

    class WritesAfterATimeout(Client):
        wrote = False

        def tread(self, *args: Any, **kwargs: Any) -> Any:
            result = super().tread(*args, **kwargs)
            if result is None and not self.wrote:
                self.wrote = True
                writer.twrite("quiet", *messages)
            return result

    class AsyncWritesAfterATimeout(AsyncClient):
        wrote = False

        async def tread(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().tread(*args, **kwargs)
            if result is None and not self.wrote:
                self.wrote = True
                writer.twrite("quiet", *messages)
            return result

    async def follow_async() -> list[tuple[int, Any]]:
        reader = AsyncWritesAfterATimeout(port=stream_server.port)
        try:
            got = []
            async for item in reader.follow("quiet", start=-2, block_ms=20):
                got.append(item)
                if item == expected[-1]:
                    return got
            return got
        finally:
            await reader.aclose()

    reader = WritesAfterATimeout(host="127.0.0.1", port=stream_server.port)
    try:
        following = reader.follow("quiet", start=-2, block_ms=20)
        got = []
        for item in following:  # up to the last message written
            got.append(item)
            if item == expected[-1]:
                break
        assert got == expected
        writer.delete("quiet")
        assert asyncio.run(follow_async()) == expected
    finally:
        reader.close()
        writer.close()


def test_group_consumers_split_the_messages(stream_server: ServerProcess) -> None:
    admin = new_client(stream_server)
    admin.flushall()
    received: dict[str, list[tuple[int, bytes]]] = {"a": [], "b": []}

    def consume(name: str) -> None:
        c = new_client(stream_server)
        try:
            stream = c.follow_group("s", "workers", new=True, batch=10, block_ms=5000)
            received[name] = list(itertools.islice(stream, 10))
        finally:
            c.close()

    threads = [threading.Thread(target=consume, args=(name,)) for name in received]
    for thread in threads:
        thread.start()
    try:
        wait_blocked(admin, 2)
        admin.twrite("s", *[b"m%d" % i for i in range(20)])
    finally:
        for thread in threads:
            thread.join(30)
    offsets_a = [offset for offset, _ in received["a"]]
    offsets_b = [offset for offset, _ in received["b"]]
    assert len(offsets_a) == len(offsets_b) == 10
    assert sorted(offsets_a + offsets_b) == list(range(20))
    assert admin.get("workers") == b"20"
    admin.close()


# ---------------------------------------------------------------------------
# asyncio
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_async_client_commands_and_pipeline(stream_server: ServerProcess, protocol: int) -> None:
    async def scenario() -> None:
        c = AsyncClient(host="127.0.0.1", port=stream_server.port, protocol=protocol)
        try:
            await c.flushall()
            assert await c.twrite("s", b"a", b"b", b"c") == 0
            assert await c.tread("s", 1, 5) == [b"b", b"c"]
            info = await c.tread("s", -1, 5, withinfo=True)
            assert info == ReadResult(0, 2, 2, 1, [b"c"])
            assert await c.tread("s", 3, 5, block=30) is None
            assert await c.tevict("s", 0) == 1
            async with c.pipeline(transaction=True) as pipe:
                pipe.twrite("s", b"d")
                pipe.tread("s", 0, 10, withinfo=True)
                results = await pipe.execute()
            assert results == [3, ReadResult(1, 3, 0, 4, [None, b"b", b"c", b"d"])]
        finally:
            await c.aclose()

    asyncio.run(scenario())


def test_async_follow_and_follow_group(stream_server: ServerProcess) -> None:
    async def scenario() -> None:
        reader = AsyncClient(host="127.0.0.1", port=stream_server.port)
        writer = AsyncClient(host="127.0.0.1", port=stream_server.port, protocol=3)
        try:
            await writer.flushall()
            await writer.twrite("s", b"x0")

            async def take(stream, n: int) -> list[tuple[int, bytes]]:
                items = []
                async for item in stream:
                    items.append(item)
                    if len(items) == n:
                        break
                return items

            following = asyncio.create_task(take(reader.follow("s", block_ms=2000), 3))
            await asyncio.sleep(0)
            await writer.twrite("s", b"x1", b"x2")
            assert await following == [(0, b"x0"), (1, b"x1"), (2, b"x2")]

            grouped = await take(reader.follow_group("s", "g", batch=2), 3)
            assert grouped == [(0, b"x0"), (1, b"x1"), (2, b"x2")]
            assert await writer.get("g") == b"3"
        finally:
            await reader.aclose()
            await writer.aclose()

    asyncio.run(scenario())


def test_python_client_sync_and_async_as_documented(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    import asyncio

    from rcp11.client import AsyncClient, Client

    cl = Client(port=shared_server.port)
    assert cl.twrite("events", b"a", b"b") == 0
    assert cl.twrite("events", b"c", backlog=2) == 2
    result = cl.tread("events", 0, 10, withinfo=True)
    assert (result.first_offset, result.last_offset, result.start, result.count) == (1, 2, 0, 3)
    assert result.messages == [None, b"b", b"c"]
    assert cl.tread("events", 5, 1, block=10) is None
    assert cl.tevict("events", 1) == 1
    follow = cl.follow("events", start=-5, block_ms=50)
    assert next(follow) == (2, b"c")
    group = cl.follow_group("events", "readers", block_ms=50)
    assert next(group) == (2, b"c")
    assert shared_client.get("readers") == b"3"

    async def scenario() -> list[Any]:
        client = AsyncClient(port=shared_server.port)
        first = await client.twrite("events", b"d", b"e")
        seen = []
        async for item in client.follow("events", start=first, block_ms=50):
            seen.append(item)
            if len(seen) == 2:
                break
        await client.aclose()
        return [first, seen]

    assert asyncio.run(scenario()) == [3, [(3, b"d"), (4, b"e")]]


@pytest.mark.slow
def test_consumers_step_over_a_crash_gap_in_one_request(server_factory: Any) -> None:
    """After a crash a stream may hold a gap of null offsets (up to 4 Mi on
    a hot stream): follow() and follow_group() read over it in one TREAD
    (NONULLS), not in thousands of pages of nulls."""
    srv = server_factory(appendonly="yes", start=False)
    start_with_gaps(srv, {b"s": (5, 200_000, 3)})
    client = new_client(srv)
    expected = [(i, b"a%d" % i) for i in range(5)] + [(200_000 + i, b"b%d" % i) for i in range(3)]
    before = tread_calls(client)
    assert list(itertools.islice(client.follow("s", batch=100, block_ms=100), 8)) == expected
    assert tread_calls(client) - before <= 3
    before = tread_calls(client)
    got = list(itertools.islice(client.follow_group("s", "g", batch=100, block_ms=100), 8))
    assert got == expected
    assert tread_calls(client) - before <= 3
    assert client.get("g") == b"200003"

    async def follow_async() -> list[tuple[int, Any]]:
        async_client = AsyncClient(port=srv.port)
        try:
            got = []
            async for item in async_client.follow("s", batch=100, block_ms=100):
                got.append(item)
                if len(got) == 8:
                    return got
            return got
        finally:
            await async_client.aclose()

    before = tread_calls(client)
    assert asyncio.run(follow_async()) == expected
    assert tread_calls(client) - before <= 3


def test_every_name_of_the_old_module_still_imports() -> None:
    """rcp11.client was one module before it became a package: a user's
    `from rcp11.client import X` of any of its public names still works."""
    import rcp11.client

    names = (
        "AsyncClient AsyncPipeline Client ClusterClient DEFAULT_BATCH DEFAULT_BLOCK_MS "
        "DEFAULT_LEASE_MS GroupConsumer GroupInfo PendingRange Pipeline ReadResult "
        "STREAM_CALLBACKS StreamCommands TACK TEVICT TGROUP TREAD TWRITE parse_tgroup "
        "parse_tread register_callbacks"
    ).split()
    assert [name for name in names if not hasattr(rcp11.client, name)] == []
