"""The state of an acknowledged group (src/ackgroup.c through
rcp11/storage/ackgroups.py) against a per-offset model: random leases,
acknowledgements, evictions and picks must leave both with the same
pending offsets, and the blob must round-trip and refuse damage."""

from __future__ import annotations

import random

import pytest

from rcp11.storage import CorruptDataError, InvalidArgumentError
from rcp11.storage.ackgroups import MAX_OWNER_BYTES, AckGroup


class Model:
    """Offset -> (deadline, owner, deliveries), and the next offset."""

    def __init__(self, next_offset: int) -> None:
        self.next = next_offset
        self.pending: dict[int, tuple[int, bytes, int]] = {}
        self.delivered = self.redelivered = self.acked = self.dropped = 0

    def floor(self, f: int) -> int:
        gone = [o for o in self.pending if o < f]
        for o in gone:
            del self.pending[o]
        self.dropped += len(gone)
        self.next = max(self.next, f)
        return len(gone)

    def pick(self, now: int, floor: int, end: int, count: int) -> tuple[int, int, int]:
        start = max(self.next, floor)
        if count == 0:
            return start, 0, 0
        expired = sorted(
            o for o, (d, _, _) in self.pending.items() if d <= now and floor <= o < end
        )
        if expired:
            # The lowest expired offset starts a run of offsets of one
            # range: ranges are maximal, so a range is a run of equal state.
            first = expired[0]
            state = self.pending[first]
            n = 0
            while n < count and first + n < end and self.pending.get(first + n) == state:
                n += 1
            return first, n, state[2] + 1
        if start < end:
            return start, min(end - start, count), 1
        return start, 0, 0

    def lease(self, start: int, count: int, deadline: int, deliveries: int, owner: bytes) -> None:
        for o in range(start, start + count):
            self.pending[o] = (deadline, owner, deliveries)
        self.delivered += count
        if deliveries > 1:
            self.redelivered += count
        self.next = max(self.next, start + count)

    def ack(self, start: int, count: int) -> int:
        hit = [o for o in range(start, start + count) if o in self.pending]
        for o in hit:
            del self.pending[o]
        self.acked += len(hit)
        return len(hit)


def _same(group: AckGroup, model: Model) -> None:
    assert group.next_offset == model.next
    assert group.pending == len(model.pending)
    seen: dict[int, tuple[int, bytes, int]] = {}
    previous_end = -1
    for r in group.ranges():
        assert r.count >= 1 and r.start >= previous_end
        previous_end = r.start + r.count
        for o in range(r.start, r.start + r.count):
            seen[o] = (r.deadline_ms, r.owner, r.deliveries)
    assert seen == model.pending
    totals = group.totals()
    assert (totals.delivered, totals.redelivered, totals.acked, totals.dropped) == (
        model.delivered,
        model.redelivered,
        model.acked,
        model.dropped,
    )


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_match_the_model(seed: int) -> None:
    rng = random.Random(seed)
    group = AckGroup(b"jobs", 0)
    model = Model(0)
    now = 1_000
    end = first = 0  # the stream's next and first offsets
    owners = [b"", b"w1", b"w2", b"\xff\x00bin"]
    for _ in range(400):
        op = rng.random()
        if op < 0.35:
            end += rng.randrange(0, 30)
            count = rng.randrange(0, 25)
            lease = rng.randrange(1, 50)
            picked = group.pick(now, first, end, count)
            assert picked == model.pick(now, first, end, count)
            start, n, deliveries = picked
            if n:
                owner = rng.choice(owners)
                # What a lease read does: drop the evicted, then lease.
                assert group.floor(first) == model.floor(first)
                group.lease(start, n, now + lease, deliveries, owner)
                model.lease(start, n, now + lease, deliveries, owner)
        elif op < 0.6:
            start = rng.randrange(0, max(model.next, 1) + 5)
            count = rng.randrange(0, 40)
            assert group.ack(start, count) == model.ack(start, count)
        elif op < 0.65:
            first = rng.randrange(first, end + 1)  # the stream evicts
        elif op < 0.7:
            f = rng.randrange(0, model.next + 3)
            assert group.floor(f) == model.floor(f)
            end = max(end, f)
            first = max(first, min(f, end))
        else:
            now += rng.randrange(0, 30)
        _same(group, model)
        earliest = min(
            (d for o, (d, _, _) in model.pending.items() if first <= o < end), default=None
        )
        assert group.earliest_deadline(first, end) == earliest
    # The blob round-trips exactly, totals and owners included.
    copy = AckGroup.load(group.dump())
    _same(copy, model)
    assert copy.dump() == group.dump()
    assert copy.stream_key == b"jobs"


