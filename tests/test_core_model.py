"""Model-based test of the storage core: random sequences of appends,
evictions, gaps, compression changes and dump/load round trips, checked
against a plain Python list of offsets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rcp11.storage import MAX_OFFSET, InvalidArgumentError, OffsetOverflowError, Stream

messages = st.lists(st.binary(max_size=120), min_size=1, max_size=40)


class StreamModel(RuleBasedStateMachine):
    """The model: `readable` maps offset -> message for every readable
    offset (in offset order); `next` is the next offset. Everything else
    reads as null. Sparse, so that jumping near 2^63 costs nothing."""

    @initialize(
        max_entries=st.sampled_from([1, 2, 3, 7, 50, 1000]),
        level=st.sampled_from([0, 0, 1, 9]),
    )
    def create(self, max_entries: int, level: int) -> None:
        self.stream = Stream(max_entries=max_entries, compression_level=level)
        self.readable: dict[int, bytes] = {}
        self.next = 0

    def expected(self, start: int, count: int) -> list[bytes | None]:
        return [self.readable.get(i) for i in range(start, start + count)]

    def evict_model(self, upto: int) -> int:
        gone = [i for i in self.readable if i <= upto]
        for i in gone:
            del self.readable[i]
        return len(gone)

    @rule(batch=messages)
    def append(self, batch: list[bytes]) -> None:
        if self.next + len(batch) > MAX_OFFSET + 1:
            try:
                self.stream.append(batch)
            except OffsetOverflowError:
                return
            raise AssertionError("append past 2^63-1 succeeded")
        assert self.stream.append(batch) == self.next
        for m in batch:
            self.readable[self.next] = m
            self.next += 1

    @rule(batch=st.lists(st.binary(max_size=60), min_size=1, max_size=300))
    def append_joined(self, batch: list[bytes]) -> None:
        if self.next + len(batch) > MAX_OFFSET + 1:
            return
        lens = np.fromiter(map(len, batch), dtype=np.uint32, count=len(batch))
        assert self.stream.append_joined(b"".join(batch), lens) == self.next
        for m in batch:
            self.readable[self.next] = m
            self.next += 1

    @rule(data=st.data())
    def evict_upto(self, data: st.DataObject) -> None:
        low = max(0, self.next - 150)
        offset = data.draw(st.integers(min_value=low, max_value=min(self.next + 5, MAX_OFFSET)))
        assert self.stream.evict_upto(offset) == self.evict_model(offset)

    @rule(keep=st.integers(min_value=0, max_value=120))
    def evict_keep(self, keep: int) -> None:
        assert self.stream.evict_keep(keep) == self.evict_model(self.next - keep - 1)

    @rule(skip=st.integers(min_value=0, max_value=30))
    def raise_next_offset(self, skip: int) -> None:
        skip = min(skip, MAX_OFFSET + 1 - self.next)
        self.stream.raise_next_offset(self.next + skip)
        self.next += skip

    @precondition(lambda self: self.next < MAX_OFFSET - 100)
    @rule(distance=st.integers(min_value=0, max_value=60))
    def jump_near_the_offset_limit(self, distance: int) -> None:
        self.next = MAX_OFFSET + 1 - distance
        self.stream.raise_next_offset(self.next)

    @rule(level=st.integers(min_value=0, max_value=9))
    def set_compression(self, level: int) -> None:
        self.stream.set_compression(level)

    @rule()
    def dump_and_load(self) -> None:
        blobs = list(self.stream.dump())
        copy = Stream.load(blobs)
        assert list(copy.dump()) == blobs
        self.stream = copy

    @rule(data=st.data())
    def read_slice(self, data: st.DataObject) -> None:
        candidates = [0, self.next, *self.readable]
        start = data.draw(st.sampled_from(candidates)) + data.draw(st.integers(-3, 3))
        start = min(max(start, 0), self.next)
        count = data.draw(st.integers(min_value=0, max_value=min(self.next - start, 150)))
        want = self.expected(start, count)
        assert self.stream.read(start, count) == want
        for resp3, null in ((False, b"$-1\r\n"), (True, b"_\r\n")):
            expected = b"".join(null if m is None else b"$%d\r\n%s\r\n" % (len(m), m) for m in want)
            assert self.stream.read_resp(start, count, resp3) == expected
            header = b"*%d\r\n" % count
            assert self.stream.read_resp(start, count, resp3, header) == header + expected

    @invariant()
    def counters_match(self) -> None:
        s = self.stream
        assert s.next_offset == self.next
        assert s.last_offset == self.next - 1
        # Stream caches next_offset; the C core's own range check must agree.
        assert s.read_resp(self.next, 0, False) == b""
        if self.next <= MAX_OFFSET:
            with pytest.raises(InvalidArgumentError):
                s.read_resp(self.next, 1, False)
        assert s.length == len(self.readable)
        assert s.payload_bytes == sum(map(len, self.readable.values()))
        assert s.first_offset == next(iter(self.readable), self.next)
        assert s.num_compressed_nodes <= max(s.num_nodes - 1, 0)
        assert (s.num_nodes == 0) == (not self.readable)

    @invariant()
    def readable_messages_read_back(self) -> None:
        if self.readable:
            first = next(iter(self.readable))
            last = next(reversed(self.readable))
            count = min(last - first + 1, 2000)
            assert self.stream.read(first, count) == self.expected(first, count)


TestStreamModel = pytest.mark.slow(StreamModel.TestCase)
TestStreamModel.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
