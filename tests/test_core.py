"""The C storage core through rcp11.storage: offsets, nodes, eviction, gaps,
compression, RESP output, serialization and blob validation."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rcp11.storage import (
    MAX_MESSAGE_BYTES,
    MAX_OFFSET,
    CorruptDataError,
    InvalidArgumentError,
    MessageTooBigError,
    OffsetOverflowError,
    StorageMemoryError,
    Stream,
    validate_node_blob,
)


def msg(i: int) -> bytes:
    """A distinct message per offset, of varying length (0..40 bytes)."""
    return (b"m%d-" % i + b"x" * (i % 37))[: i % 41]


def resp_of(messages: list[bytes | None], resp3: bool = False) -> bytes:
    null = b"_\r\n" if resp3 else b"$-1\r\n"
    return b"".join(null if m is None else b"$%d\r\n%s\r\n" % (len(m), m) for m in messages)


def filled(n: int, max_entries: int = 1000, level: int = 0, batch: int = 257) -> Stream:
    s = Stream(max_entries=max_entries, compression_level=level)
    for start in range(0, n, batch):
        s.append([msg(i) for i in range(start, min(n, start + batch))])
    return s


def assert_reads(s: Stream, expected: list[bytes | None]) -> None:
    """Every way of reading the stream agrees with the expected offsets."""
    assert s.next_offset == len(expected)
    assert s.read(0, len(expected)) == expected
    assert s.read_resp(0, len(expected), False) == resp_of(expected)
    assert s.read_resp(0, len(expected), True) == resp_of(expected, True)
    readable = [m for m in expected if m is not None]
    assert s.length == len(readable) == len(s)
    assert s.payload_bytes == sum(map(len, readable))
    first = next((i for i, m in enumerate(expected) if m is not None), len(expected))
    assert s.first_offset == first
    assert s.last_offset == len(expected) - 1


# -- sizes and node boundaries ---------------------------------------------


def test_empty_stream() -> None:
    s = Stream()
    assert (s.next_offset, s.first_offset, s.last_offset, s.length) == (0, 0, -1, 0)
    assert s.num_nodes == 0 and s.payload_bytes == 0
    assert s.read(0, 0) == [] and s.read_resp(0, 0, False) == b""
    assert s.memory_bytes > 0


@pytest.mark.parametrize("n", [1, 999, 1000, 1001, 2500])
def test_sizes_around_node_boundary(n: int) -> None:
    s = filled(n)
    assert_reads(s, [msg(i) for i in range(n)])
    assert s.num_nodes == -(-n // 1000)


@pytest.mark.slow
def test_one_million_messages() -> None:
    n = 1_000_000
    payload = b"".join(b"%07d" % i for i in range(n))
    s = Stream()
    assert s.append_joined(payload, np.full(n, 7, dtype=np.uint32)) == 0
    assert s.length == n and s.num_nodes == 1000 and s.payload_bytes == 7 * n
    rng = random.Random(1)
    for _ in range(200):
        start = rng.randrange(n)
        count = rng.randrange(0, min(120, n - start) + 1)
        assert s.read(start, count) == [b"%07d" % i for i in range(start, start + count)]
    assert s.read(n - 1, 1) == [b"%07d" % (n - 1)]
    assert s.evict_upto(n // 2 - 1) == n // 2
    assert s.num_nodes == 500 and s.first_offset == n // 2


def test_single_appends_match_batches() -> None:
    one_by_one = Stream(max_entries=7)
    for i in range(100):
        assert one_by_one.append([msg(i)]) == i
    batched = filled(100, max_entries=7, batch=13)
    assert one_by_one.read(0, 100) == batched.read(0, 100)
    assert one_by_one.num_nodes == batched.num_nodes == 15


def test_batch_spans_many_nodes_and_reports_first_offset() -> None:
    s = Stream(max_entries=10)
    assert s.append([msg(i) for i in range(5)]) == 0
    assert s.append([msg(i) for i in range(5, 47)]) == 5
    assert s.num_nodes == 5
    assert_reads(s, [msg(i) for i in range(47)])


def test_append_joined_takes_lists_and_arrays() -> None:
    s = Stream(max_entries=3)
    assert s.append_joined(b"abcdef", [1, 2, 3]) == 0
    assert s.append_joined(b"ghij", np.array([0, 4], dtype=np.uint32)) == 3
    assert s.read(0, 5) == [b"a", b"bc", b"def", b"", b"ghij"]
    with pytest.raises(ValueError):
        s.append_joined(b"abc", [1, 1])
    with pytest.raises(ValueError):
        s.append_joined(b"", [])
    assert s.next_offset == 5


def test_empty_and_binary_messages() -> None:
    s = Stream(max_entries=2)
    data = [b"", b"\x00\r\n$-1\r\n", bytes(range(256)), b""]
    s.append(data)
    assert_reads(s, data)


def test_append_nothing_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError):
        Stream().append([])


class ClaimsLength(bytes):
    """A message that reports a length it does not have, to reach the size
    limits without allocating 4 GB."""

    claimed = 0

    def __len__(self) -> int:
        return self.claimed


@pytest.mark.parametrize("claimed", [MAX_MESSAGE_BYTES + 1, 2**32, 2**40])
def test_too_big_message_in_a_batch_appends_nothing(claimed: int) -> None:
    s = filled(5)
    before = list(s.dump())
    huge = ClaimsLength(b"x")
    huge.claimed = claimed
    with pytest.raises(MessageTooBigError):
        s.append([b"ok", huge, b"ok"])
    assert list(s.dump()) == before
    assert s.next_offset == 5
    assert s.append([b"after", b"it"]) == 5


def test_read_resp_writes_a_prefix_before_the_messages() -> None:
    s = filled(10)
    s.evict_upto(2)
    expected = [None] * 3 + [msg(i) for i in range(3, 10)]
    assert s.read_resp(0, 10, False, b"*10\r\n") == b"*10\r\n" + resp_of(expected)
    assert s.read_resp(1, 4, True, b"*4\r\n") == b"*4\r\n" + resp_of(expected[1:5], True)
    assert s.read_resp(10, 0, False, b"*0\r\n") == b"*0\r\n"
    with pytest.raises(InvalidArgumentError):
        s.read_resp(5, 6, False, b"*6\r\n")


def test_bad_construction_arguments() -> None:
    for kwargs in ({"max_entries": 0}, {"max_entries": 1_000_001}, {"compression_level": 10}):
        with pytest.raises(InvalidArgumentError):
            Stream(**kwargs)
    with pytest.raises(InvalidArgumentError):
        Stream().set_compression(-1)


def test_read_range_outside_stream_is_refused() -> None:
    s = filled(10)
    for start, count in ((-1, 1), (0, 11), (10, 1), (5, -1)):
        with pytest.raises(InvalidArgumentError):
            s.read(start, count)
        with pytest.raises(InvalidArgumentError):
            s.read_resp(start, count, False)
    assert s.read(10, 0) == []


# -- eviction ----------------------------------------------------------------


def evicted_model(n: int, upto: int) -> list[bytes | None]:
    return [None if i <= upto else msg(i) for i in range(n)]


@pytest.mark.parametrize(
    "upto, freed_nodes",
    [
        (-1, 0),  # nothing
        (4, 0),  # inside the first node
        (9, 1),  # exactly the first node
        (10, 1),  # first message of the second node
        (57, 5),  # across many nodes
        (99, 10),  # exactly everything
        (10_000, 10),  # past the end
    ],
)
def test_evict_upto_shapes(upto: int, freed_nodes: int) -> None:
    s = filled(100, max_entries=10)
    before = s.memory_bytes
    if upto < 0:
        assert s.evict_keep(100) == 0
    else:
        assert s.evict_upto(upto) == min(upto + 1, 100)
    assert_reads(s, evicted_model(100, upto))
    assert s.num_nodes == 10 - freed_nodes
    if freed_nodes:
        assert s.memory_bytes < before
    else:
        assert s.memory_bytes == before


def test_evict_again_counts_only_newly_evicted() -> None:
    s = filled(50, max_entries=10)
    assert s.evict_upto(14) == 15
    assert s.evict_upto(14) == 0
    assert s.evict_upto(9) == 0
    assert s.evict_upto(24) == 10
    assert_reads(s, evicted_model(50, 24))


@pytest.mark.parametrize("keep", [0, 1, 10, 37, 100, 101, 10**30])
def test_evict_keep(keep: int) -> None:
    s = filled(100, max_entries=10)
    assert s.evict_keep(keep) == max(0, 100 - keep)
    assert_reads(s, evicted_model(100, 99 - keep))


def test_evict_on_empty_and_never_written_streams() -> None:
    s = Stream()
    assert s.evict_upto(5) == 0 and s.evict_keep(0) == 0
    assert (s.next_offset, s.first_offset, s.num_nodes) == (0, 0, 0)
    s.append([b"a"])
    assert s.read(0, 1) == [b"a"]


def test_evict_everything_keeps_next_offset_and_frees_memory() -> None:
    s = filled(35, max_entries=10)
    empty_cost = Stream().memory_bytes
    assert s.evict_upto(1000) == 35
    assert (s.first_offset, s.next_offset, s.length, s.num_nodes) == (35, 35, 0, 0)
    assert s.memory_bytes - empty_cost < 8 * 32  # at most the head's pointer array
    assert s.append([b"again"]) == 35
    assert_reads(s, [None] * 35 + [b"again"])
    assert s.num_nodes == 1


def test_append_after_partial_eviction() -> None:
    s = filled(25, max_entries=10)
    s.evict_upto(22)
    s.append([msg(i) for i in range(25, 40)])
    assert_reads(s, evicted_model(40, 22))
    assert s.num_nodes == 2


def test_negative_evict_arguments() -> None:
    with pytest.raises(InvalidArgumentError):
        Stream().evict_upto(-1)
    with pytest.raises(InvalidArgumentError):
        Stream().evict_keep(-1)


# -- gaps and the offset limit -------------------------------------------------


def test_raise_next_offset_on_empty_stream() -> None:
    s = Stream()
    s.raise_next_offset(100)
    assert (s.first_offset, s.next_offset, s.length) == (100, 100, 0)
    assert s.append([b"a", b"b"]) == 100
    assert s.first_offset == 100
    assert_reads(s, [None] * 100 + [b"a", b"b"])


def test_gaps_read_as_null_and_start_new_nodes() -> None:
    s = Stream(max_entries=10)
    s.append([msg(i) for i in range(5)])
    s.raise_next_offset(8)
    s.append([msg(i) for i in range(8, 12)])
    s.raise_next_offset(30)
    s.raise_next_offset(30)
    s.append([msg(30)])
    expected: list[bytes | None] = [None] * 31
    for i in [*range(5), *range(8, 12), 30]:
        expected[i] = msg(i)
    assert_reads(s, expected)
    assert s.num_nodes == 3
    # Reads that start or end inside a gap.
    assert s.read(6, 3) == [None, None, msg(8)]
    assert s.read(12, 18) == [None] * 18
    # Evicting into a gap makes the next node's first message the first offset.
    assert s.evict_upto(6) == 5
    assert s.first_offset == 8 and s.num_nodes == 2
    assert s.evict_upto(20) == 4
    assert s.first_offset == 30 and s.num_nodes == 1


def test_raise_next_offset_refuses_going_back() -> None:
    s = filled(10)
    with pytest.raises(InvalidArgumentError):
        s.raise_next_offset(9)
    with pytest.raises(InvalidArgumentError):
        s.raise_next_offset(MAX_OFFSET + 2)
    assert s.next_offset == 10


def test_offset_overflow_at_two_to_the_63() -> None:
    s = Stream(max_entries=4)
    s.raise_next_offset(MAX_OFFSET - 2)
    assert s.append([b"a", b"b"]) == MAX_OFFSET - 2
    with pytest.raises(OffsetOverflowError):
        s.append([b"c", b"d"])
    assert s.next_offset == MAX_OFFSET  # nothing written by the failed batch
    assert s.append([b"c"]) == MAX_OFFSET  # the last offset there is
    assert s.next_offset == MAX_OFFSET + 1
    with pytest.raises(OffsetOverflowError):
        s.append([b"e"])
    assert s.read(MAX_OFFSET - 2, 3) == [b"a", b"b", b"c"]
    assert s.evict_keep(1) == 2
    assert s.read(MAX_OFFSET - 1, 2) == [None, b"c"]
    assert s.evict_upto(MAX_OFFSET) == 1
    assert s.length == 0 and s.first_offset == MAX_OFFSET + 1
    copy = Stream.load(s.dump())
    assert copy.next_offset == MAX_OFFSET + 1


@pytest.mark.parametrize("times", [False, True])
@pytest.mark.parametrize("resp3", [False, True])
@pytest.mark.parametrize("count", [-(-(2**64) // 5), -(-(2**64) // 10), 2**63])
def test_a_read_of_more_nulls_than_memory_holds_is_refused(
    count: int, resp3: bool, times: bool
) -> None:
    """A stream whose next offset is 2^63 (a snapshot may say so) reads as
    null from 0: the reply's size for ~2^62 nulls wrapped around 2^64, and
    the core wrote them into a buffer of a few bytes."""
    s = Stream()
    s.raise_next_offset(MAX_OFFSET + 1)
    with pytest.raises((MessageTooBigError, StorageMemoryError)):
        s.read_resp(0, count, resp3, b"*", times)
    assert s.read_resp(0, 3, resp3, b"", times).count(b"\r\n") == (
        3 if resp3 else 6 if times else 3
    )


# -- memory --------------------------------------------------------------------


def test_full_nodes_cost_at_most_104_5_bytes_per_100_byte_message() -> None:
    n = 100_000
    s = Stream()
    s.append_joined(bytes(100 * n), np.full(n, 100, dtype=np.uint32))
    assert s.memory_bytes / n <= 104.5


def test_tiny_streams_stay_tiny() -> None:
    s = Stream()
    s.append([bytes(100)])
    one = s.memory_bytes
    assert one < 100 + 300
    for _ in range(9):
        s.append([bytes(100)])
    # The active node grows its blob by half at a time.
    assert s.memory_bytes < 1.5 * 10 * 100 + 400


def test_memory_is_given_back_per_node() -> None:
    s = filled(1000, max_entries=100)
    per_node = s.memory_bytes / 10
    before = s.memory_bytes
    s.evict_upto(499)
    assert s.memory_bytes < before - 4 * per_node


# -- compression ---------------------------------------------------------------


def log_lines(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    levels = ["info", "warn", "error", "debug"]
    return [
        b'{"ts":%d,"level":"%s","user":%d,"path":"/api/v1/items/%d","ms":%d}'
        % (
            1700000000000 + i * 17,
            levels[rng.randrange(4)].encode(),
            rng.randrange(5000),
            rng.randrange(100000),
            rng.randrange(900),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("level", [1, 6, 9])
def test_compression_keeps_reads_identical(level: int) -> None:
    lines = log_lines(5000)
    plain = Stream(max_entries=100)
    packed = Stream(max_entries=100, compression_level=level)
    for i in range(0, 5000, 333):
        plain.append(lines[i : i + 333])
        packed.append(lines[i : i + 333])
    assert packed.num_compressed_nodes == packed.num_nodes - 1  # never the active node
    assert plain.num_compressed_nodes == 0
    assert packed.memory_bytes < plain.memory_bytes / 2
    assert packed.read(0, 5000) == lines
    for start in (0, 99, 100, 2550, 4990):
        assert packed.read_resp(start, 10, False) == plain.read_resp(start, 10, False)
    assert packed.evict_upto(2549) == 2550
    assert packed.read(2540, 20) == [None] * 10 + lines[2550:2560]


def test_reads_across_compressed_chunk_boundaries() -> None:
    # 1000 lines of ~100 bytes make a node of several 16 KB zlib chunks.
    lines = log_lines(3000, seed=11)
    plain = Stream()
    packed = Stream(compression_level=6)
    plain.append(lines)
    packed.append(lines)
    assert packed.num_compressed_nodes == 2
    for start in range(0, 2100, 7):
        assert packed.read_resp(start, 90, True) == plain.read_resp(start, 90, True)
    assert packed.read(0, 3000) == lines
    copy = Stream.load(packed.dump())
    assert copy.read(0, 3000) == lines


def test_incompressible_nodes_stay_raw() -> None:
    rng = random.Random(3)
    s = Stream(max_entries=10, compression_level=9)
    data = [rng.randbytes(200) for _ in range(100)]
    s.append(data)
    assert s.num_compressed_nodes == 0
    assert s.read(0, 100) == data


def test_set_compression_applies_to_existing_nodes_gradually() -> None:
    lines = log_lines(300)
    s = Stream(max_entries=100)
    s.append(lines[:150])
    s.set_compression(6)
    assert s.compression_level == 6 and s.compress_pending
    s.append(lines[150:])
    # Node 1 was compressed when it was sealed; node 0, sealed while
    # compression was off, waits for the scan; node 2 is active.
    assert s.num_nodes == 3 and s.num_compressed_nodes == 1
    assert s.compress_step(10) is False
    assert s.num_compressed_nodes == 2 and not s.compress_pending
    assert s.read(0, 300) == lines
    s.set_compression(0)  # back to raw, one node per step
    assert s.compress_step(1) is True and s.num_compressed_nodes == 1
    assert s.compress_step(1) is False and s.num_compressed_nodes == 0
    assert s.read(0, 300) == lines


def test_set_max_entries_applies_to_nodes_filled_later() -> None:
    messages = [b"m%d" % i for i in range(100)]
    s = Stream(max_entries=40)
    s.append(messages[:50])  # nodes of 40 and 10
    s.set_max_entries(5)
    assert s.max_entries == 5
    s.append(messages[50:60])  # the 10-message node stays as it is: 2 new nodes
    assert s.num_nodes == 4
    # A node holding more than the current max still round-trips.
    s = roundtrip(s)
    assert s.max_entries == 5
    s.set_max_entries(20)
    s.append(messages[60:])  # the last node (5) grows to 20, then 20 more
    assert s.num_nodes == 6
    assert s.read(0, 100) == messages
    with pytest.raises(InvalidArgumentError):
        s.set_max_entries(0)


def test_decompression_cache_is_counted_and_freed() -> None:
    lines = log_lines(1000)
    s = Stream(max_entries=100, compression_level=6)
    s.append(lines)
    before = s.memory_bytes
    s.read(0, 1)
    assert s.memory_bytes > before  # an inflated node is cached
    s.evict_upto(99)  # frees that node and its cache entry
    s.read(100, 1)
    assert s.read(150, 10) == lines[150:160]


# -- serialization ---------------------------------------------------------------


def roundtrip(s: Stream) -> Stream:
    blobs = list(s.dump())
    assert len(blobs) == 1 + s.num_nodes
    copy = Stream.load(blobs)
    for name in (
        "next_offset",
        "first_offset",
        "length",
        "num_nodes",
        "num_compressed_nodes",
        "payload_bytes",
        "max_entries",
        "compression_level",
    ):
        assert getattr(copy, name) == getattr(s, name), name
    assert copy.read(0, s.next_offset) == s.read(0, s.next_offset)
    assert list(copy.dump()) == blobs
    return copy


def test_roundtrip_empty_and_fresh() -> None:
    roundtrip(Stream())
    s = Stream(max_entries=5, compression_level=3)
    s.raise_next_offset(77)
    copy = roundtrip(s)
    assert copy.append([b"x"]) == 77


def test_roundtrip_evictions_gaps_and_compression() -> None:
    lines = log_lines(1000)
    s = Stream(max_entries=50, compression_level=5)
    s.append(lines[:420])
    s.raise_next_offset(500)
    s.append(lines[420:])
    s.evict_upto(123)
    assert s.num_compressed_nodes > 0
    copy = roundtrip(s)
    # The copy keeps working as the original does.
    for stream in (s, copy):
        stream.append([b"tail"] * 60)
        stream.evict_keep(100)
    assert copy.read(0, copy.next_offset) == s.read(0, s.next_offset)


def test_roundtrip_after_evicting_everything() -> None:
    s = filled(30, max_entries=10)
    s.evict_keep(0)
    copy = roundtrip(s)
    assert copy.first_offset == copy.next_offset == 30


def test_dump_refuses_a_stream_changing_underneath() -> None:
    s = filled(30, max_entries=10)
    it = s.dump()
    next(it)
    next(it)
    s.evict_upto(25)
    with pytest.raises(RuntimeError):
        list(it)


def small_node_blobs() -> list[bytes]:
    raw = Stream(max_entries=3)
    raw.append([b"ab", b"", b"cde", b"f"])
    packed = Stream(max_entries=40, compression_level=9)
    packed.append([b"hello hello hello hello %d" % (i % 3) for i in range(41)])
    # 20 KB messages: the sealed node holds one zlib chunk per message.
    chunked = Stream(max_entries=5, compression_level=1)
    chunked.append([bytes([65 + i]) * 20_000 for i in range(6)])
    blobs = list(raw.dump())[1:2] + list(packed.dump())[1:2] + list(chunked.dump())[1:2]
    assert packed.num_compressed_nodes == chunked.num_compressed_nodes == 1
    return blobs


def test_validator_accepts_good_blobs() -> None:
    for blob in small_node_blobs():
        assert validate_node_blob(blob)


def test_validator_rejects_every_flipped_byte_and_truncation() -> None:
    for blob in small_node_blobs():
        for pos in range(len(blob)):
            for mask in (0x01, 0x80, 0xFF):
                bad = bytearray(blob)
                bad[pos] ^= mask
                assert not validate_node_blob(bytes(bad)), (pos, mask)
        for cut in range(len(blob)):
            assert not validate_node_blob(blob[:cut])
        assert not validate_node_blob(blob + b"\0")


def test_load_rejects_corrupt_or_inconsistent_blobs() -> None:
    s = Stream(max_entries=10)
    s.append([msg(i) for i in range(25)])
    s.evict_upto(12)
    header, *nodes = s.dump()
    assert Stream.load([header, *nodes]).read(0, 25) == s.read(0, 25)
    bad_header = bytearray(header)
    bad_header[9] ^= 1
    cases = [
        [],  # no header
        [bytes(bad_header), *nodes],
        [header[:-1], *nodes],
        [header, *nodes[:-1]],  # a node missing
        [header, nodes[1], nodes[0]],  # out of order
        [header, nodes[0], nodes[0]],  # overlapping
        [header, *nodes, nodes[-1]],  # one too many
        [header, nodes[0][:-1] + bytes([nodes[0][-1] ^ 1])],  # checksum
    ]
    for blobs in cases:
        with pytest.raises(CorruptDataError):
            Stream.load(blobs)
    # A node that lies wholly before the first offset cannot be in a dump.
    older = Stream(max_entries=10)
    older.append([msg(i) for i in range(25)])
    with pytest.raises(CorruptDataError):
        Stream.load([header, next(iter(list(older.dump())[1:]))])


def test_append_accepts_bytes_like_messages() -> None:
    s = Stream()
    assert s.append([bytearray(b"ab")]) == 0
    assert s.append([memoryview(b"cd"), b"e"]) == 1
    assert s.append_joined(memoryview(b"fgh"), [2, 1]) == 3
    assert s.read(0, 5) == [b"ab", b"cd", b"e", b"fg", b"h"]