def test_memory_is_per_range_not_per_message() -> None:
    group = AckGroup(b"s", 0)
    group.lease(0, 1_000_000, 10, 1, b"w1")
    one_range = group.memory_bytes
    group.lease(1_000_000, 1, 11, 1, b"w1")
    group.lease(1_000_001, 5_000_000, 12, 1, b"w1")
    assert group.pending == 6_000_001
    assert group.num_ranges == 3
    # Batches leased alike (one reader, one millisecond) make one range.
    group.lease(6_000_001, 100, 12, 1, b"w1")
    assert group.num_ranges == 3
    assert group.memory_bytes <= one_range + 64  # two more ranges, no per-message cost
    # Acknowledging the middle of a range splits it; the rest stays pending.
    assert group.ack(10, 10) == 10
    assert [(r.start, r.count) for r in group.ranges(0, 2)] == [(0, 10), (20, 999_980)]


def test_picks_the_lowest_expired_range_before_new_messages() -> None:
    group = AckGroup(b"s", 0)
    group.lease(0, 10, 100, 1, b"a")
    group.lease(10, 10, 50, 1, b"b")
    group.lease(20, 10, 200, 1, b"c")
    assert group.pick(40, 0, 100, 100) == (30, 70, 1)  # nothing expired: new messages
    assert group.pick(60, 0, 100, 5) == (10, 5, 2)  # b's lease ran out first
    assert group.pick(150, 0, 100, 100) == (0, 10, 2)  # then a's, lower offset first
    # Evicted offsets are never delivered: a's range is cut at the floor.
    assert group.pick(150, 4, 100, 100) == (4, 6, 2)
    assert group.pick(150, 40, 100, 100) == (40, 60, 1)
    group.lease(0, 10, 300, 2, b"d")
    assert group.pick(150, 0, 100, 100) == (10, 10, 2)
    # A range past the stream's end (the stream was recreated) waits.
    assert group.pick(150, 0, 5, 100) == (30, 0, 0)


def test_bad_arguments_are_refused_and_change_nothing() -> None:
    group = AckGroup(b"s", 0)
    with pytest.raises(InvalidArgumentError):
        group.lease(0, 1, 10, 1, b"x" * (MAX_OWNER_BYTES + 1))
    with pytest.raises(InvalidArgumentError):
        group.lease(0, 1, 10, 0, b"x")
    with pytest.raises(InvalidArgumentError):
        group.lease(2**63, 1, 10, 1, b"x")
    assert group.next_offset == 0 and group.pending == 0 and group.num_ranges == 0


def test_damaged_blobs_are_refused() -> None:
    rng = random.Random(7)
    group = AckGroup(b"stream", 5)
    for i in range(20):
        group.lease(5 + 10 * i, 7, 1000 + i, 1 + i % 3, b"w%d" % (i % 4))
    blob = group.dump()
    for cut in range(len(blob)):
        with pytest.raises(CorruptDataError):
            AckGroup.load(blob[:cut])
    for _ in range(300):
        damaged = bytearray(blob)
        damaged[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptDataError):
            AckGroup.load(bytes(damaged))
