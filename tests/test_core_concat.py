"""Stream.concat (mn_stream_concat, the core of TCONCAT) through rcp11.storage."""

from __future__ import annotations

import pytest
from core_recipes import json_line, msg

from rcp11.storage import (
    MAX_OFFSET,
    InvalidArgumentError,
    OffsetOverflowError,
    Stream,
)


def readable(s: Stream) -> list[bytes]:
    out = s.read(s.first_offset, s.next_offset - s.first_offset) if s.length else []
    return [m for m in out if m is not None]


def test_concat_appends_readable_messages_at_contiguous_offsets() -> None:
    dst = Stream(max_entries=10)
    dst.append([msg(i) for i in range(25)], now_ms=100)
    dst.evict_upto(4)
    src = Stream(max_entries=10)
    src.append([msg(i) for i in range(100, 140)], now_ms=50)
    src.raise_next_offset(60)  # a gap
    src.append([msg(i) for i in range(140, 170)], now_ms=60)
    src.evict_upto(12)  # the first node partially evicted
    expected = readable(dst) + readable(src)
    src_next, count = src.next_offset, src.length
    assert dst.concat(src) == 25
    assert dst.next_offset == 25 + count and dst.first_offset == 5
    assert readable(dst) == expected
    assert dst.read(24, 2)[1] == msg(113)  # contiguous: no gap, no evicted offsets
    assert (src.length, src.num_nodes, src.payload_bytes) == (0, 0, 0)
    assert src.next_offset == src.first_offset == src_next
    assert src.append([b"again"]) == src_next
    # Times of the moved messages were raised to dst's clock (100).
    assert all(n.first_ms >= 100 for n in dst.nodes()[2:])
    assert dst.last_append_ms == 100


@pytest.mark.parametrize("dst_clock", [0, 2_950, 9_000])
def test_every_message_keeps_its_time_raised_to_the_destination_clock(dst_clock: int) -> None:
    """Copied messages (a partly evicted first node, or a source that fits
    the active node) and moved nodes alike keep their own time, raised to
    the destination's clock where older: the clock never goes back."""
    for small in (False, True):
        dst = Stream(max_entries=10)
        dst.append([b"d"], now_ms=dst_clock)
        src = Stream(max_entries=10)
        count = 6 if small else 45
        times = [1_000 + 50 * i + (i % 3) for i in range(count)]
        for i, t in enumerate(times):
            src.append([msg(i)], now_ms=t)
        if not small:
            src.evict_upto(3)  # copied: the rest of the first node
        keep = times[src.first_offset :]
        assert dst.concat(src) == 1
        raised = [max(t, dst_clock) for t in keep]
        assert dst.read_times(1, len(keep)) == raised
        assert dst.last_append_ms == max(raised[-1], dst_clock)
        every = [dst_clock, *raised]
        for t in sorted(set(every)):
            assert dst.seek_time(t) == every.index(t)
        assert Stream.load(dst.dump()).read_times(0, dst.next_offset) == every


def test_sealed_nodes_move_whole_and_keep_their_compression() -> None:
    src = Stream(max_entries=50, compression_level=6)
    for start in range(0, 500, 50):
        src.append([json_line(i) for i in range(start, start + 50)], now_ms=1_000 + start)
    dst = Stream(max_entries=50)  # does not compress
    dst.append([b"first"], now_ms=0)
    moved = [(n.count, n.compressed, n.memory, n.first_ms, n.last_ms) for n in src.nodes()]
    compressed = src.num_compressed_nodes
    assert compressed == 9
    assert dst.concat(src) == 1
    nodes = dst.nodes()
    assert [(n.count, n.compressed, n.memory, n.first_ms, n.last_ms) for n in nodes[1:]] == moved
    assert [n.first for n in nodes] == [0] + [1 + 50 * k for k in range(10)]
    assert dst.num_compressed_nodes == compressed
    # the nodes' memory moved with them: src keeps its struct and head only
    assert src.memory_bytes < 200
    assert readable(dst)[1:] == [json_line(i) for i in range(500)]


def test_small_sources_fill_the_active_node() -> None:
    dst = Stream(max_entries=100)
    for k in range(10):
        src = Stream(max_entries=100)
        src.append([msg(i) for i in range(7 * k, 7 * k + 7)])
        dst.concat(src)
    assert dst.num_nodes == 1 and dst.length == 70
    assert readable(dst) == [msg(i) for i in range(70)]


def test_concat_errors_change_nothing() -> None:
    s = Stream()
    s.append([b"a"])
    with pytest.raises(InvalidArgumentError):
        s.concat(s)
    dst = Stream()
    dst.raise_next_offset(MAX_OFFSET)  # room for one message
    src = Stream()
    src.append([b"x", b"y"])
    with pytest.raises(OffsetOverflowError):
        dst.concat(src)
    assert src.length == 2 and dst.length == 0 and dst.next_offset == MAX_OFFSET
    src.evict_upto(0)
    assert dst.concat(src) == MAX_OFFSET
    assert dst.next_offset == MAX_OFFSET + 1 and dst.read(MAX_OFFSET, 1) == [b"y"]


def test_concat_of_an_empty_source_replies_next_offset() -> None:
    dst = Stream()
    dst.append([b"a", b"b"])
    assert dst.concat(Stream()) == 2 and dst.next_offset == 2


def test_concatenated_stream_survives_dump_and_load() -> None:
    dst = Stream(max_entries=8, compression_level=1)
    dst.append([msg(i) for i in range(20)], now_ms=10)
    src = Stream(max_entries=5, compression_level=9)
    src.append([json_line(i) for i in range(33)], now_ms=5)
    src.evict_upto(2)
    dst.concat(src)
    copy = Stream.load(dst.dump())
    assert readable(copy) == readable(dst)
    assert [n.last_ms for n in copy.nodes()] == [n.last_ms for n in dst.nodes()]
