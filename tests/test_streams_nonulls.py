"""TREAD ... NONULLS (docs/PROTOCOL.md section 3): a read that steps over
unreadable offsets -- an evicted prefix, the gap a crash leaves -- in one
request, on both servers: it starts at the first readable offset at or
after the one asked for and stops before the next null.

The streams have a gap in the middle as a crash leaves one: rcp11-server
loads it from an AOF holding the raise record its loader writes after a
crash; the module's RCP11.SKIPTO makes the same stream."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, ServerProcess, require, wait_blocked

from rcp11.resp import encode_command

# One key per test and server: tests write to them.
KEYS = [b"s%d" % index for index in range(80)]
_next_key = itertools.count()

# Every key: offsets 0..4 written, 0 and 1 evicted, a gap 5..1024, 1025..1027
# written, and a gap 1028..2047 at the end (next offset 2048).
LAYOUT = [
    [b"TWRITE", b"{key}", b"ENTRIES", b"a0", b"a1", b"a2", b"a3", b"a4"],
    [b"TEVICT", b"{key}", b"1"],
    [b"<raise>", b"{key}", b"1025"],
    [b"TWRITE", b"{key}", b"ENTRIES", b"b0", b"b1", b"b2"],
    [b"<raise>", b"{key}", b"2048"],
]


def layout_for(key: bytes, raise_name: bytes) -> list[list[bytes]]:
    return [
        [raise_name if a == b"<raise>" else key if a == b"{key}" else a for a in argv]
        for argv in LAYOUT
    ]


@pytest.fixture(scope="module", params=["rcp11", "module"])
def gapped(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[ServerProcess]:
    """A server of each kind holding every key of KEYS in LAYOUT's shape."""
    directory: Path = tmp_path_factory.mktemp(f"gapped-{request.param}")
    if request.param == "module":
        require("redis-server")
        server: ServerProcess = RedisModuleServer(directory).start()
        client = server.client()
        for key in KEYS:
            for argv in layout_for(key, b"RCP11.SKIPTO"):
                client.execute_command(*argv)
    else:
        server = ServerProcess(directory, appendonly="yes")
        aof = b"".join(
            encode_command(argv) for key in KEYS for argv in layout_for(key, b"RCP11-RAISE-NEXT")
        )
        (directory / "appendonly.aof").write_bytes(aof)
        server.start()
    yield server
    server.stop()


@pytest.fixture
def key() -> bytes:
    """A key in LAYOUT's shape no other test touched."""
    return KEYS[next(_next_key)]


@pytest.fixture(params=[2, 3])
def client(gapped: ServerProcess, request: pytest.FixtureRequest) -> redis.Redis:
    return gapped.client(protocol=request.param)


def read(client: redis.Redis, *argv: Any) -> Any:
    return client.execute_command("TREAD", *argv)


def test_without_nonulls_a_gap_reads_as_nulls(client: redis.Redis, key: bytes) -> None:
    got = read(client, key, 3, 5, "WITHINFO")
    assert got[0] == [2, 2047, 3, 5]
    assert got[1:] == [b"a3", b"a4", None, None, None]


@pytest.mark.parametrize(
    ("offset", "count", "info", "messages"),
    [
        (0, 10, [2, 2047, 2, 3], [b"a2", b"a3", b"a4"]),  # past the evicted prefix
        (3, 10, [2, 2047, 3, 2], [b"a3", b"a4"]),  # stops before the gap
        (5, 10, [2, 2047, 1025, 3], [b"b0", b"b1", b"b2"]),  # over 1020 nulls at once
        (5, 2, [2, 2047, 1025, 2], [b"b0", b"b1"]),
        (1026, 100, [2, 2047, 1026, 2], [b"b1", b"b2"]),
        (1028, 10, [2, 2047, 2048, 0], []),  # only a gap up to the end
        (5000, 10, [2, 2047, 5000, 0], []),  # past the end: where it was asked
        (-1030, 10, [2, 2047, 1025, 3], [b"b0", b"b1", b"b2"]),  # 2048 - 1030 = 1018
        (5, 0, [2, 2047, 1025, 0], []),
    ],
)
def test_nonulls_starts_at_a_readable_offset_and_stops_before_a_null(
    client: redis.Redis, key: bytes, offset: int, count: int, info: list[int], messages: list[bytes]
) -> None:
    got = read(client, key, offset, count, "NONULLS", "WITHINFO")
    assert got[0] == info
    assert got[1:] == messages
    assert read(client, key, offset, count, "nonulls") == messages  # any case, no info


def test_nonulls_on_a_missing_key_is_empty(client: redis.Redis) -> None:
    assert read(client, "no-such-stream", 5, 10, "WITHINFO", "NONULLS") == [[0, -1, 5, 0]]


