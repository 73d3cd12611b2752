"""The persistence layer in process (no network): the snapshot and AOF
formats round trip against a model, corruption and torn tails are found
and named, AOF replay and rewrite reproduce the state, and the offset
reservations keep an offset from ever being handed out twice
(docs/PROTOCOL.md section 8). Through a running server:
test_persistence_snapshots.py, test_persistence_aof.py, test_crash_*.py."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from conftest import finish_rewrite, persistence_in_process

from rcp11.persistence import (
    OffsetReservations,
    Persistence,
    PersistenceError,
    encode_command,
    iter_aof_commands,
)
from rcp11.persistence.offsets_file import HEADER_SIZE
from rcp11.state import ServerState

# ---------------------------------------------------------------------------
# In-process: the file formats
# ---------------------------------------------------------------------------


def make_state(directory: Path, **directives: str) -> tuple[ServerState, Persistence]:
    return persistence_in_process(directory, **directives)


def fill_random(state: ServerState, rng: random.Random) -> dict[bytes, object]:
    """Streams with varied node sizes, compression, evictions, raised
    offsets; plain strings. Returns a model of what a reader must see."""
    from rcp11.storage import Stream

    model: dict[bytes, object] = {}
    for index in range(12):
        key = b"stream:%d" % index
        stream = Stream(rng.choice([1, 3, 16, 100]), rng.choice([0, 0, 6]))
        messages: list[bytes | None] = []
        for _ in range(rng.randint(0, 6)):
            batch = [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(1, 80))]
            stream.append(batch)
            messages.extend(batch)
            if rng.random() < 0.3:
                upto = rng.randint(0, len(messages))
                stream.evict_upto(upto)
                for offset in range(min(upto + 1, len(messages))):
                    messages[offset] = None
            if rng.random() < 0.15:
                jump = len(messages) + rng.randint(0, 50)
                stream.raise_next_offset(jump)
                messages.extend([None] * (jump - len(messages)))
        state.keyspace.set(key, stream)
        model[key] = (stream.next_offset, stream.first_offset, messages)
    for index in range(5):
        key = b"string:%d" % index
        value = rng.randbytes(rng.randint(0, 300))
        state.keyspace.set(key, value)
        model[key] = value
    return model


def assert_matches(state: ServerState, model: dict[bytes, object]) -> None:
    assert set(state.keyspace.data) == set(model)
    for key, expected in model.items():
        value = state.keyspace.get(key)
        if isinstance(expected, bytes):
            assert value == expected
            continue
        next_offset, first_offset, messages = expected
        assert value.next_offset == next_offset, key
        assert value.first_offset == first_offset, key
        assert value.read(0, next_offset) == messages, key


@pytest.mark.parametrize("seed", range(4))
def test_snapshot_round_trip_matches_model(tmp_path: Path, seed: int) -> None:
    state, persistence = make_state(tmp_path)
    persistence.load()
    model = fill_random(state, random.Random(seed))
    compressed = {
        k: v.num_compressed_nodes
        for k, v in state.keyspace.data.items()
        if not isinstance(v, bytes)
    }
    assert persistence.save() == "OK"

    loaded, loader = make_state(tmp_path)
    loader.load()
    assert_matches(loaded, model)
    # Compressed nodes are stored and loaded as they sat in memory.
    for key, count in compressed.items():
        assert loaded.keyspace.get(key).num_compressed_nodes == count


def test_snapshot_keeps_expiry(tmp_path: Path) -> None:
    state, persistence = make_state(tmp_path)
    persistence.load()
    state.keyspace.set(b"a", b"1")
    deadline = int(time.time() * 1000) + 3_600_000
    state.keyspace.set_expire(b"a", deadline)
    persistence.save()
    loaded, loader = make_state(tmp_path)
    loader.load()
    assert loaded.keyspace.expires.get(b"a") == deadline


def saved_snapshot(tmp_path: Path) -> Path:
    state, persistence = make_state(tmp_path)
    persistence.load()
    fill_random(state, random.Random(99))
    assert persistence.save() == "OK"
    return tmp_path / "dump.rcp"


def test_snapshot_flipped_bytes_are_detected_and_named(tmp_path: Path) -> None:
    path = saved_snapshot(tmp_path)
    good = path.read_bytes()
    rng = random.Random(5)
    positions = [0, 5, 12, len(good) // 3, len(good) // 2, len(good) - 5, len(good) - 1]
    positions += [rng.randrange(len(good)) for _ in range(12)]
    for position in positions:
        bad = bytearray(good)
        bad[position] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(bad))
        _, loader = make_state(tmp_path)
        with pytest.raises(PersistenceError, match=str(path)):
            loader.load()


def test_snapshot_torn_anywhere_is_detected(tmp_path: Path) -> None:
    path = saved_snapshot(tmp_path)
    good = path.read_bytes()
    rng = random.Random(6)
    for cut in [0, 1, 9, 20, len(good) - 4, len(good) - 1] + [
        rng.randrange(len(good)) for _ in range(10)
    ]:
        path.write_bytes(good[:cut])
        _, loader = make_state(tmp_path)
        with pytest.raises(PersistenceError, match=str(path)):
            loader.load()
    path.write_bytes(good + b"x")
    _, loader = make_state(tmp_path)
    with pytest.raises(PersistenceError, match="after the checksum"):
        loader.load()


def test_aof_parser_reports_torn_tail_and_bad_bytes(tmp_path: Path) -> None:
    commands = [[b"SET", b"k", b"v" * n] for n in range(20)]
    data = b"".join(encode_command(c) for c in commands)
    path = tmp_path / "a.aof"
    path.write_bytes(data)
    with open(path, "rb") as file:
        assert [argv for argv, _, _ in iter_aof_commands(file, 0, chunk=7)] == commands
    cut = len(data) - 3
    path.write_bytes(data[:cut])
    with open(path, "rb") as file:
        seen = []
        with pytest.raises(Exception) as info:
            for _argv, _, end in iter_aof_commands(file, 0, chunk=11):
                seen.append(end)
        assert type(info.value).__name__ == "TornTail"
        assert info.value.offset == seen[-1]
    corrupt = bytearray(data)
    third = len(encode_command(commands[0])) + len(encode_command(commands[1]))
    corrupt[third] = ord("?")
    path.write_bytes(bytes(corrupt))
    with open(path, "rb") as file, pytest.raises(Exception) as info:
        list(iter_aof_commands(file, 0))
    assert type(info.value).__name__ == "BadBytes"
    assert info.value.offset == third


# ---------------------------------------------------------------------------
# In-process: offset reservations
# ---------------------------------------------------------------------------


def test_reservations_amortize_fsyncs(tmp_path: Path) -> None:
    state, persistence = make_state(tmp_path)
    persistence.load()
    stream = state.new_stream()
    state.keyspace.set(b"s", stream)
    for _ in range(20_000):
        persistence.before_stream_write(b"s", stream.next_offset + 1)
        stream.append([b"m"])
        assert persistence.flush()  # as the server does before replying
    fsyncs = persistence.reservations.fsyncs
    # 20k single-message writes, steps start at 1024 and double when fast.
    assert 1 <= fsyncs <= 8
    assert persistence.reservations.marks[b"s"] >= stream.next_offset


def test_reservations_recover_lost_streams_as_nulls(tmp_path: Path) -> None:
    state, persistence = make_state(tmp_path)
    persistence.load()
    stream = state.new_stream()
    state.keyspace.set(b"lost", stream)
    persistence.before_stream_write(b"lost", 5)
    stream.append([b"a", b"b", b"c", b"d", b"e"])
    assert persistence.flush()
    # Crash: nothing was saved; only the reservation survives.
    recovered, loader = make_state(tmp_path)
    loader.load()
    again = recovered.keyspace.get(b"lost")
    assert again.next_offset >= 5
    assert again.read(0, 5) == [None] * 5


def test_reservations_torn_tail_ignored_middle_corruption_refused(tmp_path: Path) -> None:
    reservations = OffsetReservations(str(tmp_path / "x.offsets"))
    reservations.load()
    for index in range(5):
        reservations.reserve(b"k%d" % index, 10, 0)
    path = tmp_path / "x.offsets"
    good = path.read_bytes()
    path.write_bytes(good[:-3])
    torn = OffsetReservations(str(path))
    marks = torn.load()
    # The cut batch may have covered offsets already handed out: every mark,
    # and the key still readable in it, goes up by a margin, durably.
    assert set(marks) == {b"k0", b"k1", b"k2", b"k3", b"k4"}
    assert min(marks[b"k%d" % index] for index in range(4)) >= 10 + 2**30
    assert marks[b"k4"] >= 2**30
    assert OffsetReservations(str(path)).load() == marks
    bad = bytearray(good)
    bad[HEADER_SIZE + 8 + 2] ^= 0x40  # inside the first batch's payload (after the header)
    path.write_bytes(bytes(bad))
    with pytest.raises(PersistenceError, match=str(path)):
        OffsetReservations(str(path)).load()


def test_deleted_stream_reservation_dropped_once_durable(tmp_path: Path) -> None:
    state, persistence = make_state(tmp_path)
    persistence.load()
    stream = state.new_stream()
    state.keyspace.set(b"s", stream)
    persistence.before_stream_write(b"s", 3)
    stream.append([b"a", b"b", b"c"])
    assert persistence.flush()
    assert persistence.save() == "OK"
    persistence.before_stream_write(b"s", 5)
    stream.append([b"d", b"e"])  # offsets 3 and 4: never saved
    assert persistence.flush()
    state.keyspace.delete(b"s")
    persistence.flush()
    persistence.tick(time.time())
    # The snapshot on disk still has the stream: should it come back (a
    # crash now), it must still go above the offsets it handed out.
    crashed, loader = make_state(tmp_path)
    loader.load()
    back = crashed.keyspace.get(b"s")
    assert back.read(0, 5) == [b"a", b"b", b"c", None, None]
    assert back.next_offset >= 5
    loader.shutdown("nosave")
    # Deleted again (the deletion now saved): the mark goes, nothing comes back.
    state, persistence = make_state(tmp_path)
    persistence.load()
    state.keyspace.delete(b"s")
    persistence.flush()
    assert persistence.save() == "OK"
    persistence.tick(time.time())
    reservations = OffsetReservations(str(tmp_path / "dump.rcp.offsets"))
    assert b"s" not in reservations.load() and b"s" not in reservations.deleted
    fresh, loader = make_state(tmp_path)
    loader.load()
    assert b"s" not in fresh.keyspace


def test_a_deleted_then_recreated_stream_keeps_the_old_mark_until_durable(tmp_path: Path) -> None:
    """Snapshot only: s is saved with 3 messages, gets 2 more, is deleted and
    created again. A crash brings the old s back from the snapshot: it must
    go above all 5 offsets the old stream handed out, although the new
    stream reserved much lower marks."""
    state, persistence = make_state(tmp_path)
    persistence.load()
    run_cmd = execute_in(state, persistence)
    run_cmd(b"TWRITE", b"s", b"ENTRIES", b"a", b"b", b"c")
    assert persistence.save() == "OK"
    old_mark = persistence.reservations.marks[b"s"]
    for index in range(old_mark - 3):  # up to the old mark
        run_cmd(b"TWRITE", b"s", b"m%d" % index)
    old_next = state.keyspace.get(b"s").next_offset
    run_cmd(b"DEL", b"s")
    assert run_cmd(b"TWRITE", b"s", b"new") == 0
    crashed, loader = make_state(tmp_path)
    loader.load()
    back = crashed.keyspace.get(b"s")
    assert back.read(0, 3) == [b"a", b"b", b"c"]
    assert back.next_offset >= old_next


def test_del_lost_from_the_aof_brings_the_stream_back_above_its_mark(tmp_path: Path) -> None:
    """A power loss may cut the AOF before a DEL while the offsets file kept
    the deletion record: the stream comes back whole, and still goes up to
    its reservation mark."""
    state, persistence = aof_state(tmp_path, appendfsync="everysec")
    run_cmd = execute_in(state, persistence)
    for index in range(5):
        run_cmd(b"TWRITE", b"s", b"m%d" % index)
    aof = tmp_path / "appendonly.aof"
    before_del = aof.stat().st_size
    mark = persistence.reservations.marks[b"s"]
    run_cmd(b"DEL", b"s")
    assert OffsetReservations(str(tmp_path / "dump.rcp.offsets")).load().get(b"s") is None
    with open(aof, "r+b") as file:
        file.truncate(before_del)
    loaded, _ = aof_state(tmp_path)
    stream = loaded.keyspace.get(b"s")
    assert stream.read(0, 5) == [b"m%d" % i for i in range(5)]
    assert stream.next_offset >= mark


# ---------------------------------------------------------------------------
# In-process: AOF replay and rewrite
# ---------------------------------------------------------------------------


def aof_state(directory: Path, **directives: str) -> tuple[ServerState, Persistence]:
    settings = {"appendonly": "yes", "appendfsync": "always", **directives}
    state, persistence = persistence_in_process(directory, **settings)
    persistence.load()
    return state, persistence


def execute_in(state: ServerState, persistence: Persistence):  # noqa: ANN201 - a closure
    """run() bound to one state: run_cmd(b"TWRITE", b"s", b"x")."""
    return lambda *argv: run(state, persistence, *argv)


def run(state: ServerState, persistence: Persistence, *argv: bytes) -> object:
    from rcp11.commands import execute
    from rcp11.state import ClientState

    client = ClientState(authenticated=True)
    reply = execute(state, client, list(argv))
    assert persistence.flush()
    return reply


def test_aof_after_a_crash_goes_on_exactly_and_a_cut_one_raises(tmp_path: Path) -> None:
    state, persistence = aof_state(tmp_path)
    for index in range(10):
        run(state, persistence, b"TWRITE", b"s", b"m%d" % index)
    mark = persistence.reservations.marks[b"s"]
    assert mark > 10
    # A crash (no shutdown) with the AOF whole: the offsets file's AOF slot
    # vouches for it, so the stream goes on at its next offset.
    state, persistence = aof_state(tmp_path)
    assert state.keyspace.get(b"s").next_offset == 10
    # Cut at a command boundary (the last TWRITE gone): nothing in the file
    # shows it, the slot does; offsets up to the mark count as handed out.
    path = tmp_path / "appendonly.aof"
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"*3\r\n$6\r\nTWRITE")])
    state, persistence = aof_state(tmp_path)
    stream = state.keyspace.get(b"s")
    assert stream.next_offset == mark
    assert stream.read(0, 10) == [b"m%d" % i for i in range(9)] + [None]
    assert run(state, persistence, b"TWRITE", b"s", b"after") == mark
    # Replaying the AOF (raise record included) gives the same offsets.
    persistence.shutdown("nosave")
    state, persistence = aof_state(tmp_path)
    stream = state.keyspace.get(b"s")
    assert stream.next_offset == mark + 1
    assert stream.read(mark, 1) == [b"after"]


def test_aof_unterminated_multi_at_tail_is_dropped(tmp_path: Path) -> None:
    state, persistence = aof_state(tmp_path)
    run(state, persistence, b"TWRITE", b"s", b"kept")
    persistence.shutdown("nosave")
    path = tmp_path / "appendonly.aof"
    complete = path.stat().st_size
    with open(path, "ab") as file:
        file.write(encode_command([b"MULTI"]) + encode_command([b"TWRITE", b"s", b"half"]))
    state, persistence = aof_state(tmp_path)
    stream = state.keyspace.get(b"s")
    assert stream.read(0, stream.next_offset) == [b"kept"]
    assert path.stat().st_size == complete
    persistence.shutdown("nosave")
    with open(path, "ab") as file:
        file.write(encode_command([b"MULTI"]) + encode_command([b"TWRITE", b"s", b"whole"]))
        file.write(encode_command([b"EXEC"]))
    state, _ = aof_state(tmp_path)
    stream = state.keyspace.get(b"s")
    assert stream.read(0, stream.next_offset) == [b"kept", b"whole"]


def test_aof_corruption_in_the_middle_refuses_with_offset(tmp_path: Path) -> None:
    state, persistence = aof_state(tmp_path)
    for index in range(20):
        run(state, persistence, b"TWRITE", b"s", b"m%d" % index)
    persistence.shutdown("nosave")
    path = tmp_path / "appendonly.aof"
    data = bytearray(path.read_bytes())
    middle = data.index(b"*3\r\n", len(data) // 2)
    # Not '#': that starts an annotation line, which the loader reads.
    data[middle] = ord("!")
    path.write_bytes(bytes(data))
    with pytest.raises(PersistenceError, match=rf"{path}.*offset {middle}"):
        aof_state(tmp_path)


def test_rewrite_with_a_big_tail_moves_it_in_slices(tmp_path: Path) -> None:
    """Commands logged while the rewrite child runs can be many: they reach
    the new file over several cron ticks, and nothing is lost or doubled."""
    state, persistence = aof_state(tmp_path, appendfsync="everysec")
    run(state, persistence, b"TWRITE", b"s", b"base")
    assert persistence.bgrewriteaof()
    big = b"x" * 100_000
    for index in range(120):  # 12 MB, more than one slice
        run(state, persistence, b"TWRITE", b"s", big + b"%d" % index)
    finish_rewrite(persistence)
    assert persistence.info()["aof_last_bgrewrite_status"] == "ok"
    run(state, persistence, b"TWRITE", b"s", b"after")
    persistence.shutdown("nosave")
    assert (tmp_path / "appendonly.aof").read_bytes().startswith(b"RCP11SNAP")
    loaded, _ = aof_state(tmp_path)
    stream = loaded.keyspace.get(b"s")
    expected = [b"base"] + [big + b"%d" % i for i in range(120)] + [b"after"]
    assert stream.read(0, stream.next_offset) == expected


def test_offsets_file_is_compacted_when_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "x.offsets"
    reservations = OffsetReservations(str(path))
    reservations.load()
    for round_index in range(6):
        for index in range(2000):
            key = b"key-%d-%d" % (round_index, index)
            reservations.write([(key, index + 1, False)], durable=False)
            reservations.marks[key] = index + 1
            if round_index < 5:
                reservations.queue_drop(key)
    reservations.write([], durable=True)
    grown = path.stat().st_size
    expected = dict(reservations.marks)
    assert len(expected) == 2000
    reservations.compact_if_large()
    assert path.stat().st_size < grown / 3
    assert OffsetReservations(str(path)).load() == expected


def test_many_new_streams_in_one_iteration_cost_one_fsync(tmp_path: Path) -> None:
    state, persistence = make_state(tmp_path)
    persistence.load()
    before = persistence.reservations.fsyncs
    for index in range(500):
        key = b"stream-%d" % index
        persistence.before_stream_write(key, 1)
        stream = state.new_stream()
        stream.append([b"m"])
        state.keyspace.set(key, stream)
    assert persistence.reservations.fsyncs == before  # not yet: flush() does it
    assert persistence.flush()
    assert persistence.reservations.fsyncs == before + 1
    assert len(OffsetReservations(str(tmp_path / "dump.rcp.offsets")).load()) == 500


def state_view(state: ServerState) -> dict[bytes, object]:
    view: dict[bytes, object] = {}
    for key, value in state.keyspace.data.items():
        if isinstance(value, bytes):
            view[key] = value
        else:
            view[key] = (
                value.next_offset,
                value.first_offset,
                value.num_compressed_nodes,
                value.read(0, value.next_offset),
            )
    return view


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_aof_replay_and_rewrite_reproduce_the_state(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    settings = {"stream_compression": "zlib", "stream_node_max_entries": "7"}
    state, persistence = aof_state(tmp_path, **settings)

    def random_command() -> list[bytes]:
        key = b"s%d" % rng.randrange(3)
        roll = rng.random()
        if roll < 0.55:
            entries = [rng.randbytes(rng.randint(0, 20)) for _ in range(rng.randint(1, 12))]
            return [b"TWRITE", key, b"ENTRIES", *entries]
        if roll < 0.65:
            return [b"TEVICT", key, b"%d" % rng.randint(-30, 60)]
        if roll < 0.75:
            return [b"TREAD", key, b"0", b"%d" % rng.randint(0, 6), b"GROUP", b"g" + key]
        if roll < 0.8:
            return [b"DEL", key]
        if roll < 0.85:
            return [b"TWRITE", key, b"BACKLOG", b"%d" % rng.randint(0, 9), b"ENTRIES", b"b"]
        return [b"SET", b"str%d" % rng.randrange(2), rng.randbytes(8)]

    from rcp11.commands import execute
    from rcp11.state import ClientState

    client = ClientState(authenticated=True)
    for step in range(400):
        if rng.random() < 0.05:
            execute(state, client, [b"MULTI"])
            for _ in range(rng.randint(1, 4)):
                execute(state, client, random_command())
            execute(state, client, [b"EXEC"])
        else:
            execute(state, client, random_command())
        assert persistence.flush()
        if step == 200:
            persistence.bgrewriteaof()
        persistence.tick(time.time())
    finish_rewrite(persistence)
    expected = state_view(state)
    # A clean shutdown writes tight reservation marks, so what the next
    # start shows is exactly what the AOF replays (a crash would add a gap
    # up to each mark: test_crash_kill9.py, test_crash_random_kills.py).
    persistence.shutdown("nosave")
    loaded, reloaded = aof_state(tmp_path, **settings)
    assert state_view(loaded) == expected
    # And once more after a rewrite of the reloaded data.
    reloaded.bgrewriteaof()
    finish_rewrite(reloaded)
    assert reloaded.info()["aof_last_bgrewrite_status"] == "ok"
    reloaded.shutdown("nosave")
    again, _ = aof_state(tmp_path, **settings)
    assert state_view(again) == expected
