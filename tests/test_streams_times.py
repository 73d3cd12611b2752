"""Append times as a client sees them, against both servers (stream_server):
TREAD ... WITHTIMES (docs/PROTOCOL.md section 3, "WITHTIMES"), a time per
message rather than per node, TSEEK exact to the message (section 6), and
TCONCAT keeping each message's time (section 5). Restarts, replicas and
old files: test_persistence_times.py, test_module_append_times.py."""

from __future__ import annotations

import re
import struct
import time

import pytest
import redis
from conftest import Reader, ServerProcess, tr, tw, wait_blocked, wait_for


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def next_ms() -> int:
    """Wait until the wall clock reaches a millisecond no write so far got;
    return it."""
    start = wall_ms()
    wait_for(lambda: wall_ms() > start, 5)
    return wall_ms()


def pairs(reply: list) -> list[tuple[bytes | None, int | None]]:
    """A RESP2 WITHTIMES reply as (message, time) per offset."""
    assert len(reply) % 2 == 0
    return list(zip(reply[0::2], reply[1::2], strict=True))


def write_one_per_ms(client: redis.Redis, key: str, n: int) -> list[tuple[int, int, int]]:
    """n messages, each in a millisecond of its own: (offset, before, after)
    per message, the wall clock read around its write."""
    out = []
    for i in range(n):
        before = next_ms()
        offset = tw(client, key, f"m{i}")
        out.append((offset, before, wall_ms()))
    return out


def times_only(reply: bytes) -> bytes:
    return re.sub(rb":1\d{12}\r\n", b":T\r\n", reply)


def test_the_reply_is_flat_in_resp2_and_pairs_in_resp3(stream_server: ServerProcess) -> None:
    with stream_server.raw() as raw:
        raw.call("FLUSHALL")
        raw.call("TWRITE", "s", "ENTRIES", "a", "b", "cc")
        raw.call("TEVICT", "s", 0)
        assert times_only(raw.call("TREAD", "s", 0, 3, "WITHTIMES")) == (
            b"*6\r\n$-1\r\n$-1\r\n$1\r\nb\r\n:T\r\n$2\r\ncc\r\n:T\r\n"
        )
        assert times_only(raw.call("TREAD", "s", 1, 5, "WITHINFO", "withtimes")) == (
            b"*5\r\n*4\r\n:1\r\n:2\r\n:1\r\n:2\r\n$1\r\nb\r\n:T\r\n$2\r\ncc\r\n:T\r\n"
        )
        assert raw.call("TREAD", "s", 3, 5, "WITHTIMES") == b"*0\r\n"
        assert raw.call("TREAD", "nokey", 0, 5, "WITHTIMES") == b"*0\r\n"
        raw.call("HELLO", 3)
        assert times_only(raw.call("TREAD", "s", 0, 3, "WITHTIMES")) == (
            b"*3\r\n_\r\n*2\r\n$1\r\nb\r\n:T\r\n*2\r\n$2\r\ncc\r\n:T\r\n"
        )
        assert times_only(raw.call("TREAD", "s", 0, 2, "WITHTIMES", "WITHINFO")) == (
            b"*3\r\n*4\r\n:1\r\n:2\r\n:0\r\n:2\r\n_\r\n*2\r\n$1\r\nb\r\n:T\r\n"
        )


def test_redis_py_reads_messages_and_times(
    stream_client: redis.Redis, stream_client3: redis.Redis
) -> None:
    before = wall_ms()
    tw(stream_client, "s", "a", "b")
    after = wall_ms()
    flat = tr(stream_client, "s", 0, 10, "WITHTIMES")
    assert [m for m, _ in pairs(flat)] == [b"a", b"b"]
    t = flat[1]
    assert before <= t <= after and flat[3] == t  # one TWRITE, one time
    assert tr(stream_client3, "s", 0, 10, "WITHTIMES") == [[b"a", t], [b"b", t]]


