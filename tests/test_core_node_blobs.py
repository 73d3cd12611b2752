"""The storage core's node byte cap and whole-node appends through
rcp11.storage: what the Redis module uses to fill jemalloc's size classes
and to keep append times across an AOF rewrite."""

from __future__ import annotations

import random

import pytest

from rcp11.storage import CorruptDataError, InvalidArgumentError, Stream


def test_byte_cap_ends_nodes_before_the_cap() -> None:
    s = Stream(max_entries=1000)
    assert s.max_node_bytes == 0
    s.set_max_node_bytes(98_304)  # a jemalloc size class: 96 KiB
    for k in range(50):  # 100 ms apart: a node's time deltas take 2 bytes
        s.append([b"x" * 100] * 100, now_ms=1_000 + 100 * k)
    counts = [n.count for n in s.nodes()]
    assert counts[:-1] == [983] * 5 and sum(counts) == 5000
    # Sealed nodes hold their bytes and tables, nothing more; the active one
    # was sized ahead to the cap at most.
    sealed = s.nodes()[:-1]
    assert all(n.memory <= 98_300 + 983 * (4 + 2) + 300 for n in sealed)
    assert s.nodes()[-1].memory <= 98_304 + 1000 * (4 + 2) + 300
    # No cap: back to max_entries for the nodes filled from now on.
    s.set_max_node_bytes(0)
    s.append([b"y" * 100] * 2000)
    assert [n.count for n in s.nodes()][5:] == [1000, 1000, 85]  # the active node grew on


def test_byte_cap_keeps_a_larger_message_whole() -> None:
    s = Stream(max_entries=100)
    s.set_max_node_bytes(50)
    s.append([b"a" * 30, b"b" * 30, b"c" * 100, b"d" * 10, b"e" * 20])
    assert [n.count for n in s.nodes()] == [1, 1, 1, 2]
    assert s.read(0, 5) == [b"a" * 30, b"b" * 30, b"c" * 100, b"d" * 10, b"e" * 20]
    for bad in (-1, 2**32):
        with pytest.raises(InvalidArgumentError):
            s.set_max_node_bytes(bad)


def history() -> Stream:
    """Compressed and raw nodes, a gap, a partially evicted first node, an
    evicted tail, times 10 ms apart."""
    s = Stream(max_entries=10, compression_level=6)
    s.set_compression_depth(2)
    for i in range(60):
        s.append([b"event %d of a log that compresses well" % i], now_ms=1_000 + 10 * i)
    s.raise_next_offset(70)
    for i in range(60, 95):
        s.append([b"event %d of a log that compresses well" % i], now_ms=1_000 + 10 * i)
    s.evict_upto(13)
    s.raise_next_offset(s.next_offset + 4)
    while s.compress_step(10):
        pass
    return s


def rebuilt(s: Stream) -> Stream:
    """What the module's AOF rewrite does: the first node's offset, every
    node blob whole, the evicted prefix, the next offset."""
    blobs = list(s.dump())[1:]
    t = Stream(max_entries=s.max_entries, compression_level=s.compression_level)
    t.set_compression_depth(s.compression_depth)
    t.raise_next_offset(s.nodes()[0].first)
    for blob in blobs:
        t.append_node_blob(blob)
    t.evict_upto(s.first_offset - 1)
    t.raise_next_offset(s.next_offset)
    return t


def test_a_stream_rebuilt_node_by_node_is_the_same_stream() -> None:
    s = history()
    t = rebuilt(s)
    assert t.compress_pending  # the scan looks at every node once...
    while t.compress_step(10):
        pass
    assert list(t.dump())[1:] == list(s.dump())[1:]  # ...which were in form
    assert (t.first_offset, t.next_offset, len(t)) == (s.first_offset, s.next_offset, len(s))
    assert t.read(0, s.next_offset) == s.read(0, s.next_offset)
    assert [t.seek_time(ms) for ms in range(900, 2_100, 7)] == [
        s.seek_time(ms) for ms in range(900, 2_100, 7)
    ]
    assert t.num_compressed_nodes == s.num_compressed_nodes > 0
    # It takes appends as the original does.
    s.append([b"more"], now_ms=5_000)
    t.append([b"more"], now_ms=5_000)
    assert list(t.dump())[1:] == list(s.dump())[1:]


def test_whole_node_appends_refuse_overlaps_and_corruption() -> None:
    s = history()
    nodes, blobs = s.nodes(), list(s.dump())[1:]
    later = next(i for i, n in enumerate(nodes) if n.first >= 50)
    t = Stream(max_entries=10)
    t.append([b"late"], now_ms=9_000)
    t.raise_next_offset(50)
    with pytest.raises(InvalidArgumentError):
        t.append_node_blob(blobs[0])  # offsets 10.. are below the next offset
    broken = bytearray(blobs[later])
    broken[45] ^= 0xFF
    with pytest.raises(CorruptDataError):
        t.append_node_blob(bytes(broken))
    assert (t.next_offset, len(t), t.read(0, 1)) == (50, 1, [b"late"])
    # Times older than the stream's clock are raised to it.
    t.append_node_blob(blobs[later])
    node = t.nodes()[-1]
    assert node.first == nodes[later].first and node.first_ms == node.last_ms == 9_000
    assert t.next_offset == node.first + node.count
    assert t.read(node.first, node.count) == s.read(node.first, node.count)
    assert t.read(1, 49) == [None] * 49


def test_nodes_of_like_messages_are_sized_exactly_ahead() -> None:
    # Once a stream has shown that its nodes fill alike (messages of one
    # size), a new node takes exactly its full size: nothing is shrunk when
    # it fills, so no hole is left between nodes. (A 1.5% headroom used to
    # be given back at every seal.)
    # (One millisecond throughout: the time deltas' width, which the wall
    # clock would make vary, is test_core_time.py's.)
    s = Stream(max_entries=1000)
    for _ in range(45):
        s.append([b"x" * 100] * 100, now_ms=1_000)
    active = s.nodes()[-1]
    assert active.count == 500
    s.append([b"x" * 100] * 500, now_ms=1_000)
    filled = s.nodes()[-1]
    assert (filled.first, filled.count) == (active.first, 1000)
    assert filled.memory == active.memory


def test_nodes_of_mixed_messages_keep_a_headroom() -> None:
    # Messages of 50..150 bytes: successive nodes differ, so a new node is
    # sized a little past the last one's size and gives back what it did
    # not use when it fills.
    rng = random.Random(7)
    messages = [b"y" * rng.randint(50, 150) for _ in range(5000)]
    s = Stream(max_entries=1000)
    for i in range(0, 4500, 100):
        s.append(messages[i : i + 100], now_ms=1_000)
    active = s.nodes()[-1]
    s.append(messages[4500:], now_ms=1_000)
    filled = s.nodes()[-1]
    assert filled.count == 1000
    assert active.memory > filled.memory
