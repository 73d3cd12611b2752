"""Damaged persistence files: every branch of the snapshot, AOF and offsets
loaders that can meet garbage refuses the start with the file's name, the
byte offset where known and the problem (or, for a tail a crash can leave,
handles it as documented: aof-load-truncated, and offsets never reused).
Nothing is accepted silently. In process, then through a running server."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess, persistence_in_process, read_all, tr, tw, twrite_entries

from rcp11.persistence import (
    OFFSETS_MAGIC,
    RAISE_NEXT,
    OffsetReservations,
    Persistence,
    PersistenceError,
    encode_command,
)
from rcp11.persistence.offsets_file import HEADER_SIZE, NO_AOF, header
from rcp11.state import ServerState

HEADER = header(NO_AOF)  # version 3: magic, version, the AOF slot
V1_HEADER = OFFSETS_MAGIC + struct.pack("<H", 1)
V2_HEADER = OFFSETS_MAGIC + struct.pack("<H", 2)


def loaded(directory: Path, **directives: str) -> tuple[ServerState, Persistence]:
    state, persistence = persistence_in_process(directory, **directives)
    persistence.load()
    return state, persistence


# ---------------------------------------------------------------------------
# The offsets file
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 5, 8, 9, 10, 11, 40, 73, 74, 75])
def test_offsets_file_of_garbage_refuses_whatever_its_size(tmp_path: Path, size: int) -> None:
    path = tmp_path / "dump.rcp.offsets"
    garbage = random.Random(size).randbytes(size)
    if OFFSETS_MAGIC.startswith(garbage[:8]):
        garbage = b"X" + garbage[1:]
    path.write_bytes(garbage)
    with pytest.raises(PersistenceError, match=rf"{path}: not an rcp11 offsets file"):
        OffsetReservations(str(path)).load()


@pytest.mark.parametrize("length", range(len(HEADER)))
def test_offsets_file_whose_header_never_reached_the_disk_is_empty(
    tmp_path: Path, length: int
) -> None:
    """A file created and cut before its header was whole never held a
    reservation (the header is fsynced before any)."""
    for head in (HEADER, V1_HEADER + b"\0" * 64, V2_HEADER):
        if length < len(head):
            path = tmp_path / "x.offsets"
            path.write_bytes(head[:length])
            assert OffsetReservations(str(path)).load() == {}


def test_version_1_file_with_its_slot_cut_is_empty_and_a_whole_one_loads(tmp_path: Path) -> None:
    path = tmp_path / "x.offsets"
    path.write_bytes(V1_HEADER + b"\0" * 30)  # slot cut short: created, nothing reserved
    assert OffsetReservations(str(path)).load() == {}
    payload = struct.pack("<I", 1) + b"k" + struct.pack("<q", 77)
    batch = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    path.write_bytes(V1_HEADER + b"\0" * 64 + batch)
    assert OffsetReservations(str(path)).load() == {b"k": 77}
    assert path.read_bytes().startswith(HEADER)  # rewritten as version 3
    assert OffsetReservations(str(path)).load() == {b"k": 77}


def test_version_2_file_loads_and_is_rewritten_as_version_3(tmp_path: Path) -> None:
    path = tmp_path / "x.offsets"
    payload = struct.pack("<I", 1) + b"k" + struct.pack("<q", 77)
    batch = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    path.write_bytes(V2_HEADER + batch)
    reservations = OffsetReservations(str(path))
    assert reservations.load() == {b"k": 77}
    assert reservations.slot == NO_AOF  # a version 2 file vouches for no AOF
    assert path.read_bytes() == HEADER + batch


def test_offsets_file_with_an_unknown_version_refuses(tmp_path: Path) -> None:
    path = tmp_path / "x.offsets"
    path.write_bytes(OFFSETS_MAGIC + struct.pack("<H", 9))
    with pytest.raises(PersistenceError, match=rf"{path}: .*version 9"):
        OffsetReservations(str(path)).load()


def reservations_file(path: Path, batches: int = 6) -> tuple[bytes, list[int]]:
    """A real offsets file of several batches; returns it and where each
    batch starts."""
    reservations = OffsetReservations(str(path))
    reservations.load()
    for index in range(batches):
        reservations.reserve(b"key-%d" % index, 10 + index, 0)
    data = path.read_bytes()
    starts = []
    pos = HEADER_SIZE
    while pos < len(data):
        starts.append(pos)
        pos += 8 + struct.unpack_from("<I", data, pos)[0]
    return data, starts


@pytest.mark.parametrize("batch", [0, 2, 4])
def test_damaged_batch_length_before_the_last_batch_refuses(tmp_path: Path, batch: int) -> None:
    """A length field that runs past the end looks like a batch torn by a
    crash, but complete batches after it prove it is damage: reading on as
    if it were the end would lose the marks of the batches after it."""
    path = tmp_path / "x.offsets"
    data, starts = reservations_file(path)
    bad = bytearray(data)
    struct.pack_into("<I", bad, starts[batch], 1 << 20)
    path.write_bytes(bytes(bad))
    with pytest.raises(PersistenceError, match=rf"{path}: .*byte offset {starts[batch]}"):
        OffsetReservations(str(path)).load()


def test_torn_last_batch_still_loads_with_raised_marks(tmp_path: Path) -> None:
    path = tmp_path / "x.offsets"
    data, starts = reservations_file(path)
    for cut in range(starts[-1] + 1, len(data)):
        path.write_bytes(data[:cut])
        marks = OffsetReservations(str(path)).load()
        assert all(marks[b"key-%d" % i] >= 2**30 for i in range(5))


def test_unreadable_offsets_file_refuses_naming_it(tmp_path: Path) -> None:
    (tmp_path / "dump.rcp.offsets").mkdir()
    with pytest.raises(PersistenceError, match=r"dump\.rcp\.offsets: cannot read"):
        loaded(tmp_path)


@pytest.mark.slow
def test_server_refuses_to_start_on_a_short_garbage_offsets_file(server_factory) -> None:
    srv = server_factory()
    tw(srv.client(), "s", "a")
    srv.kill9()
    path = srv.dir / "dump.rcp.offsets"
    path.write_bytes(b"garbage")
    with pytest.raises(RuntimeError) as refused:
        srv.start()
    assert srv.proc.returncode == 1
    assert f"{path}: not an rcp11 offsets file" in str(refused.value)


# ---------------------------------------------------------------------------
# The AOF
# ---------------------------------------------------------------------------


def aof_with(tmp_path: Path, *commands: list[bytes]) -> Path:
    state, persistence = loaded(tmp_path, appendonly="yes", appendfsync="always")
    persistence.shutdown("nosave")
    path = tmp_path / "appendonly.aof"
    with open(path, "ab") as file:
        for command in commands:
            file.write(encode_command(command))
    return path


@pytest.mark.parametrize(
    "args",
    [
        [b"s", b"%d" % 2**63 + b"1"],
        [b"s", b"%d" % (2**63 + 1)],
        [b"s", b"-5"],
        [b"s", b"12abc"],
        [b"s"],
        [b"s", b"10", b"extra"],
    ],
)
def test_bad_raise_next_record_names_file_and_offset(tmp_path: Path, args: list[bytes]) -> None:
    good = [b"TWRITE", b"s", b"a"]
    path = aof_with(tmp_path, good)
    at = path.stat().st_size
    with open(path, "ab") as file:
        file.write(encode_command([RAISE_NEXT, *args]))
    with pytest.raises(PersistenceError, match=rf"{path}: .*RCP11-RAISE-NEXT.*byte offset {at}"):
        loaded(tmp_path, appendonly="yes")


def test_good_raise_next_record_at_the_ceiling_loads(tmp_path: Path) -> None:
    aof_with(tmp_path, [b"TWRITE", b"s", b"a"], [RAISE_NEXT, b"s", b"%d" % 2**63])
    state, _ = loaded(tmp_path, appendonly="yes")
    assert state.keyspace.get(b"s").next_offset == 2**63


def test_unreadable_aof_refuses_naming_it(tmp_path: Path) -> None:
    (tmp_path / "appendonly.aof").mkdir()
    with pytest.raises(PersistenceError, match=r"appendonly\.aof: cannot read"):
        loaded(tmp_path, appendonly="yes")


def test_aof_command_that_fails_on_replay_names_file_and_offset(tmp_path: Path) -> None:
    path = aof_with(tmp_path, [b"SET", b"k", b"v"])
    at = path.stat().st_size
    with open(path, "ab") as file:
        file.write(encode_command([b"TWRITE", b"k", b"x"]))  # WRONGTYPE
    with pytest.raises(PersistenceError, match=rf"{path}: command 'TWRITE' at byte offset {at}"):
        loaded(tmp_path, appendonly="yes")


# ---------------------------------------------------------------------------
# The snapshot
# ---------------------------------------------------------------------------


def test_snapshot_with_a_key_twice_refuses(tmp_path: Path) -> None:
    """A key written twice cannot come from our writer: refuse instead of
    keeping whichever came last."""
    path = tmp_path / "dump.rcp"
    body = b"RCP11SNAP" + struct.pack("<HQ", 1, 0)
    record = b"S" + struct.pack("<I", 1) + b"k" + struct.pack("<Q", 1) + b"v"
    second_at = len(body) + len(record)
    body += record + record + b"E"
    path.write_bytes(body + struct.pack("<I", zlib.crc32(body)))
    with pytest.raises(PersistenceError, match=rf"{path}: .*twice.* byte offset {second_at}"):
        loaded(tmp_path)


def test_unreadable_snapshot_refuses_naming_it(tmp_path: Path) -> None:
    (tmp_path / "dump.rcp").mkdir()
    with pytest.raises(PersistenceError, match=r"dump\.rcp: cannot read"):
        loaded(tmp_path)


def test_every_loader_error_names_its_file(tmp_path: Path) -> None:
    """Whatever a run of random bytes in place of each file, the start
    either loads or fails with a PersistenceError naming that file."""
    rng = random.Random(11)
    for name, directives in (
        ("dump.rcp", {}),
        ("appendonly.aof", {"appendonly": "yes"}),
        ("dump.rcp.offsets", {}),
    ):
        for round_index in range(30):
            directory = tmp_path / f"{name}-{round_index}"
            directory.mkdir()
            garbage = rng.randbytes(rng.randrange(0, 200))
            if round_index % 3 == 0 and name == "appendonly.aof":
                garbage = encode_command([RAISE_NEXT, b"s", garbage[:8]])
            (directory / name).write_bytes(garbage)
            try:
                loaded(directory, **directives)
            except PersistenceError as exc:
                assert str(directory / name) in str(exc)


@pytest.mark.parametrize("length", [0, 1, 5, 9])
def test_offsets_file_cut_inside_its_header_still_reuses_no_offset(
    tmp_path: Path, length: int
) -> None:
    """A file cut inside its header holds no mark at all. That is what a
    crash while creating it leaves (no stream reserved anything yet), but
    a damaged file looks the same: every stream the other files bring back
    then goes up by the torn-file margin, as for a torn last batch."""
    state, persistence = loaded(tmp_path)
    from rcp11.commands import execute
    from rcp11.state import ClientState

    client = ClientState(authenticated=True)
    execute(state, client, [b"TWRITE", b"s", b"ENTRIES", *[b"m%d" % i for i in range(10)]])
    assert persistence.flush()
    assert persistence.save() == "OK"
    execute(state, client, [b"TWRITE", b"s", b"lost"])  # acknowledged at 10, never saved
    assert persistence.flush()
    path = tmp_path / "dump.rcp.offsets"
    path.write_bytes(path.read_bytes()[:length])
    again, _ = loaded(tmp_path)
    stream = again.keyspace.get(b"s")
    assert stream.read(0, 10) == [b"m%d" % i for i in range(10)]
    assert stream.next_offset >= 11 + 2**30 - 1
    # The raised mark is on disk: a second start agrees without a new raise.
    assert OffsetReservations(str(path)).load()[b"s"] >= stream.next_offset


# -------------------------------------------------- through a running server


@pytest.mark.slow
def test_torn_aof_tail_never_reuses_offsets(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes")
    c = srv.client()
    last = [tw(c, "s", f"m{i}") for i in range(50)][-1]
    srv.kill9()
    aof = srv.dir / "appendonly.aof"
    data = aof.read_bytes().rstrip(b"\0")
    aof.write_bytes(data[:-5])
    srv.start()
    c = srv.client()
    assert tw(c, "s", "new") > last
    assert tr(c, "s", last, 1) == [None]


@pytest.mark.slow
def test_corrupt_snapshot_refused_by_name(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    c = srv.client()
    tw(c, "s", *[b"x" * 50] * 2000)
    c.save()
    srv.stop()
    snap = srv.dir / "dump.rcp"
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0x40
    snap.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="dump.rcp"):
        srv.start(timeout=15)


@pytest.mark.slow
def test_corrupt_snapshot_refuses_start_naming_file(server_factory) -> None:
    srv = server_factory()
    client = srv.client()
    twrite_entries(client, "s", *[b"m%d" % i for i in range(500)])
    assert client.save()
    srv.stop()
    path = srv.dir / "dump.rcp"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError) as info:
        srv.start()
    assert srv.proc.returncode == 1
    assert str(path) in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("truncated", ["yes", "no"])
def test_torn_aof_tail(server_factory, truncated: str) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always", aof_load_truncated=truncated)
    client = srv.client()
    for index in range(200):
        twrite_entries(client, "s", b"message-%d" % index)
    srv.kill9()
    path = srv.dir / "appendonly.aof"
    data = path.read_bytes()
    rng = random.Random(truncated)
    cut = rng.randrange(len(data) // 2, len(data) - 1)
    while data[cut : cut + 1] == b"*" and data[cut - 2 : cut] == b"\r\n":
        cut -= 1  # make sure the cut really lands inside a command
    line = data.rfind(b"\n", 0, cut) + 1
    if data[line : line + 1] == b"#":
        # Inside an append-time annotation line: a torn one at the end is
        # read as one (redis-server reads a torn "#" line the same way) and
        # nothing is lost; cut the command before it instead.
        cut = line - 1
    path.write_bytes(data[:cut])
    if truncated == "no":
        with pytest.raises(RuntimeError) as info:
            srv.start()
        assert str(path) in str(info.value)
        return
    srv.start()
    client = srv.client()
    messages = read_all(client, "s")
    kept = messages[: messages.index(None)] if None in messages else messages
    assert 100 <= len(kept) < 200
    assert kept == [b"message-%d" % i for i in range(len(kept))]
    # The lost tail reads as null and its offsets are never handed out
    # again (docs/PROTOCOL.md section 8): the next offset is above all 200 replies.
    assert len(messages) >= 200
    assert all(message is None for message in messages[len(kept) :])
    assert twrite_entries(client, "s", b"after") >= 200
    srv.restart()
    assert read_all(srv.client(), "s")[-1] == b"after"


@pytest.mark.slow
def test_corrupt_snapshot_refuses_to_start(server_factory) -> None:
    srv = server_factory(start=False)
    (srv.dir / "dump.rcp").write_bytes(b"this is not a snapshot at all" * 10)
    srv.start(wait=False)
    assert srv.proc is not None
    assert srv.proc.wait(30) == 1
    assert "dump.rcp" in srv.output()


def _start_fails(srv: ServerProcess) -> str:
    """Run the server's own command line; it must refuse to start. Returns its log."""
    status, output = srv.run_to_exit()
    assert status != 0
    return output


