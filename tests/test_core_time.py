"""The storage core's time index and retention primitives through
rcp11.storage, and loading dumps of the format before the time index."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from core_recipes import RECIPES, unpack_blobs

from rcp11.storage import (
    FORMAT_VERSION,
    TIME_CHECKPOINT_EVERY,
    CorruptDataError,
    InvalidArgumentError,
    Stream,
    wall_ms,
)

V2_DUMPS = Path(__file__).resolve().parent / "data" / "macronode-v2"


def timed(n: int, max_entries: int = 100, step_ms: int = 10, start_ms: int = 1_000) -> Stream:
    """n one-byte messages, message i appended at start_ms + step_ms * i."""
    s = Stream(max_entries=max_entries)
    for i in range(n):
        s.append([b"%d" % (i % 10)], now_ms=start_ms + step_ms * i)
    return s


def shape(s: Stream) -> list[tuple[int, int, bool, int, int, int]]:
    """The nodes without their memory (an active node's slack is not saved)."""
    return [(n.first, n.count, n.compressed, n.zlevel, n.first_ms, n.last_ms) for n in s.nodes()]


def exact_seek(s: Stream, times: dict[int, int], t: int) -> int:
    """The first readable offset appended at or after t, else next_offset."""
    readable = [o for o in range(s.first_offset, s.next_offset) if s.read(o, 1)[0] is not None]
    return next((o for o in readable if times[o] >= t), s.next_offset)


@pytest.mark.slow
def test_seek_is_never_late_and_at_most_63_early() -> None:
    s = timed(500, max_entries=200)
    times = {i: 1_000 + 10 * i for i in range(500)}
    s.evict_upto(37)
    for t in range(900, 6_100, 3):
        exact = exact_seek(s, times, t)
        got = s.seek_time(t)
        assert got <= exact, t
        assert exact - got < TIME_CHECKPOINT_EVERY, t
        assert got == s.next_offset or s.read(got, 1)[0] is not None


def test_seek_exact_at_node_starts_and_edges() -> None:
    s = timed(300, max_entries=100)
    assert s.seek_time(0) == 0
    assert s.seek_time(1_000 + 10 * 100) == 100  # first message of node 2
    assert s.seek_time(1_000 + 10 * 200 - 5) == 200
    assert s.seek_time(10**15) == 300 == s.next_offset
    assert Stream().seek_time(123) == 0
    assert s.seek_time(-(2**70)) == 0 and s.seek_time(2**70) == 300  # clamped to int64


def test_clock_is_monotonic_per_stream() -> None:
    s = Stream(max_entries=10)
    assert s.last_append_ms == 0 and s.oldest_append_ms is None
    s.append([b"a"], now_ms=5_000)
    s.append([b"b", b"c"], now_ms=4_000)  # the wall clock stepped back
    assert s.last_append_ms == 5_000
    assert [n.last_ms for n in s.nodes()] == [5_000]
    assert s.seek_time(5_000) == 0 and s.seek_time(5_001) == 3
    s.append_joined(b"dd", [1, 1], now_ms=6_000)
    assert s.last_append_ms == 6_000 and s.seek_time(5_001) <= 3  # 63 early at most
    before = wall_ms()
    s.append([b"wall clock"])  # default: the wall clock, read by the core
    assert before <= s.last_append_ms <= wall_ms()
    s.append([b"negative"], now_ms=-5)  # MN_NOW too
    assert before <= s.last_append_ms <= wall_ms()
    s.append([b"huge"], now_ms=2**70)  # clamped to the latest time a message can have
    assert s.last_append_ms == 2**63 - 2


def test_times_survive_dump_and_load() -> None:
    s = timed(250, max_entries=64)
    s.evict_upto(70)
    copy = Stream.load(s.dump(), now_ms=1)
    assert shape(copy) == shape(s)
    assert copy.last_append_ms == s.last_append_ms
    assert [copy.seek_time(t) for t in range(900, 3_600, 7)] == [
        s.seek_time(t) for t in range(900, 3_600, 7)
    ]


def test_retention_by_age_whole_nodes_bounded_per_call() -> None:
    s = timed(100, max_entries=10, step_ms=100)  # node k: 1000 + 1000k .. +900
    memory = s.memory_bytes
    first = s.evict_older_than(4_950, max_nodes=2)
    assert (first.nodes, first.messages, first.bytes, first.more) == (2, 20, 20, True)
    ev = s.evict_older_than(4_950)
    # node 3 ends at 4900 < 4950: gone; node 4 (5000..5900) is whole
    assert (ev.nodes, ev.messages, ev.more) == (2, 20, False)
    assert s.first_offset == 40 and s.length == 60
    assert s.oldest_append_ms == 5_000
    assert memory - s.memory_bytes == first.memory + ev.memory
    # Everything expired: the active node goes, offsets go on.
    ev = s.evict_older_than(10**13)
    assert ev.messages == 60 and s.length == 0 and s.num_nodes == 0
    assert s.next_offset == 100 and s.first_offset == 100
    assert s.append([b"x"], now_ms=0) == 100
    assert s.read(99, 2) == [None, b"x"]


def test_retention_never_drops_unexpired_messages() -> None:
    s = Stream(max_entries=10)
    s.append([b"old"] * 5, now_ms=1_000)
    s.append([b"new"], now_ms=9_000)
    ev = s.evict_older_than(5_000)
    assert ev.messages == 0 and s.length == 6  # one node, its newest is fresh


def test_retention_by_size_keeps_the_active_node() -> None:
    s = timed(95, max_entries=10)  # 9 full nodes of 10 bytes + 5 in the active one
    ev = s.evict_over_bytes(40, max_nodes=3)
    assert ev.nodes == 3 and ev.more and s.payload_bytes == 65
    ev = s.evict_over_bytes(40)
    assert not ev.more and s.payload_bytes == 35 and ev.bytes == 30
    ev = s.evict_over_bytes(0)
    assert s.num_nodes == 1 and s.payload_bytes == 5 and s.first_offset == 90
    with pytest.raises(InvalidArgumentError):
        s.evict_over_bytes(-1)
    with pytest.raises(InvalidArgumentError):
        s.evict_older_than(0, max_nodes=-1)


def test_oldest_node_for_a_maxmemory_policy() -> None:
    s = timed(25, max_entries=10)
    memory = s.memory_bytes
    node_memory = s.oldest_node_memory
    assert node_memory == s.nodes()[0].memory
    ev = s.evict_oldest_node()
    assert ev.nodes == 1 and ev.messages == 10 and ev.memory == node_memory
    assert s.memory_bytes == memory - node_memory
    assert s.oldest_append_ms == 1_000 + 10 * 10
    s.evict_oldest_node()
    ev = s.evict_oldest_node()  # the active node too
    assert ev.messages == 5 and s.length == 0
    assert s.evict_oldest_node().nodes == 0 and s.oldest_node_memory == 0


def test_a_message_never_gets_the_time_that_means_no_message() -> None:
    # oldest_append_ms's "no message" is 2^63-1: a message appended at that
    # time (an AOF date or a replicated time may say it) counts one before,
    # or streams-oldest would take a stream holding it for an empty one.
    s = Stream(max_entries=4)
    s.append([b"a", b"b"], now_ms=2**63 - 1)
    assert s.oldest_append_ms == s.last_append_ms == 2**63 - 2
    assert s.seek_time(2**63 - 2) == 0
    assert s.evict_oldest_node().messages == 2 and s.oldest_append_ms is None


def _with_time(blob: bytes, at: int, ms: int) -> bytes:
    """blob with the 8 bytes at `at` set to ms and its CRC32 made right."""
    body = blob[:at] + struct.pack("<q", ms) + blob[at + 8 : -4]
    return body + struct.pack("<I", zlib.crc32(body))


def test_blobs_holding_the_time_that_means_no_message_are_corrupt() -> None:
    header, node = Stream.load(timed(3).dump()).dump()
    late = 2**63 - 1
    with pytest.raises(CorruptDataError):
        Stream.load([_with_time(header, 40, late), node])  # the stream's clock
    with pytest.raises(CorruptDataError):
        Stream.load([_with_time(header, 40, late), _with_time(node, 28, late)])
    live = Stream(max_entries=4)
    with pytest.raises(CorruptDataError):
        live.append_node_blob(_with_time(node, 28, late))  # a node's last time
    assert live.next_offset == 0 and live.oldest_append_ms is None


def test_time_index_costs_little_memory() -> None:
    s = Stream()
    s.append_joined(b"x" * 100 * 100_000, [100] * 100_000, now_ms=1)
    per_message = s.memory_bytes / 100_000
    assert per_message < 104.5  # 100 payload + 4 offset table + ~0.13 time index + node


def test_format_2_fixtures_are_there() -> None:
    names = {p.stem for p in V2_DUMPS.glob("*.bin")}
    assert names == {"chunked", "empty_raised", "raw_with_gaps", "zlib_nodes"}


@pytest.mark.parametrize("name", sorted(p.stem for p in V2_DUMPS.glob("*.bin")))
def test_format_2_dumps_still_load(name: str) -> None:
    """Dumps written before the time index load with the same messages; their
    times are unknown and count as the load time."""
    blobs = unpack_blobs((V2_DUMPS / f"{name}.bin").read_bytes())
    assert blobs[0][4] == 2 != FORMAT_VERSION
    old = Stream.load(blobs, now_ms=77_000)
    new = RECIPES[name]()
    assert old.next_offset == new.next_offset
    start = old.first_offset
    assert old.read(start, old.next_offset - start) == new.read(start, new.next_offset - start)
    assert (old.first_offset, old.length, old.payload_bytes) == (
        new.first_offset,
        new.length,
        new.payload_bytes,
    )
    assert old.num_compressed_nodes == new.num_compressed_nodes
    assert old.last_append_ms == 77_000
    assert all(n.first_ms == n.last_ms == 77_000 for n in old.nodes())
    assert old.seek_time(77_000) == old.first_offset
    assert old.seek_time(77_001) == old.next_offset
    assert old.evict_older_than(77_000).messages == 0
    # Saved again, it is the current format and keeps the load time.
    again = Stream.load(old.dump(), now_ms=1)
    assert next(iter(again.dump()))[4] == FORMAT_VERSION
    assert shape(again) == shape(old)
    # Appends go on from there, never earlier.
    if again.next_offset <= 2**62:
        again.append([b"later"], now_ms=5)
        assert again.last_append_ms == 77_000


def test_format_2_nodes_cannot_follow_a_format_3_header() -> None:
    blobs = unpack_blobs((V2_DUMPS / "raw_with_gaps.bin").read_bytes())
    current = list(RECIPES["raw_with_gaps"]().dump())
    from rcp11.storage import CorruptDataError

    with pytest.raises(CorruptDataError):
        Stream.load([current[0], *blobs[1:]])
    with pytest.raises(CorruptDataError):
        Stream.load([blobs[0], *current[1:]])