def test_every_message_keeps_the_time_of_its_own_write(stream_client: redis.Redis) -> None:
    """Messages written one per millisecond into one macronode each get
    their own time, not their node's."""
    writes = write_one_per_ms(stream_client, "s", 40)
    got = pairs(tr(stream_client, "s", 0, 40, "WITHTIMES"))
    for (offset, before, after), (message, t) in zip(writes, got, strict=True):
        assert message == b"m%d" % offset
        assert before <= t <= after  # type: ignore[operator]
    times = [t for _, t in got]
    assert times == sorted(times) and len(set(times)) == 40


def test_tseek_is_exact_to_the_message(stream_client: redis.Redis) -> None:
    write_one_per_ms(stream_client, "s", 30)
    times = [t for _, t in pairs(tr(stream_client, "s", 0, 30, "WITHTIMES"))]
    for offset, t in enumerate(times):  # one per millisecond: all different
        assert stream_client.execute_command("TSEEK", "s", t) == offset
        assert stream_client.execute_command("TSEEK", "s", t + 1) == offset + 1


def test_evicted_offsets_have_no_time(
    stream_client: redis.Redis, stream_client3: redis.Redis
) -> None:
    tw(stream_client, "s", "a", "b", "c")
    stream_client.execute_command("TEVICT", "s", 1)
    reply = tr(stream_client, "s", 0, 3, "WITHTIMES")
    assert reply[:4] == [None, None, None, None] and reply[4] == b"c"
    reply = tr(stream_client3, "s", 0, 3, "WITHTIMES")
    assert reply[:2] == [None, None] and reply[2] == [b"c", reply[2][1]]


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_blocked_reader_gets_times_when_woken(
    stream_server: ServerProcess, stream_client: redis.Redis, protocol: int
) -> None:
    reader = Reader(
        stream_server, "TREAD", "s", 0, 5, "BLOCK", 5000, "WITHTIMES", protocol=protocol
    )
    reader.start()
    wait_blocked(stream_client, 1)
    before = wall_ms()
    tw(stream_client, "s", "woken")
    reply = reader.result()
    message, t = reply if protocol == 2 else reply[0]
    assert message == b"woken" and before <= t <= wall_ms()


def test_a_group_read_with_times_moves_the_group(
    stream_client: redis.Redis, stream_client3: redis.Redis
) -> None:
    tw(stream_client, "s", "a", "b", "c")
    reply = tr(stream_client, "s", 0, 2, "WITHTIMES", "GROUP", "g")
    assert reply[0::2] == [b"a", b"b"] and stream_client.get("g") == b"2"
    reply = tr(stream_client3, "s", 0, 5, "GROUP", "g", "WITHTIMES")
    assert [p[0] for p in reply] == [b"c"] and stream_client.get("g") == b"3"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (["WITHTIMES", "WITHTIMES"], "ERR syntax error, WITHTIMES given more than once"),
        (["WITHTIMES", "x"], "ERR syntax error, unknown option 'x'"),
        (["WITHTIME"], "ERR syntax error, unknown option 'WITHTIME'"),
    ],
)
def test_withtimes_errors(stream_client: redis.Redis, options: list[str], error: str) -> None:
    tw(stream_client, "s", "a")
    with pytest.raises(redis.ResponseError) as exc:
        tr(stream_client, "s", 0, 1, *options)
    assert str(exc.value) == error.removeprefix("ERR ")


def test_tconcat_keeps_each_messages_time(stream_client: redis.Redis) -> None:
    # An older destination: every message keeps its own time.
    stream_client.execute_command("TWRITE", "old", "first")
    stream_client.execute_command("TEVICT", "old", 0)
    writes = write_one_per_ms(stream_client, "src", 5)
    src = pairs(tr(stream_client, "src", 0, 5, "WITHTIMES"))
    assert stream_client.execute_command("TCONCAT", "old", "src") == 1
    assert pairs(tr(stream_client, "old", 1, 5, "WITHTIMES")) == src
    # A destination with a later message: times never go back within a
    # stream, so older ones are raised to its newest time.
    late = next_ms()
    tw(stream_client, "src2", *[b"x%d" % i for i in range(3)])
    next_ms()
    tw(stream_client, "new", "later")
    dst_time = tr(stream_client, "new", 0, 1, "WITHTIMES")[1]
    assert dst_time > late
    stream_client.execute_command("TCONCAT", "new", "src2")
    assert [t for _, t in pairs(tr(stream_client, "new", 0, 4, "WITHTIMES"))] == [dst_time] * 4
    assert [offset for offset, _, _ in writes] == [0, 1, 2, 3, 4]