def test_a_group_read_with_nonulls_moves_past_the_gap(client: redis.Redis, key: bytes) -> None:
    group = key + b":g"
    client.set(group, 4)
    assert read(client, key, 0, 3, "GROUP", group, "NONULLS") == [b"a4"]
    assert client.get(group) == b"5"
    assert read(client, key, 0, 2, "NONULLS", "GROUP", group) == [b"b0", b"b1"]
    assert client.get(group) == b"1027"
    assert read(client, key, 0, 5, "GROUP", group, "NONULLS", "WITHINFO") == [
        [2, 2047, 1027, 1],
        b"b2",
    ]
    # Nothing readable left: the group goes to the next offset, past the gap.
    assert read(client, key, 0, 5, "GROUP", group, "NONULLS") == []
    assert client.get(group) == b"2048"


def test_a_new_group_with_nonulls_starts_at_the_oldest_readable(
    client: redis.Redis, key: bytes
) -> None:
    group = key + b":new"
    client.delete(group)
    assert read(client, key, 0, 10, "NONULLS", "GROUP", group) == [b"a2", b"a3", b"a4"]
    assert client.get(group) == b"5"


def test_a_blocked_nonulls_read_waits_over_the_gap_for_the_next_write(
    gapped: ServerProcess, key: bytes
) -> None:
    """Inside a gap at the end there is nothing to read: the reader waits
    (without NONULLS it would get the nulls at once) and then gets the
    next message written, at the next offset."""
    client = gapped.client()
    got: dict[str, Any] = {}
    group = key + b":blocked"
    client.set(group, 1030)

    def plain() -> None:
        got["plain"] = gapped.client().execute_command(
            "TREAD", key, 1030, 10, "NONULLS", "BLOCK", 0, "WITHINFO"
        )

    def member() -> None:
        got["group"] = gapped.client().execute_command(
            "TREAD", key, 0, 10, "BLOCK", 0, "GROUP", group, "NONULLS"
        )

    threads = [threading.Thread(target=plain), threading.Thread(target=member)]
    for thread in threads:
        thread.start()
    wait_blocked(client, 2)
    first = client.execute_command("TWRITE", key, "ENTRIES", "c0", "c1")
    for thread in threads:
        thread.join(10)
    assert first == 2048
    assert got["plain"] == [[2, 2049, 2048, 2], b"c0", b"c1"]
    assert got["group"] == [b"c0", b"c1"]
    assert client.get(group) == b"2050"


def test_a_blocked_nonulls_reader_does_not_hold_up_a_plain_one(
    gapped: ServerProcess, key: bytes
) -> None:
    """Both wait at the next offset, the NONULLS reader first; a transaction
    writes there and evicts it at once. The plain reader's offset exists
    now (a null): it is answered, as a read would be; the NONULLS reader has
    nothing readable and waits on for the next write. rcp11-server kept
    both waiting in one line, the plain reader behind the other."""
    client = gapped.client()
    got: dict[str, Any] = {}

    def read_blocking(name: str, *options: Any) -> None:
        got[name] = gapped.client().execute_command("TREAD", key, 2048, 5, "BLOCK", 0, *options)

    first = threading.Thread(target=read_blocking, args=("nonulls", "NONULLS", "WITHINFO"))
    first.start()
    wait_blocked(client, 1)
    second = threading.Thread(target=read_blocking, args=("plain", "WITHINFO"))
    second.start()
    wait_blocked(client, 2)
    pipe = client.pipeline(transaction=True)
    pipe.execute_command("TWRITE", key, "evicted-at-once")
    pipe.execute_command("TEVICT", key, 2048)
    assert pipe.execute()[0] == 2048
    # At once (the module: 0.04 s); rcp11-server answered only when
    # something else touched the stream, 5 s later here.
    second.join(3)
    assert got.get("plain") == [[2049, 2048, 2048, 1], None]
    assert "nonulls" not in got
    assert client.execute_command("TWRITE", key, "kept") == 2049
    first.join(10)
    assert got["nonulls"] == [[2049, 2049, 2049, 1], b"kept"]


def test_nonulls_given_twice_is_a_syntax_error(client: redis.Redis, key: bytes) -> None:
    with pytest.raises(redis.ResponseError, match="syntax error, NONULLS given more than once"):
        read(client, key, 0, 1, "NONULLS", "WITHINFO", "nonulls")


def test_command_docs_list_nonulls(shared_server: ServerProcess) -> None:
    docs = shared_server.command("COMMAND", "DOCS", "tread")
    assert b"'NONULLS'" in repr(docs).encode().replace(b"b'", b"'")
