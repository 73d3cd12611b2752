"""kill -9 at random moments while writers run: no acknowledged write is
lost with the AOF on (every appendfsync mode), and no offset is ever handed
out twice in any mode (docs/PROTOCOL.md section 8, "No offset is ever reused")."""

from __future__ import annotations

import random
import time

import pytest
import redis
from conftest import wait_for
from helpers_crash import (
    ROUNDS,
    Writers,
    assert_offsets_not_reused,
    command_boundaries,
    crash_rounds,
    preamble_end,
)

# Every test here starts servers and kills them with kill -9.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fsync", ["always", "everysec", "no"])
def test_kill9_loses_no_acknowledged_write_with_aof(server_factory, fsync: str) -> None:
    srv = server_factory(appendonly="yes", appendfsync=fsync)
    total = crash_rounds(
        srv,
        seed=hash(fsync) % 1000,
        check=lambda client, acked: assert_offsets_not_reused(client, acked, lost_ok=False),
    )
    assert total > 0


def test_kill9_during_aof_rewrite_loses_nothing(server_factory) -> None:
    srv = server_factory(
        appendonly="yes",
        appendfsync="everysec",
        auto_aof_rewrite_min_size="64kb",
        auto_aof_rewrite_percentage="10",
    )
    total = crash_rounds(
        srv,
        seed=77,
        check=lambda client, acked: assert_offsets_not_reused(client, acked, lost_ok=False),
    )
    assert total > 0
    assert srv.client().info("persistence")["aof_enabled"] == 1


@pytest.mark.parametrize("save", ["1 1", ""])
def test_offsets_never_reused_without_aof(server_factory, save: str) -> None:
    """Snapshot only (or no persistence at all): writes since the last
    snapshot are lost in a crash, but their offsets are not handed out
    again and they read as null."""
    srv = server_factory(appendonly="no", start=False)
    if save:
        # A config file line, the way most users set save rules.
        conf = srv.dir / "rcp11.conf"
        conf.write_text(f"save {save}\n")
        srv.conf = conf
        del srv.directives["save"]
    srv.start()
    saved: dict[tuple[bytes, int], bytes] = {}
    if save:
        client = srv.client()
        for index in range(50):
            payload = b"saved-%d" % index
            saved[(b"shared", client.execute_command("TWRITE", "shared", payload))] = payload
        # The save rule fires within about a second.
        wait_for(lambda: client.info("persistence")["rdb_changes_since_last_save"] == 0, 20)

    def check(client: redis.Redis, acked: dict) -> None:
        assert_offsets_not_reused(client, acked, lost_ok=True)
        for (key, offset), payload in saved.items():
            # Written before a completed snapshot: never lost.
            assert client.execute_command("TREAD", key, offset, 1) == [payload]

    total = crash_rounds(srv, seed=5 if save else 6, check=check)
    assert total > 0


# A large TWRITE of which a crash left the first 5,000 of 100,000 bytes.
TORN_WRITE = b"*3\r\n$6\r\nTWRITE\r\n$6\r\nshared\r\n$100000\r\n" + b"x" * 5000


def test_power_loss_with_everysec_never_reuses_offsets(server_factory) -> None:
    """A machine crash may cut the unsynced tail of an everysec AOF. Writes
    in it are lost (they read as null), but their offsets are not handed
    out again: the reservation marks always apply at start-up."""
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    rng = random.Random(42)
    acked: dict[tuple[bytes, int], bytes] = {}
    for round_index in range(ROUNDS):
        writers = Writers(srv.port, 900 + round_index)
        writers.start()
        wait_for(lambda w=writers: w.acked)
        time.sleep(rng.uniform(0.5, 1.0))
        srv.kill9()
        writers.join()
        acked.update(writers.acked)
        # The power loss: the AOF loses a random part of its tail, at a
        # command boundary (the kill -9 may already have torn the last
        # command: no boundary there), and the write it was in the middle
        # of stays half there. The preamble was fsynced: it stays.
        path = srv.dir / "appendonly.aof"
        data = path.read_bytes()
        start = preamble_end(path)
        boundaries = command_boundaries(data, start)
        cut = (
            boundaries[rng.randrange(len(boundaries) // 2, len(boundaries))]
            if boundaries
            else start
        )
        path.write_bytes(data[:cut] + TORN_WRITE)
        srv.start()
        assert_offsets_not_reused(srv.client(), acked, lost_ok=True)


@pytest.mark.parametrize("cut", ["boundary", "empty"])
def test_aof_cut_at_a_command_boundary_never_reuses_offsets(server_factory, cut: str) -> None:
    """An AOF that lost its tail exactly at a command boundary (or all of
    its commands) loads without complaint: nothing in it says that writes
    are missing. The reservation marks must still decide the next offsets,
    on the same boot as much as after a reboot."""
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    acked: dict[tuple[bytes, int], bytes] = {}
    for index in range(60):
        for key in (b"s", b"t"):
            payload = b"%s-%d" % (key, index)
            acked[(key, client.execute_command("TWRITE", key, payload))] = payload
    srv.kill9()
    path = srv.dir / "appendonly.aof"
    data = path.read_bytes()
    start = preamble_end(path)
    if cut == "empty":
        path.write_bytes(b"")
    else:
        boundaries = command_boundaries(data, start)
        path.write_bytes(data[: boundaries[len(boundaries) // 2]])
    srv.start()
    client = srv.client()
    assert_offsets_not_reused(client, acked, lost_ok=True)
    # And again after a second crash: the raise itself was logged.
    srv.kill9()
    srv.start()
    assert_offsets_not_reused(srv.client(), acked, lost_ok=True)


def test_clean_shutdown_and_kill9_with_a_whole_aof_leave_no_gap(server_factory) -> None:
    """Marks are written tight by SHUTDOWN, and after a kill -9 the offsets
    file's AOF slot vouches for the AOF: either way a stream goes on at its
    exact next offset."""
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    client = srv.client()
    assert client.execute_command("TWRITE", "s", "ENTRIES", "a", "b") == 0
    srv.stop()
    srv.start()
    client = srv.client()
    assert client.execute_command("TWRITE", "s", "c") == 2
    srv.kill9()
    srv.start()
    client = srv.client()
    assert client.execute_command("TWRITE", "s", "d") == 3
    assert client.execute_command("TREAD", "s", 0, 10) == [b"a", b"b", b"c", b"d"]


@pytest.mark.parametrize("how", ["del", "flushall", "rename-over", "set-over"])
def test_a_stream_removed_just_before_kill9_stays_removed(server_factory, how: str) -> None:
    """Marks of removed streams are kept until the removal is durable (an
    older file could bring the stream back), but a kill -9 right after the
    removal must not resurrect the key, even as an empty stream."""
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    client = srv.client()
    for index in range(5):
        client.execute_command("TWRITE", "s", b"m%d" % index)
    client.execute_command("TWRITE", "other", "o")
    if how == "del":
        assert client.delete("s") == 1
    elif how == "flushall":
        assert client.flushall()
    elif how == "rename-over":
        client.set("str", "v")
        assert client.rename("str", "s")
    else:
        assert client.set("s", "now a string")
    srv.kill9()
    srv.start()
    client = srv.client()
    if how in ("rename-over", "set-over"):
        assert client.type("s") == b"string"
    else:
        assert client.exists("s") == 0
        assert client.execute_command("TWRITE", "s", "new") == 0
    assert client.exists("other") == int(how != "flushall")