@pytest.mark.slow
def test_truncated_snapshot_is_refused_by_name(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    cl = srv.client()
    tw(cl, "s", *[b"x" * 50] * 2000)
    cl.save()
    srv.stop()
    snap = srv.dir / "dump.rcp"
    snap.write_bytes(snap.read_bytes()[: snap.stat().st_size * 2 // 3])
    assert "dump.rcp" in _start_fails(srv)


def _aof_with_damage(server_factory: Any, damage: str, **directives: Any) -> ServerProcess:
    srv = server_factory(appendonly="yes", **directives)
    cl = srv.client()
    for i in range(50):
        tw(cl, "s", f"message-{i}")
    srv.kill9()
    aof = srv.dir / "appendonly.aof"
    data = bytearray(aof.read_bytes().rstrip(b"\0"))
    if damage == "middle":
        spot = data.index(b"message-20")
        data[spot - 5 : spot - 3] = b"zz"  # breaks a bulk length header
    else:
        data = data[:-5]
    aof.write_bytes(bytes(data))
    return srv


@pytest.mark.slow
def test_aof_corrupt_in_the_middle_is_refused_by_name(server_factory: Any) -> None:
    srv = _aof_with_damage(server_factory, "middle")
    assert "appendonly.aof" in _start_fails(srv)


@pytest.mark.slow
def test_aof_load_truncated_no_refuses_a_torn_tail(server_factory: Any) -> None:
    srv = _aof_with_damage(server_factory, "tail", aof_load_truncated="no")
    assert "appendonly.aof" in _start_fails(srv)
    srv.directives["aof-load-truncated"] = "yes"
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", 0, 49) == [f"message-{i}".encode() for i in range(49)]
    assert tw(cl, "s", "next") >= 50


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "snapshot"])
def test_truncated_offsets_file_is_reported_or_reuses_nothing(
    server_factory: Any, mode: str
) -> None:
    srv = server_factory(save="3600 1" if mode == "snapshot" else "")
    cl = srv.client()
    for i in range(10):
        tw(cl, "s", f"m{i}")
    if mode == "snapshot":
        cl.save()
        assert tw(cl, "s", "after") == 10
    srv.kill9()
    offsets = srv.dir / "dump.rcp.offsets"
    offsets.write_bytes(offsets.read_bytes()[:-1])  # a damaged tail, as a bad disk leaves
    try:
        srv.start(timeout=10)
    except RuntimeError as refused:
        assert "dump.rcp.offsets" in str(refused)
        return
    last = 10 if mode == "snapshot" else 9
    assert tw(srv.client(), "s", "x") > last