# -- PACKED ------------------------------------------------------------------


def unpack(reply: list, withtimes: bool) -> list[tuple[bytes | None, int | None]]:
    """A PACKED reply's (lengths, messages[, times]) as (message, time) per
    offset (time None without WITHTIMES)."""
    lengths = struct.unpack(f"<{len(reply[0]) // 4}I", reply[0])
    times = struct.unpack(f"<{len(lengths)}q", reply[2]) if withtimes else (None,) * len(lengths)
    out, pos = [], 0
    for length, t in zip(lengths, times, strict=True):
        if length == 0xFFFFFFFF:
            assert t in (None, -1)
            out.append((None, None))
            continue
        out.append((reply[1][pos : pos + length], t))
        pos += length
    assert pos == len(reply[1])
    return out


def test_packed_replies_are_bulk_strings_in_both_protocols(
    stream_client: redis.Redis, stream_client3: redis.Redis, stream_server: ServerProcess
) -> None:
    tw(stream_client, "s", "a", "", "ccc", "\r\n$-1\r\n")
    stream_client.execute_command("TEVICT", "s", 0)
    expected_flat = tr(stream_client, "s", 0, 10, "WITHTIMES")
    times_by_offset = expected_flat[1::2]
    for client in (stream_client, stream_client3):
        reply = tr(client, "s", 0, 10, "PACKED", "WITHTIMES")
        assert len(reply) == 3
        assert unpack(reply, True) == [(None, None)] + [
            (m, t) for m, t in zip(expected_flat[2::2], times_by_offset[1:], strict=True)
        ]
        assert unpack(tr(client, "s", 1, 2, "PACKED"), False) == [(b"", None), (b"ccc", None)]
        info, *rest = tr(client, "s", -2, 10, "WITHINFO", "PACKED")
        assert info == [1, 3, 2, 2] and unpack(rest, False) == [
            (b"ccc", None),
            (b"\r\n$-1\r\n", None),
        ]
        assert tr(client, "s", 9, 5, "PACKED") == [b"", b""]  # nothing: empty bulks
        assert tr(client, "nokey", 0, 5, "PACKED", "WITHTIMES") == [b"", b"", b""]
    with stream_server.raw() as raw:
        raw.call("SELECT", 0)
        assert raw.call("TREAD", "s", 0, 2, "PACKED") == (
            b"*2\r\n$8\r\n\xff\xff\xff\xff\x00\x00\x00\x00\r\n$0\r\n\r\n"
        )
        raw.call("HELLO", 3)
        assert raw.call("TREAD", "s", 0, 2, "PACKED") == (
            b"*2\r\n$8\r\n\xff\xff\xff\xff\x00\x00\x00\x00\r\n$0\r\n\r\n"
        )


def test_packed_with_group_and_block(
    stream_server: ServerProcess, stream_client: redis.Redis
) -> None:
    tw(stream_client, "s", "a", "b")
    reply = tr(stream_client, "s", 0, 1, "GROUP", "g", "PACKED")
    assert unpack(reply, False) == [(b"a", None)] and stream_client.get("g") == b"1"
    reader = Reader(stream_server, "TREAD", "s", 2, 5, "PACKED", "BLOCK", 5000, "WITHTIMES")
    reader.start()
    wait_blocked(stream_client, 1)
    tw(stream_client, "s", "woken")
    ((message, t),) = unpack(reader.result(), True)
    assert message == b"woken" and t == tr(stream_client, "s", 2, 1, "WITHTIMES")[1]
    with pytest.raises(redis.ResponseError, match="PACKED given more than once"):
        tr(stream_client, "s", 0, 1, "PACKED", "packed")
