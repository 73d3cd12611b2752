"""No offset is handed out twice by the module on one node: after kill -9,
after an AOF that lost its tail as a power loss loses it, after a crash
with snapshots only; a clean restart leaves no gap; the offsets file is
checked, locked and kept by the module (module_reserve.c, docs/MODULE.md
"Durability")."""

from __future__ import annotations

import contextlib
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, fill, tr, tw, wait_for
from helpers_module import Ledger, messages, wait_rewrite_done

OFFSETS_FILE = "rcp11-offsets.dat"


def incr_aof(srv: RedisModuleServer) -> Path:
    """The AOF file the server appends to (the manifest's last incr file)."""
    manifest = next((srv.dir / "appendonlydir").glob("*.manifest")).read_text()
    names = [line.split()[1] for line in manifest.splitlines() if " type i" in line]
    return srv.dir / "appendonlydir" / names[-1]


def cut(path: Path, keep: int) -> None:
    with path.open("r+b") as file:
        file.truncate(keep)


@pytest.mark.slow
def test_lost_aof_tail_never_hands_an_offset_out_twice(module_factory: Any) -> None:
    # appendfsync everysec: a power loss loses what was written since the
    # last fsync. kill -9 then cutting the AOF plays it; the rounds pile
    # up (each restart continues from the cut file).
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="everysec")
    rng = random.Random(18)
    ledger = Ledger()
    lost = 0
    for round_ in range(5):
        client = srv.client()
        aof = incr_aof(srv)
        start = aof.stat().st_size
        # An old stream, and one created in this round (lost altogether
        # when the cut falls before its first write).
        for batch in range(8):
            ledger.write(client, b"old", messages(f"r{round_}b{batch}", 300))
            ledger.write(client, b"new%d" % round_, messages(f"r{round_}b{batch}", 50))
        client.close()
        srv.kill9()
        end = aof.stat().st_size
        cut(aof, start + rng.randrange(0, (end - start) // 2))  # mid-command too
        srv.start()
        client = srv.client()
        lost += ledger.check_stored(client)
        client.close()
    assert lost > 5_000  # the cuts did lose acknowledged writes...
    assert ledger.reused == []  # ...and no offset was handed out again
    client = srv.client()
    # A stream whose creation was lost comes back at its mark when written.
    ledger.write(client, b"new0", [b"after"])
    assert ledger.reused == []
    client.close()


@pytest.mark.slow
def test_snapshots_only_crash_never_hands_an_offset_out_twice(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(save="")
    ledger = Ledger()
    for round_ in range(3):
        client = srv.client()
        ledger.write(client, b"s", messages(f"a{round_}", 500))
        client.save()
        ledger.write(client, b"s", messages(f"b{round_}", 500))  # lost by the crash
        ledger.write(client, b"fresh%d" % round_, messages(f"c{round_}", 10))  # never saved
        client.close()
        srv.kill9()
        srv.start()
        client = srv.client()
        assert ledger.check_stored(client) >= 500
        assert not client.exists(b"fresh%d" % round_)  # lost, and not brought back empty
        client.close()
    client = srv.client()
    for round_ in range(3):
        ledger.write(client, b"fresh%d" % round_, [b"again"])
    ledger.write(client, b"s", [b"again"])
    assert ledger.reused == []
    client.close()


def test_kill9_with_everything_on_disk_continues_past_every_offset(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    ledger = Ledger()
    ledger.write(client, b"s", messages("x", 100))
    client.close()
    srv.kill9()
    srv.start()
    client = srv.client()
    assert ledger.check_stored(client) == 0
    after = tw(client, "s", "after")
    # The crash leaves a gap of nulls up to the stream's reservation mark.
    assert after > 99
    assert tr(client, "s", 100, after - 99) == [None] * (after - 100) + [b"after"]
    client.close()


def test_clean_shutdown_leaves_no_gap(module_factory: Any) -> None:
    for directives in ({"appendonly": "yes"}, {"save": "60 1"}, {"save": ""}):
        srv: RedisModuleServer = module_factory(**directives)
        client = srv.client()
        tw(client, "s", *messages("x", 2000))
        tw(client, "t", "only")
        client.close()
        srv.stop()  # SHUTDOWN
        srv.start()
        client = srv.client()
        if directives.get("save") == "":
            # No persistence at all: the streams are gone, and come back
            # where they were when written again.
            assert client.exists("s") == 0
        assert tw(client, "s", "next") == 2000, directives
        assert tw(client, "t", "next") == 1, directives
        client.close()


def test_a_stream_deleted_before_a_crash_starts_over(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    tw(client, "gone", *messages("x", 10))
    tw(client, "kept", *messages("x", 10))
    client.delete("gone")
    client.close()
    srv.kill9()
    srv.start()
    client = srv.client()
    assert client.exists("gone") == 0
    assert tw(client, "gone", "new") == 0  # DEL resets a stream, even across a crash
    assert tw(client, "kept", "new") >= 10
    client.close()


def test_clients_cannot_send_reservations(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory()
    client = srv.client()
    with pytest.raises(redis.ResponseError, match="RCP11.RESERVE is internal"):
        client.execute_command("RCP11.RESERVE", "s", 100)
    with client.pipeline(transaction=True) as pipe:
        pipe.execute_command("RCP11.RESERVE", "s", 100)
        with pytest.raises(redis.ResponseError, match="is internal"):
            pipe.execute()
    with pytest.raises(redis.ResponseError, match="is internal"):
        client.eval("return redis.call('RCP11.RESERVE', 's', '100')", 0)
    assert client.exists("s") == 0
    client.close()


def write_offsets_file(srv: RedisModuleServer, data: bytes) -> None:
    (srv.dir / OFFSETS_FILE).write_bytes(data)


def test_damaged_offsets_file_stops_the_start_with_the_reason(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes")
    client = srv.client()
    for key in ("a", "b", "c"):
        tw(client, key, "x")
    client.close()
    srv.kill9()
    path = srv.dir / OFFSETS_FILE
    data = bytearray(path.read_bytes())
    assert data[:8] == b"RCP11OFF"
    # Damage the first batch, with more batches after it: refused.
    data[16 + 9] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError):
        srv.start(timeout=10)
    assert "damaged batch at byte 16, with more after it" in srv.output()
    # Moved away, the server starts (the marks in the AOF stand in).
    path.rename(srv.dir / "offsets.damaged")
    srv.start()
    client = srv.client()
    assert tw(client, "a", "y") >= 1
    client.close()


def test_a_torn_offsets_file_raises_every_mark(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes")
    client = srv.client()
    tw(client, "a", "x")
    tw(client, "b", "x")
    client.close()
    srv.kill9()
    path = srv.dir / OFFSETS_FILE
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # the last batch cut short
    srv.start()
    assert "the last batch is cut short" in srv.output()
    client = srv.client()
    assert tw(client, "a", "y") >= 1 << 30  # the margin: no record it held is trusted short
    client.close()


def test_a_second_server_cannot_share_the_offsets_file(module_factory: Any) -> None:
    first: RedisModuleServer = module_factory()
    second: RedisModuleServer = module_factory(start=False)
    second.directives["dir"] = str(first.dir)  # the same data directory
    with pytest.raises(RuntimeError):
        second.start(timeout=10)
    assert "is in use by another server" in second.output()
    first.client().ping()


def test_a_clean_shutdown_after_a_crash_keeps_what_the_crash_owes(module_factory: Any) -> None:
    # A crash lost acknowledged writes; the server restarts, nobody writes
    # the stream, then shuts down cleanly: the restart after that must still
    # continue past every offset handed out before the crash.
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="everysec")
    ledger = Ledger()
    client = srv.client()
    aof = incr_aof(srv)
    start = aof.stat().st_size
    ledger.write(client, b"s", messages("x", 1000))
    client.close()
    srv.kill9()
    cut(aof, start + (aof.stat().st_size - start) // 2)
    srv.start()
    srv.stop()  # clean, without a write in between
    srv.start()
    client = srv.client()
    assert ledger.check_stored(client) > 0
    ledger.write(client, b"s", [b"after"])
    assert ledger.reused == []
    client.close()


def test_a_full_disk_refuses_new_reservations_and_loses_nothing(
    small_fs: Path, module_factory: Any
) -> None:
    srv: RedisModuleServer = module_factory(dir=small_fs, logfile=small_fs.parent / "redis.log")
    client = srv.client()
    ledger = Ledger()
    ledger.write(client, b"old", messages("a", 10))
    filler = fill(small_fs)
    # Each new stream needs a reservation in the file; once the file's last
    # block is full too, one is refused and nothing of it is written.
    refused = None
    for n in range(10_000):
        try:
            ledger.write(client, b"new%d" % n, [b"x"])
        except redis.ResponseError as exc:
            assert "MISCONF rcp11 cannot reserve offsets: cannot write" in str(exc), exc
            refused = b"new%d" % n
            break
    assert refused is not None and client.exists(refused) == 0
    # The old stream still has room in its reservation.
    ledger.write(client, b"old", messages("b", 10))
    filler.unlink()
    ledger.write(client, refused, messages("c", 10))
    assert ledger.check_stored(client) == 0
    client.close()
    srv.kill9()  # no persistence: every message is lost, and no offset reused
    srv.start()
    client = srv.client()
    ledger.write(client, refused, [b"after"])
    ledger.write(client, b"old", [b"after"])
    assert ledger.reused == []
    client.close()


def test_swapdb_moves_the_marks_with_the_streams(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    ledger = Ledger()
    ledger.write(client, b"s", messages("x", 100))
    client.swapdb(0, 1)
    client.close()
    srv.kill9()
    srv.start()
    moved = srv.client(db=1)
    ledger.write(moved, b"s", [b"after"])  # the stream, now in db 1: past its offsets
    assert ledger.reused == []
    fresh = srv.client(db=0)
    assert tw(fresh, "s", "new") == 0  # db 0 holds no stream s: a new one starts at 0
    moved.close()
    fresh.close()


@pytest.mark.parametrize("how", ["RENAME", "MOVE", "RESTORE", "RESTORE REPLACE"])
def test_a_stream_moved_to_another_key_reserves_there_before_a_crash(
    module_factory: Any, how: str
) -> None:
    # The offsets file knows marks by key: a stream that arrives at a key by
    # RENAME, MOVE or RESTORE carries a mark reserved under another name (or
    # none), so its first writes there must reserve under the new name, or a
    # crash that loses the move (snapshots only here) hands them out again.
    srv: RedisModuleServer = module_factory(save="")
    client = srv.client()
    ledger = Ledger()
    ledger.write(client, b"src", messages("a", 10))
    client.save()  # the snapshot holds src only
    moved_client, moved_key = client, b"dst"
    if how == "RENAME":
        client.rename("src", "dst")
    elif how == "MOVE":
        client.move("src", 1)
        moved_client, moved_key = srv.client(db=1), b"src"
    elif how == "RESTORE":
        client.restore("dst", 0, client.dump("src"))
    else:
        tw(client, "dst", "replaced")
        client.restore("dst", 0, client.dump("src"), replace=True)
    ledger.write(moved_client, moved_key, messages("b", 10))  # offsets 10-19
    srv.kill9()
    srv.start()
    client = srv.client(db=1 if how == "MOVE" else 0)
    ledger.write(client, moved_key, messages("c", 30))
    assert ledger.reused == []
    client.close()


@pytest.mark.parametrize("files", ["aof-rewrite", "rdb"])
def test_without_the_offsets_file_the_saved_marks_stand_in(module_factory: Any, files: str) -> None:
    # The RDB value and a rewritten AOF carry each stream's mark: a crash
    # that also lost the offsets file still continues past it.
    if files == "rdb":
        srv: RedisModuleServer = module_factory()
    else:
        srv = module_factory(appendonly="yes", aof_use_rdb_preamble="no")
    client = srv.client()
    ledger = Ledger()
    ledger.write(client, b"s", messages("x", 10))
    if files == "rdb":
        client.save()
    else:
        client.bgrewriteaof()
        wait_rewrite_done(client)
        base = next((srv.dir / "appendonlydir").glob("*.base.aof")).read_bytes()
        assert b"RCP11.RESERVE" in base
    client.close()
    srv.kill9()
    (srv.dir / OFFSETS_FILE).unlink()
    srv.start()
    client = srv.client()
    assert ledger.check_stored(client) == 0
    # At the mark: the first write reserved its offset and 1024 ahead.
    assert tw(client, "s", "after") == 1 + 1024
    client.close()


def test_an_offsets_file_deleted_under_a_running_server_is_written_again(
    module_factory: Any,
) -> None:
    # An operator's rm: the marks would live on only in an unlinked file
    # that no restart finds. The server writes the file at its path again
    # (within a tenth of a second, or at the next reservation).
    srv: RedisModuleServer = module_factory(save="")
    client = srv.client()
    ledger = Ledger()
    ledger.write(client, b"s", messages("a", 10))
    client.save()
    path = srv.dir / OFFSETS_FILE
    path.unlink()
    wait_for(path.exists)
    ledger.write(client, b"s", messages("b", 3000))  # reservations past the snapshot's mark
    path.unlink()
    ledger.write(client, b"t", messages("b", 10))  # a new stream: reserves at once
    assert "was deleted, replaced or its dir changed" in srv.log()
    srv.kill9()
    srv.start()
    client = srv.client()
    ledger.write(client, b"s", messages("c", 3000))
    ledger.write(client, b"t", messages("c", 10))
    assert ledger.reused == []
    client.close()


def test_a_dir_changed_to_another_servers_dir_leaves_its_offsets_file_alone(
    module_factory: Any,
) -> None:
    first: RedisModuleServer = module_factory(save="", enable_protected_configs="yes")
    second: RedisModuleServer = module_factory(save="")
    theirs = second.client()
    tw(theirs, "s", *messages("b", 10))
    their_file = (second.dir / OFFSETS_FILE).read_bytes()
    client = first.client()
    tw(client, "s", *messages("a", 10))
    client.config_set("dir", str(second.dir))
    with pytest.raises(redis.ResponseError, match="MISCONF .*Device or resource busy"):
        tw(client, "new", "x")
    assert "is in use by another server" in first.log()
    assert (second.dir / OFFSETS_FILE).read_bytes() == their_file
    # Back in its own dir, the server writes its own file again.
    client.config_set("dir", str(first.dir))
    assert tw(client, "new", "x") == 0
    assert tw(theirs, "s", "y") == 10
    client.close()
    theirs.close()


def children_of(pid: int) -> list[int]:
    """The processes whose parent is pid (a BGSAVE's fork)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("fork", ["BGSAVE", "BGREWRITEAOF"])
def test_a_restart_while_a_killed_servers_fork_still_saves(module_factory: Any, fork: str) -> None:
    # kill -9 leaves a BGSAVE or AOF rewrite child running; it holds the
    # parent's descriptors, offsets file included, but not its lock: the
    # restarted server must start, and hand out no offset twice.
    srv: RedisModuleServer = module_factory(appendonly="yes", rdb_key_save_delay=100_000)
    client = srv.client()
    ledger = Ledger()
    ledger.write(client, b"s", messages("a", 100))
    for n in range(100):
        client.set(f"filler{n}", "x")  # with the delay, a fork that saves for 10 s
    client.execute_command(fork)
    assert srv.proc is not None
    wait_for(lambda: children_of(srv.proc.pid) != [])
    orphans = children_of(srv.proc.pid)
    srv.kill9()
    try:
        srv.start(timeout=10)
        client = srv.client()
        ledger.write(client, b"s", messages("b", 10))
        assert ledger.reused == [] and ledger.check_stored(client) == 0
        client.close()
    finally:
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_the_offsets_file_compacted_on_its_thread_keeps_every_mark(module_factory: Any) -> None:
    # 60,000 streams fill the file past 1 MB: it is rewritten from its
    # marks off the event loop while writes go on, and the batches written
    # meanwhile are kept. No persistence: after kill -9 every stream comes
    # back empty at its mark.
    srv: RedisModuleServer = module_factory(save="")
    client = srv.client()
    keys = [b"stream:%d" % n for n in range(60_000)]
    ledger = Ledger()
    for start in range(0, len(keys), 2000):
        with client.pipeline(transaction=False) as pipe:
            for key in keys[start : start + 2000]:
                pipe.execute_command("TWRITE", key, key)
            for key, offset in zip(keys[start : start + 2000], pipe.execute(), strict=True):
                ledger.record(key, offset, key)
    wait_for(lambda: client.info("rcp11")["rcp11_offsets_file_compactions"] >= 1)
    assert not list(srv.dir.glob("*.compact"))
    srv.kill9()
    srv.start()
    client = srv.client()
    for start in range(0, len(keys), 2000):
        with client.pipeline(transaction=False) as pipe:
            for key in keys[start : start + 2000]:
                pipe.execute_command("TWRITE", key, b"again")
            for key, offset in zip(keys[start : start + 2000], pipe.execute(), strict=True):
                ledger.record(key, offset, b"again")
    assert ledger.reused == []
    client.close()
