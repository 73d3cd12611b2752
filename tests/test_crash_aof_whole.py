"""After a crash, a whole AOF means no gap; anything else means no offset
reused (docs/PROTOCOL.md section 8, docs/PERSISTENCE.md "when the AOF is
whole").

A kill -9 (any appendfsync) or a power loss under appendfsync always leaves
an AOF holding every acknowledged write: streams go on at their exact next
offset. Every AOF that cannot be told from one that lost acknowledged
writes -- cut at a command boundary or inside a command, emptied, replaced
by another file of the same length, older than the offsets file, written
before a reboot under everysec or no, left stale while the AOF was off --
raises each stream to its reservation mark: a gap, never a reused offset."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import ServerProcess, wait_for
from helpers_crash import (
    as_if_rebooted,
    assert_offsets_not_reused,
    command_boundaries,
    crash_rounds,
    null_offsets,
    preamble_end,
    read_slot,
)

pytestmark = pytest.mark.slow  # every test starts servers and kills them

Acked = dict[tuple[bytes, int], bytes]


def write_some(client: redis.Redis, acked: Acked, count: int, tag: str = "m") -> None:
    """count TWRITEs on two streams (and a string), remembered in acked."""
    for index in range(count):
        for key in (b"s", b"t"):
            payload = b"%s-%s%d" % (key, tag.encode(), index)
            acked[(key, client.execute_command("TWRITE", key, payload))] = payload
    client.set("str", tag)


def assert_no_gap(client: redis.Redis, acked: Acked) -> None:
    """Every acknowledged write is there and each stream goes on right after
    its last message: no null anywhere."""
    assert_offsets_not_reused(client, acked, lost_ok=False)
    for key in {key for key, _ in acked}:
        assert null_offsets(client, key) == 0, f"{key!r}: a gap after the restart"


def assert_raised(client: redis.Redis, acked: Acked) -> None:
    """Offsets went up to the reservation marks: nothing acknowledged is
    handed out again, lost messages read as null."""
    assert_offsets_not_reused(client, acked, lost_ok=True)


def aof(srv: ServerProcess) -> Path:
    return srv.dir / "appendonly.aof"


# ------------------------------------------------------------ no gap at all


@pytest.mark.parametrize("fsync", ["always", "everysec", "no"])
def test_kill9_with_a_whole_aof_leaves_no_gap(server_factory: Any, fsync: str) -> None:
    """The reported case: 5 writes, kill -9, restart: the next TWRITE gets 5
    (1025 before), in every appendfsync mode; a second kill -9 right after
    the restart (nothing written since) too."""
    srv = server_factory(appendonly="yes", appendfsync=fsync)
    client = srv.client()
    assert [client.execute_command("TWRITE", "s", b"m%d" % i) for i in range(5)] == [0, 1, 2, 3, 4]
    srv.kill9()
    srv.start()
    srv.kill9()
    srv.start()
    client = srv.client()
    assert client.execute_command("TWRITE", "s", "next") == 5
    assert client.execute_command("TREAD", "s", 0, 10) == [
        b"m0",
        b"m1",
        b"m2",
        b"m3",
        b"m4",
        b"next",
    ]
    assert "streams go on at their next offsets" in srv.log()


# CI's rounds; for longer, bench/soak.py kills the server with kill -9 for
# as long as it is asked to.
@pytest.mark.parametrize(("fsync", "rounds"), [("always", 8), ("everysec", 4), ("no", 4)])
def test_kill9_under_load_leaves_no_gap_round_after_round(
    server_factory: Any, fsync: str, rounds: int
) -> None:
    """Writers on three connections (pipelines, multi-entry TWRITEs, a
    shared stream), kill -9 at a random moment, restart, again: nothing
    acknowledged is lost and not a single offset reads as null."""
    srv = server_factory(appendonly="yes", appendfsync=fsync)
    total = crash_rounds(srv, seed=len(fsync), check=assert_no_gap, rounds=rounds)
    assert total > 0


def test_kill9_after_an_aof_rewrite_leaves_no_gap(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 30)
    rewrite_and_wait(client)
    srv.kill9()  # right after the swap: the slot names the new file
    srv.start()
    client = srv.client()
    assert_no_gap(client, acked)
    write_some(client, acked, 30, "after")
    srv.kill9()
    srv.start()
    assert_no_gap(srv.client(), acked)


def rewrite_and_wait(client: redis.Redis) -> None:
    done = client.info("persistence")["aof_rewrites"]
    client.bgrewriteaof()
    wait_for(lambda: client.info("persistence")["aof_rewrites"] > done)


def test_a_command_half_written_by_the_kill_leaves_no_gap(server_factory: Any) -> None:
    """A kill -9 in the middle of a large AOF write leaves part of a command
    after what the server had finished writing: never acknowledged, it is
    cut off and the rest is whole."""
    srv = server_factory(appendonly="yes", appendfsync="no")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 20)
    srv.kill9()
    with open(aof(srv), "ab") as file:
        file.write(b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$100000\r\n" + b"x" * 3000)
    srv.start()
    assert_no_gap(srv.client(), acked)


def test_power_loss_under_always_leaves_no_gap(server_factory: Any) -> None:
    """appendfsync always fsyncs every write before its reply: after a
    reboot the AOF is still trusted, even when the disk kept an older AOF
    slot than the last one written (the slot itself is not fsynced)."""
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 20)
    older_slot = read_slot(srv.dir)
    write_some(client, acked, 20, "later")
    srv.kill9()
    as_if_rebooted(srv.dir, older_slot)
    srv.start()
    assert_no_gap(srv.client(), acked)
    srv.kill9()
    as_if_rebooted(srv.dir)
    srv.start()
    assert_no_gap(srv.client(), acked)


# ------------------------------------------------- a gap, never a reused offset


@pytest.mark.parametrize("fsync", ["everysec", "no"])
def test_reboot_without_always_raises_to_the_marks(server_factory: Any, fsync: str) -> None:
    """After a reboot an everysec or no AOF may have lost its unsynced tail
    at a command boundary, which nothing in it shows: the marks apply."""
    srv = server_factory(appendonly="yes", appendfsync=fsync)
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 20)
    srv.kill9()
    data = aof(srv).read_bytes()
    boundaries = command_boundaries(data, preamble_end(aof(srv)))
    aof(srv).write_bytes(data[: boundaries[len(boundaries) // 2]])  # the lost tail
    as_if_rebooted(srv.dir)
    srv.start()
    client = srv.client()
    assert_raised(client, acked)
    assert null_offsets(client, b"s") > 0
    assert "may lack acknowledged writes" in srv.log()


@pytest.mark.parametrize("fsync", ["always", "everysec", "no"])
@pytest.mark.parametrize(
    "cut", ["last-command", "first-half", "mid-command", "one-byte", "empty", "to-preamble"]
)
def test_a_cut_aof_never_reuses_offsets(server_factory: Any, fsync: str, cut: str) -> None:
    """The AOF loses its end after a kill -9 (a copied or restored file, a
    disk that dropped writes): at a command boundary it loads without any
    sign of damage; the offsets file knows how long it was."""
    srv = server_factory(appendonly="yes", appendfsync=fsync)
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 10)
    if cut == "to-preamble":
        rewrite_and_wait(client)
    write_some(client, acked, 20, "late")
    srv.kill9()
    path = aof(srv)
    data = path.read_bytes()
    start = preamble_end(path)
    boundaries = command_boundaries(data, start)
    length = {
        "last-command": boundaries[-1],
        "first-half": boundaries[len(boundaries) // 2],
        "mid-command": boundaries[-1] + 7,
        "one-byte": len(data) - 1,
        "empty": 0,
        "to-preamble": start,
    }[cut]
    path.write_bytes(data[:length])
    srv.start()
    client = srv.client()
    assert_raised(client, acked)
    # Logged with the raise: a second crash replays onto the same offsets.
    srv.kill9()
    srv.start()
    assert_raised(srv.client(), acked)


@pytest.mark.parametrize("fsync", ["always", "everysec"])
@pytest.mark.parametrize("how", ["pipelined", "transaction"])
def test_writes_just_before_a_rewrite_starts_are_vouched_for(
    server_factory: Any, fsync: str, how: str
) -> None:
    """BGREWRITEAOF writes the AOF buffer out before it forks: the TWRITEs
    sent just before it in the same pipeline (or transaction) are
    acknowledged with it, so the offsets file must know the AOF holds them
    (and `always` must have fsynced them). It did not: cut back to just
    before them, the AOF passed for whole and their offsets were handed out
    again. (hz 1: the cron, which fixed the offsets file up later, does not
    run before the kill.)"""
    srv = server_factory(appendonly="yes", appendfsync=fsync, hz="1")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 5)
    pipe = client.pipeline(transaction=how == "transaction")
    for index in range(3):
        pipe.execute_command("TWRITE", "s", b"just-before-%d" % index)
    pipe.bgrewriteaof()
    replies = pipe.execute()
    for index, offset in enumerate(replies[:3]):
        acked[(b"s", offset)] = b"just-before-%d" % index
    srv.kill9()
    path = aof(srv)
    data = path.read_bytes()
    # The AOF loses the last of them (a disk that dropped the write).
    last = data.rindex(b"just-before-2")
    path.write_bytes(data[: data.rindex(b"*3\r\n$6\r\nTWRITE\r\n", 0, last)])
    srv.start()
    assert_raised(srv.client(), acked)


def comment_lines(size: int) -> bytes:
    """size bytes of '#' lines, which the loader skips (size >= 3)."""
    lines = b"".join(b"#" + b"p" * 47 + b"\r\n" for _ in range(size // 50 - 1))
    return lines + b"#" + b"q" * (size - len(lines) - 3) + b"\r\n"


@pytest.mark.parametrize(
    "how", ["same-length-edit", "padded-to-length", "another-aof", "new-inode-copy"]
)
def test_an_aof_replaced_by_another_file_never_reuses_offsets(
    server_factory: Any, tmp_path: Path, how: str
) -> None:
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 10)
    early = aof(srv).read_bytes()
    write_some(client, acked, 10, "late")
    srv.kill9()
    path = aof(srv)
    data = path.read_bytes()
    if how == "same-length-edit":
        # The last write of "s" becomes a SET of as many bytes, in place.
        at = data.rindex(b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n")
        value = data[at + 23 :]
        forged = b"*3\r\n$3\r\nSET\r\n$4\r\nelse\r\n" + value
        assert len(forged) == len(data) - at
        with open(path, "r+b") as file:
            file.seek(at)
            file.write(forged)
    elif how == "padded-to-length":
        # Cut at a command boundary, then comment lines (which the loader
        # skips) up to the length the file had.
        path.write_bytes(early + comment_lines(len(data) - len(early)))
        assert path.stat().st_size == len(data)
    elif how == "another-aof":
        # The AOF of another server with fewer writes, made as long.
        other = ServerProcess(tmp_path / "other", appendonly="yes").start()
        other_client = other.client()
        for index in range(5):
            other_client.execute_command("TWRITE", "s", b"o%d" % index)
        other.stop()
        theirs = (other.dir / "appendonly.aof").read_bytes()
        assert len(theirs) < len(data)
        path.write_bytes(theirs + comment_lines(len(data) - len(theirs)))
    else:
        # The same bytes in a new file (a restore from a backup): trusting
        # it would be right, but nothing says it is what the server wrote.
        copy = srv.dir / "copy.aof"
        shutil.copyfile(path, copy)
        os.replace(copy, path)
    srv.start()
    client = srv.client()
    if how == "another-aof":
        # Its messages are what that file holds; their offsets still stay
        # below every offset handed out here.
        for key in (b"s", b"t"):
            highest = max(offset for k, offset in acked if k == key)
            assert client.execute_command("TWRITE", key, "after") > highest
    else:
        assert_raised(client, acked)


def test_an_offsets_file_older_than_the_aof_reuses_nothing(server_factory: Any) -> None:
    """An older offsets file (restored from a copy) vouches for a shorter AOF
    than the one found: the AOF only grew, so it is whole."""
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 10)
    saved = (srv.dir / "dump.rcp.offsets").read_bytes()
    write_some(client, acked, 10, "late")
    client.execute_command("TWRITE", "new-stream", "n")  # reserved after the copy
    acked[(b"new-stream", 0)] = b"n"
    srv.kill9()
    (srv.dir / "dump.rcp.offsets").write_bytes(saved)
    srv.start()
    assert_no_gap(srv.client(), acked)


@pytest.mark.parametrize("how", ["copied-over", "renamed-over"])
def test_an_aof_older_than_the_offsets_file_reuses_nothing(server_factory: Any, how: str) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 10)
    backup = srv.dir.parent / "backup.aof"
    shutil.copyfile(aof(srv), backup)
    write_some(client, acked, 10, "late")
    srv.kill9()
    if how == "copied-over":
        shutil.copyfile(backup, aof(srv))  # same inode, older bytes
    else:
        os.replace(backup, aof(srv))
    srv.start()
    client = srv.client()
    assert_raised(client, acked)
    assert null_offsets(client, b"s") > 0


def test_a_damaged_aof_slot_is_no_slot(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 10)
    srv.kill9()
    data = aof(srv).read_bytes()
    aof(srv).write_bytes(data[: command_boundaries(data, preamble_end(aof(srv)))[-3]])
    with open(srv.dir / "dump.rcp.offsets", "r+b") as file:
        file.seek(10 + 32)  # the recorded length, inside the slot's CRC
        file.write(b"\0\0\0\0\0\0\0\0")
    srv.start()
    assert_raised(srv.client(), acked)


def test_leaving_always_takes_the_reboot_trust_back(server_factory: Any) -> None:
    """CONFIG SET appendfsync everysec: writes acknowledged afterwards may be
    lost by a power loss, so an AOF written under `always` until then is no
    longer whole after a reboot."""
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 10)
    always_slot = read_slot(srv.dir)
    assert always_slot.synced
    before = aof(srv).stat().st_size
    assert client.config_set("appendfsync", "everysec")
    write_some(client, acked, 10, "everysec")
    assert not read_slot(srv.dir).synced
    srv.kill9()
    # The power loss: the unsynced writes are gone, and so is every slot
    # written since the switch but the one fsynced with it.
    with open(aof(srv), "r+b") as file:
        file.truncate(before)
    as_if_rebooted(srv.dir)
    srv.start()
    assert_raised(srv.client(), acked)


@pytest.mark.parametrize("how", ["config-set", "restart-without-aof"])
def test_an_aof_left_stale_while_off_is_not_whole(server_factory: Any, how: str) -> None:
    """Writes made while the AOF was off are not in it: a later start with
    appendonly yes finds the old file, exactly as the server left it."""
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    acked: Acked = {}
    write_some(client, acked, 10)
    if how == "config-set":
        assert client.config_set("appendonly", "no")
    else:
        srv.stop()
        srv.directives["appendonly"] = "no"
        srv.start()
        client = srv.client()
    write_some(client, acked, 10, "off")
    srv.kill9()
    srv.directives["appendonly"] = "yes"
    srv.start()
    assert_raised(srv.client(), acked)


def test_random_cuts_after_random_kills_never_reuse_offsets(server_factory: Any) -> None:
    """Writers under load, kill -9, then the AOF cut at a random length
    (boundary or not) or left whole, round after round."""
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    rng = random.Random(2311)

    def check(client: redis.Redis, acked: Acked) -> None:
        assert_offsets_not_reused(client, acked, lost_ok=True)

    acked_all: Acked = {}
    for round_index in range(4):
        crash_rounds(srv, seed=round_index, check=lambda c, a: acked_all.update(a), rounds=1)
        srv.kill9()
        data = aof(srv).read_bytes()
        start = preamble_end(aof(srv))
        if rng.random() < 0.75 and len(data) > start:
            aof(srv).write_bytes(data[: rng.randrange(start, len(data))])
        srv.start()
        check(srv.client(), acked_all)
