"""The storage core's append times (one per message) and retention
primitives through rcp11.storage, and loading dumps of the formats before
it: format 3 (every 64th time) and format 2 (before the time index)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from core_recipes import RECIPES, T0, unpack_blobs

from rcp11.storage import (
    FORMAT_VERSION,
    CorruptDataError,
    InvalidArgumentError,
    Stream,
    wall_ms,
)

DATA = Path(__file__).resolve().parent / "data"
V2_DUMPS = DATA / "macronode-v2"
V3_DUMPS = DATA / "macronode-v3"


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


def node_blob_fields(blob: bytes) -> tuple[int, int, int]:
    """(time width, count, first_ms) of a current-format node blob."""
    count = struct.unpack_from("<I", blob, 16)[0]
    return blob[7], count, struct.unpack_from("<q", blob, 28)[0]


def with_crc(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def test_every_message_keeps_its_own_time() -> None:
    # Uneven gaps inside each node: a time per message, not per node.
    times = [T0 + i * i // 3 for i in range(700)]
    s = Stream(max_entries=200)
    for i, t in enumerate(times):
        s.append([b"m%d" % i], now_ms=t)
    assert s.read_times(0, 700) == times
    s.evict_upto(250)
    assert s.read_times(240, 20) == [None] * 11 + times[251:260]
    assert s.oldest_append_ms == times[251]
    with pytest.raises(InvalidArgumentError):
        s.read_times(690, 11)


@pytest.mark.slow
def test_seek_is_exact_to_the_message() -> None:
    s = timed(500, max_entries=200)
    times = {i: 1_000 + 10 * i for i in range(500)}
    s.evict_upto(37)
    for t in range(900, 6_100, 3):
        assert s.seek_time(t) == exact_seek(s, times, t), t


def test_seek_exact_at_node_starts_and_edges() -> None:
    s = timed(300, max_entries=100)
    assert s.seek_time(0) == 0
    assert s.seek_time(1_000 + 10 * 100) == 100  # first message of node 2
    assert s.seek_time(1_000 + 10 * 200 - 5) == 200
    assert s.seek_time(1_000 + 10 * 150 - 9) == 150  # inside a node
    assert s.seek_time(10**15) == 300 == s.next_offset
    assert Stream().seek_time(123) == 0
    assert s.seek_time(-(2**70)) == 0 and s.seek_time(2**70) == 300  # clamped to int64


@pytest.mark.parametrize(
    ("gap", "width"), [(0, 0), (1, 1), (255, 1), (256, 2), (65_535, 2), (65_536, 4), (2**32, 8)]
)
def test_a_node_stores_deltas_as_narrow_as_its_times_allow(gap: int, width: int) -> None:
    """The widest delta of a node (its last message's) sets the bytes per
    message: 0 for one millisecond, up to 8 past 49.7 days."""
    s = Stream(max_entries=4)
    for k in range(4):  # one full node, its last message `gap` after its first
        s.append([b"x"], now_ms=T0 + gap * k // 3)
    s.append([b"next"], now_ms=T0 + gap + 1)
    expect = [T0 + gap * k // 3 for k in range(4)] + [T0 + gap + 1]
    assert s.read_times(0, 5) == expect
    header, full, _active = s.dump()
    assert node_blob_fields(full) == (width, 4, T0)
    assert len(full) == 40 + (4 + width) * 4 + 4
    copy = Stream.load([header, full, _active])
    assert copy.read_times(0, 5) == expect
    # In memory too: the sealed node's tables are 4 + width bytes per message.
    node = s.nodes()[0]
    one_message = Stream(max_entries=4)
    one_message.append([b"x" * 4], now_ms=T0)
    assert node.memory - one_message.nodes()[0].memory == 3 * 4 + 4 * width


def test_a_node_widens_as_its_times_spread_and_keeps_them() -> None:
    s = Stream(max_entries=1000)
    times = [T0] * 10 + [T0 + 100] * 10 + [T0 + 70_000] * 10 + [T0 + 2**33] * 10
    for t in times:
        s.append([b"y"], now_ms=t)
    assert s.num_nodes == 1 and s.read_times(0, 40) == times
    assert [s.seek_time(t) for t in (T0, T0 + 1, T0 + 100, T0 + 101, T0 + 2**33)] == [
        0,
        10,
        10,
        20,
        30,
    ]


def test_clock_is_monotonic_per_stream() -> None:
    s = Stream(max_entries=10)
    assert s.last_append_ms == 0 and s.oldest_append_ms is None
    s.append([b"a"], now_ms=5_000)
    s.append([b"b", b"c"], now_ms=4_000)  # the wall clock stepped back
    assert s.last_append_ms == 5_000
    assert [n.last_ms for n in s.nodes()] == [5_000]
    assert s.seek_time(5_000) == 0 and s.seek_time(5_001) == 3
    s.append_joined(b"dd", [1, 1], now_ms=6_000)
    assert s.last_append_ms == 6_000 and s.seek_time(5_001) == 3
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


def test_retention_by_age_whole_nodes_bounded_per_call_then_exact() -> None:
    s = timed(100, max_entries=10, step_ms=100)  # node k: 1000 + 1000k .. +900
    memory = s.memory_bytes
    first = s.evict_older_than(4_950, max_nodes=2)
    assert (first.nodes, first.messages, first.bytes, first.more) == (2, 20, 20, True)
    ev = s.evict_older_than(4_950)
    # node 3 ends at 4900 < 4950: gone; node 4 (5000..5900) has no expired message
    assert (ev.nodes, ev.messages, ev.more) == (2, 20, False)
    assert s.first_offset == 40 and s.length == 60
    assert s.oldest_append_ms == 5_000
    assert memory - s.memory_bytes == first.memory + ev.memory
    # Inside a node: exactly the messages older than the cutoff, the node
    # stays for its newer ones (its memory goes with its last message).
    ev = s.evict_older_than(5_350)
    assert (ev.nodes, ev.messages, ev.bytes, ev.memory, ev.more) == (0, 4, 4, 0, False)
    assert s.first_offset == 44 and s.oldest_append_ms == 5_400
    assert s.read(43, 2) == [None, b"4"]
    assert s.evict_older_than(5_400).messages == 0
    # Everything expired: the active node goes, offsets go on.
    ev = s.evict_older_than(10**13)
    assert ev.messages == 56 and s.length == 0 and s.num_nodes == 0
    assert s.next_offset == 100 and s.first_offset == 100
    assert s.append([b"x"], now_ms=0) == 100
    assert s.read(99, 2) == [None, b"x"]


def test_retention_never_drops_unexpired_messages() -> None:
    s = Stream(max_entries=10)
    s.append([b"old"] * 5, now_ms=1_000)
    s.append([b"new"], now_ms=9_000)
    ev = s.evict_older_than(5_000)
    assert ev.messages == 5 and s.length == 1  # the old ones only, from the active node
    assert s.read(0, 6) == [None] * 5 + [b"new"]
    assert s.evict_older_than(9_000).messages == 0


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


def test_a_time_per_message_costs_little_memory() -> None:
    """100-byte messages: 100 payload + 4 offset table + the node's share;
    the time deltas add nothing for a batch of one millisecond and 2 bytes
    at 1,000 messages per second (2% of the payload)."""
    batch = Stream()
    batch.append_joined(b"x" * 100 * 100_000, [100] * 100_000, now_ms=1)
    assert batch.memory_bytes / 100_000 < 104.3
    paced = Stream()
    for i in range(0, 100_000, 100):  # 100 messages per ms: a node spans 10 ms
        paced.append_joined(b"x" * 100 * 100, [100] * 100, now_ms=T0 + i // 100)
    assert paced.memory_bytes / 100_000 < 105.3
    slow = Stream()
    for i in range(20_000):  # one message per ms: a node spans a second
        slow.append([b"x" * 100], now_ms=T0 + i)
    assert slow.memory_bytes / 20_000 < 106.3


def test_format_2_and_3_fixtures_are_there() -> None:
    names = {p.stem for p in V2_DUMPS.glob("*.bin")}
    assert names == {"chunked", "empty_raised", "raw_with_gaps", "zlib_nodes"}
    assert {p.stem for p in V3_DUMPS.glob("*.bin")} == set(RECIPES)


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


def v3_time(times: dict[int, Any], node_first: int, node_count: int, i: int) -> int:
    """What format 3 kept for offset i of a node: the time of the next
    message of the node whose time it kept (every 64th, and the last)."""
    k = i - node_first
    kept = min(-(-k // 64) * 64, node_count - 1)
    return times[node_first + kept]


@pytest.mark.parametrize("name", sorted(p.stem for p in V3_DUMPS.glob("*.bin")))
def test_format_3_dumps_still_load(name: str) -> None:
    """Dumps of the format that kept every 64th time load with the same
    messages, nodes and clock; a message takes the time of the next one
    format 3 kept, so a seek among them is never late."""
    blobs = unpack_blobs((V3_DUMPS / f"{name}.bin").read_bytes())
    assert blobs[0][4] == 3 != FORMAT_VERSION
    old = Stream.load(blobs, now_ms=1)
    new = RECIPES[name]()
    start, stop = new.first_offset, new.next_offset
    assert (old.first_offset, old.next_offset, old.length, old.payload_bytes) == (
        start,
        stop,
        new.length,
        new.payload_bytes,
    )
    assert old.read(start, stop - start) == new.read(start, stop - start)
    assert old.last_append_ms == new.last_append_ms
    assert [(n.first, n.count, n.first_ms, n.last_ms) for n in old.nodes()] == [
        (n.first, n.count, n.first_ms, n.last_ms) for n in new.nodes()
    ]
    # The recipe rebuilt now has the exact times.
    exact = dict(zip(range(start, stop), new.read_times(start, stop - start), strict=True))
    loaded = dict(zip(range(start, stop), old.read_times(start, stop - start), strict=True))
    for node in new.nodes():
        for i in range(max(node.first, start), node.first + node.count):
            assert loaded[i] == v3_time(exact, node.first, node.count, i), i
            assert loaded[i] >= exact[i]  # type: ignore[operator]
    times = {i: t for i, t in exact.items() if t is not None}
    for t in sorted(set(times.values()) | {t + 1 for t in times.values()}):
        got, want = old.seek_time(t), exact_seek(new, times, t)
        assert got <= want and want - got < 64, t
    # Saved again, it is the current format, with the times it loaded.
    again = Stream.load(old.dump())
    assert next(iter(again.dump()))[4] == FORMAT_VERSION
    assert again.read_times(start, stop - start) == list(loaded.values())
    # New messages are exact.
    again.append([b"later"], now_ms=again.last_append_ms + 3)
    assert again.read_times(stop, 1) == [old.last_append_ms + 3]


def test_a_format_3_node_appends_whole() -> None:
    """An AOF rewritten before format 4 holds format-3 node blobs (the
    module's RCP11.NODE): they append with their times as a load gives them."""
    header, *nodes = unpack_blobs((V3_DUMPS / "timed.bin").read_bytes())
    s = Stream()
    for blob in nodes:
        s.append_node_blob(blob)
    loaded = Stream.load([header, *nodes])
    start = loaded.first_offset  # the dump's first node is partly evicted
    s.evict_upto(start - 1)
    assert s.read_times(0, s.next_offset) == loaded.read_times(0, loaded.next_offset)
    assert s.read_times(start, 1)[0] is not None


@pytest.mark.parametrize("older", [V2_DUMPS, V3_DUMPS])
def test_nodes_of_another_format_cannot_follow_a_header(older: Path) -> None:
    blobs = unpack_blobs((older / "raw_with_gaps.bin").read_bytes())
    current = list(RECIPES["raw_with_gaps"]().dump())
    with pytest.raises(CorruptDataError):
        Stream.load([current[0], *blobs[1:]])
    with pytest.raises(CorruptDataError):
        Stream.load([blobs[0], *current[1:]])


def test_node_blobs_with_bad_time_deltas_are_corrupt() -> None:
    s = Stream(max_entries=4)
    for t in (T0, T0 + 300, T0 + 301, T0 + 900):  # width 2
        s.append([b"z"], now_ms=t)
    s.append([b"tail"], now_ms=T0 + 901)
    header, node, tail = s.dump()
    assert node_blob_fields(node) == (2, 4, T0)
    deltas = 40 - 4 + 4 * 4  # after the frame and the offset table
    body = node[:-4]

    def deltas_as(values: list[int], width: int = 2) -> bytes:
        packed = b"".join(v.to_bytes(width, "little") for v in values)
        return with_crc(body[:7] + bytes([width]) + body[8:deltas] + packed + body[deltas + 8 :])

    assert Stream.load([header, deltas_as([0, 300, 301, 900]), tail]).read_times(0, 5) == [
        T0,
        T0 + 300,
        T0 + 301,
        T0 + 900,
        T0 + 901,
    ]
    bad = [
        deltas_as([0, 300, 301, 900], 4),  # wider than the deltas need: one encoding only
        deltas_as([0, 3, 4, 9]),  # narrower would do
        deltas_as([1, 300, 301, 900]),  # message 0 is first_ms itself
        deltas_as([0, 301, 300, 900]),  # times never decrease
        deltas_as([0, 300, 301, 902]),  # later than the next node's first time
        with_crc(body[:7] + b"\x03" + body[8:]),  # no such width
        with_crc(body[:7] + b"\x01" + body[8:]),  # the length is not what width 1 makes
        deltas_as([0, 300, 302, 900])[:-4] + node[-4:],  # the CRC of other deltas
    ]
    for blob in bad:
        with pytest.raises(CorruptDataError):
            Stream.load([header, blob, tail])
    # A last time past MN_TIME_MAX, the "no message" time's neighbour.
    late = with_crc(body[:28] + struct.pack("<q", 2**63 - 2) + body[36:])
    with pytest.raises(CorruptDataError):
        Stream(max_entries=4).append_node_blob(late)
