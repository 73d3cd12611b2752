"""Many clients one request at a time, as application code talks to the
server: the C loop serves the requests that arrive while it writes replies
without returning to Python (src/netloop.c's nl_run), and hands over to
Python whatever the lane does not run. Every client must still get its own
replies, in order, every write must be counted and logged, and a kill -9
must lose no acknowledged write."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import fill

from rcp11.resp import encode_command

CLIENTS = 32
ROUNDS = 120
KEYS = 4


def _request(*argv: bytes | str) -> bytes:
    return encode_command([a.encode() if isinstance(a, str) else a for a in argv])


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *argv: bytes | str
) -> bytes:
    """One request, its whole reply as bytes (a line, or a line and a bulk,
    or an array of bulks)."""
    writer.write(_request(*argv))
    await writer.drain()
    line = await reader.readline()
    if line[:1] == b"*":
        out = [line]
        for _ in range(int(line[1:])):
            head = await reader.readline()
            out.append(head)
            if head[:1] == b"$" and int(head[1:]) >= 0:
                out.append(await reader.readexactly(int(head[1:]) + 2))
        return b"".join(out)
    if line[:1] == b"$" and int(line[1:]) >= 0:
        return line + await reader.readexactly(int(line[1:]) + 2)
    return line


async def _client(port: int, c: int, log: list[tuple[bytes, int, bytes]]) -> None:
    """ROUNDS of: TWRITE (the lane), TREAD of what it wrote (the lane), and
    now and then commands the lane does not run (INCR, a transaction,
    TYPE behind a TREAD in one write), checking each reply as it comes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = f"k{c % KEYS}".encode()
    try:
        for i in range(ROUNDS):
            message = f"c{c}-{i}".encode()
            reply = await _exchange(reader, writer, b"TWRITE", key, message)
            assert reply[:1] == b":", reply
            offset = int(reply[1:])
            log.append((key, offset, message))
            reply = await _exchange(reader, writer, b"TREAD", key, str(offset), b"1")
            assert reply == b"*1\r\n$%d\r\n%s\r\n" % (len(message), message), reply
            if i % 10 == 3:
                reply = await _exchange(reader, writer, b"INCR", f"n{c}")
                assert reply == b":%d\r\n" % (i // 10 + 1), reply
            if i % 10 == 7:
                writer.write(
                    _request(b"MULTI")
                    + _request(b"TWRITE", key, message + b"x")
                    + _request(b"GET", f"n{c}")
                    + _request(b"EXEC")
                )
                await writer.drain()
                assert await reader.readline() == b"+OK\r\n"
                assert await reader.readline() == b"+QUEUED\r\n"
                assert await reader.readline() == b"+QUEUED\r\n"
                assert await reader.readline() == b"*2\r\n"
                reply = await reader.readline()
                assert reply[:1] == b":", reply
                log.append((key, int(reply[1:]), message + b"x"))
                count = b"%d" % (i // 10 + 1)
                assert await reader.readline() == b"$%d\r\n" % len(count)
                assert await reader.readline() == count + b"\r\n"
            if i % 10 == 9:
                # A read and a general-path command in one write.
                writer.write(_request(b"TREAD", key, str(offset), b"1") + _request(b"TYPE", key))
                await writer.drain()
                assert await reader.readline() == b"*1\r\n"
                assert await reader.readline() == b"$%d\r\n" % len(message)
                assert await reader.readline() == message + b"\r\n"
                assert await reader.readline() == b"+rcp11-log\r\n"
    finally:
        writer.close()


def _run_clients(port: int) -> list[tuple[bytes, int, bytes]]:
    log: list[tuple[bytes, int, bytes]] = []

    async def main() -> None:
        await asyncio.gather(*(_client(port, c, log) for c in range(CLIENTS)))

    asyncio.run(main())
    return log


def _check_streams(client: redis.Redis, log: list[tuple[bytes, int, bytes]]) -> None:
    """Each key's offsets run 0.. without a gap or a repeat, each holds the
    message its TWRITE was answered for, and each client's messages come in
    the order it wrote them."""
    by_key: dict[bytes, dict[int, bytes]] = {}
    for key, offset, message in log:
        assert offset not in by_key.setdefault(key, {}), (key, offset)
        by_key[key][offset] = message
    for key, written in by_key.items():
        assert sorted(written) == list(range(len(written))), key
        stored = client.execute_command("TREAD", key, 0, len(written) + 10)
        assert stored == [written[o] for o in range(len(written))], key


@pytest.mark.parametrize(
    ("appendonly", "coalesce"), [("no", "10"), ("yes", "10"), ("no", "0"), ("no", "1000")]
)
def test_clients_one_request_at_a_time_get_their_own_replies(
    server_factory: Any, appendonly: str, coalesce: str
) -> None:
    """Also with the loop waiting for more ready connections between polls
    (lane-coalesce-usec: the default, off, the longest)."""
    server = server_factory(
        appendonly=appendonly, appendfsync="always", **{"lane-coalesce-usec": coalesce}
    )
    assert server.client().config_get("lane-coalesce-usec") == {"lane-coalesce-usec": coalesce}
    log = _run_clients(server.port)
    client = server.client()
    assert len(log) == CLIENTS * (ROUNDS + ROUNDS // 10)
    _check_streams(client, log)
    stats = client.info("commandstats")
    # The lane's calls reach INFO like the general path's.
    assert stats["cmdstat_twrite"]["calls"] == len(log)
    assert stats["cmdstat_tread"]["calls"] >= CLIENTS * ROUNDS
    assert client.info("stats")["total_messages_written"] == len(log)
    if appendonly == "yes":
        # Every acknowledged write was in the AOF before its reply left.
        server.kill9()
        server.start()
        _check_streams(server.client(), log)


async def _reader(port: int, reads: int, seen: list[bytes]) -> None:
    """TREAD s 1 1 one at a time until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(reads):
            try:
                seen.append(await _exchange(reader, writer, b"TREAD", b"s", b"1", b"1"))
            except (ConnectionError, asyncio.IncompleteReadError):
                return
    finally:
        writer.close()


def test_no_reply_shows_a_write_the_full_disk_kept_out_of_the_aof(
    small_fs: Path, server_factory: Any
) -> None:
    """A TWRITE runs but the AOF cannot take it (the disk is full): its
    reply is dropped, and while the AOF still holds it unwritten no reader
    may see the message either, however many requests the C loop serves
    before it returns to Python (they are dropped and their clients
    closed, as the writer was)."""
    server = server_factory(
        dir=small_fs,
        logfile=small_fs.parent / "server.log",
        appendonly="yes",
        appendfsync="always",
    )
    client = server.client(socket_timeout=10)
    assert client.execute_command("TWRITE", "s", b"first") == 0
    filler = fill(small_fs)
    unlogged = b"z" * 1_500_000  # past the AOF's preallocated room
    with pytest.raises(redis.exceptions.ConnectionError):
        client.execute_command("TWRITE", "s", unlogged)
    seen: list[bytes] = []

    async def main() -> None:
        await asyncio.gather(*(_reader(server.port, 50, seen) for _ in range(CLIENTS)))

    asyncio.run(main())
    assert not [reply for reply in seen if unlogged in reply]
    server.kill9()
    filler.unlink()
    server.start()
    # The unlogged write is gone (its offset shows as a null, never reused).
    stored = server.client().execute_command("TREAD", "s", 0, 10)
    assert stored[0] == b"first" and unlogged not in stored


def test_lane_coalesce_usec_is_set_and_checked_like_any_directive(server_factory: Any) -> None:
    server = server_factory()
    client = server.client()
    assert client.config_get("lane-coalesce-usec") == {"lane-coalesce-usec": "10"}
    assert client.config_set("lane-coalesce-usec", "0")
    assert client.config_get("lane-coalesce-usec") == {"lane-coalesce-usec": "0"}
    for bad in ("-1", "1001", "ten"):
        with pytest.raises(redis.exceptions.ResponseError, match="lane-coalesce-usec"):
            client.config_set("lane-coalesce-usec", bad)
    assert client.config_get("lane-coalesce-usec") == {"lane-coalesce-usec": "0"}
    # Served the same while it changes.
    assert client.execute_command("TWRITE", "k", "a") == 0
    assert client.config_set("lane-coalesce-usec", "1000")
    assert client.execute_command("TREAD", "k", 0, 1) == [b"a"]


def test_lease_reads_the_c_loop_served_are_replayed_after_a_kill(server_factory: Any) -> None:
    """With the AOF on, acknowledged reads the C loop's lane runs (a lease
    read with ACK, after a TWRITE dated the AOF) are logged so that the
    server starts again from its AOF and the group is where it was."""
    server = server_factory(appendonly="yes", appendfsync="always")
    client = server.client()
    client.execute_command("TWRITE", "s", "ENTRIES", *[f"m{i}" for i in range(10)])
    head = ["TREAD", "s", 0, 3, "GROUP", "g", "LEASE", 60_000, "CONSUMER", "c1"]
    reply = client.execute_command(*head)
    assert reply[1:] == [b"m0", b"m1", b"m2"]
    start, count = reply[0][2], reply[0][3]
    for _ in range(2):
        # A TWRITE between dates the AOF; the lease read after it is undated.
        client.execute_command("TWRITE", "s", "more")
        reply = client.execute_command(*head, "ACK", start, count)
        start, count = reply[0][2], reply[0][3]
        assert count == 3
    before = client.execute_command("TGROUP", "INFO", "s", "g")
    server.kill9()
    server.start()
    assert server.client().execute_command("TGROUP", "INFO", "s", "g") == before
