"""Snapshots through a running server (docs/PROTOCOL.md section 8): SAVE,
BGSAVE (and SCHEDULE), LASTSAVE, save rules, SHUTDOWN SAVE and NOSAVE,
FLUSHALL with save points, dbfilename and dir, what a snapshot keeps
(compression, evictions, groups, TTLs, binary keys), and MISCONF after a
failed save. The file format in process: test_persistence_files.py.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import (
    dataset,
    random_workload,
    raw_pipeline,
    read_all,
    tr,
    tw,
    twrite_entries,
    wait_for,
)

# ----------------------------------------------------------- SAVE and BGSAVE


@pytest.mark.slow
def test_save_and_bgsave_round_trip(server_factory) -> None:
    srv = server_factory(stream_compression="zlib")
    client = srv.client()
    random_workload(client, random.Random(7))
    first = client.lastsave()
    assert client.save()
    random_workload(client, random.Random(8))
    # LASTSAVE has one-second resolution: BGSAVE in a later second than `first`.
    wait_for(lambda: int(time.time()) > first.timestamp())

    assert client.bgsave()
    wait_for(lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0)
    info = client.info("persistence")
    assert info["rdb_last_bgsave_status"] == "ok"
    assert info["rdb_changes_since_last_save"] == 0
    assert client.lastsave() > first
    before = dataset(client)
    saved_at = (srv.dir / "dump.rcp").stat().st_mtime_ns
    # No save rules: SIGTERM exits without saving, so what loads is BGSAVE's.
    srv.stop()
    assert (srv.dir / "dump.rcp").stat().st_mtime_ns == saved_at
    srv.start()
    assert dataset(srv.client()) == before


@pytest.mark.slow
def test_bgsave_child_leaves_no_temp_files(server_factory) -> None:
    srv = server_factory()
    client = srv.client()
    twrite_entries(client, "s", b"x")
    client.bgsave()
    wait_for(lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0)
    names = os.listdir(srv.dir)
    assert not [n for n in names if n.startswith("temp-")]


@pytest.mark.slow
def test_info_persistence_fields(server_factory) -> None:
    srv = server_factory(appendonly="yes")
    info = srv.client().info("persistence")
    for field in [
        "loading",
        "rdb_changes_since_last_save",
        "rdb_bgsave_in_progress",
        "rdb_last_save_time",
        "rdb_last_bgsave_status",
        "aof_enabled",
        "aof_rewrite_in_progress",
        "aof_last_write_status",
        "aof_current_size",
        "aof_base_size",
    ]:
        assert field in info
    assert info["aof_enabled"] == 1


@pytest.mark.slow
def test_save_rule_triggers_a_snapshot(server_factory: Any) -> None:
    srv = server_factory(save="1 1")
    cl = srv.client()
    tw(cl, "s", "a", "b")
    first = cl.lastsave()
    wait_for(lambda: cl.info("persistence")["rdb_changes_since_last_save"] == 0, timeout=8)
    assert cl.lastsave() >= first
    assert (srv.dir / "dump.rcp").exists()
    srv.kill9()
    srv.start()
    assert tr(srv.client(), "s", 0, 5, "WITHINFO") == [[0, 1, 0, 2], b"a", b"b"]


@pytest.mark.slow
def test_bgsave_then_kill9(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    cl = srv.client()
    tw(cl, "s", *[f"m{i}" for i in range(1000)])
    cl.execute_command("TEVICT", "s", 499)
    assert cl.bgsave()
    wait_for(
        lambda: (
            cl.info("persistence")["rdb_bgsave_in_progress"] == 0
            and cl.info("persistence")["rdb_changes_since_last_save"] == 0
        )
    )
    assert cl.info("persistence")["rdb_last_bgsave_status"] == "ok"
    srv.kill9()
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", 498, 3, "WITHINFO") == [[500, 999, 498, 3], None, None, b"m500"]
    assert tw(cl, "s", "n") == 1000


@pytest.mark.slow
def test_bgsave_schedule_during_aof_rewrite(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", save="3600 1")
    cl = srv.client()
    tw(cl, "s", "a")
    out = raw_pipeline(srv.port, [["BGREWRITEAOF"], ["BGSAVE", "SCHEDULE"]])
    assert (
        out == b"+Background append only file rewriting started\r\n+Background saving scheduled\r\n"
    )
    wait_for(lambda: (srv.dir / "dump.rcp").exists())


@pytest.mark.slow
def test_failed_snapshot_refuses_writes_with_misconf_until_a_save_works(
    server_factory: Any, tmp_path: Path
) -> None:
    srv = server_factory(save="3600 1", enable_protected_configs="yes")
    cl = srv.client()
    tw(cl, "s", "a")
    cl.set("k", "v")
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    cl.config_set("dir", str(doomed))
    shutil.rmtree(doomed)
    with pytest.raises(redis.ResponseError):
        cl.save()
    assert cl.info("persistence")["rdb_last_bgsave_status"] == "err"
    with pytest.raises(redis.ResponseError, match="^MISCONF"):
        tw(cl, "s", "b")
    assert cl.get("k") == b"v" and tr(cl, "s", 0, 5) == [b"a"]  # reads still work
    doomed.mkdir()
    assert cl.save()
    assert tw(cl, "s", "b") == 1


# ----------------------------------------------------- what a snapshot keeps


@pytest.mark.slow
def test_kill9_right_after_save_loads_snapshot_exactly(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    c = srv.client()
    tw(c, "s", *[f"m{i}" for i in range(100)])
    before = tr(c, "s", 0, 200, "WITHINFO")
    c.save()
    srv.kill9()
    srv.start()
    c = srv.client()
    assert tr(c, "s", 0, 200, "WITHINFO") == before
    assert tw(c, "s", "next") == 100


@pytest.mark.slow
def test_snapshot_round_trip_keeps_compression_evictions_groups(server_factory: Any) -> None:
    srv = server_factory(save="3600 1", stream_compression="zlib", stream_node_max_entries=50)
    c = srv.client()
    tw(c, "s", *[f"message {i}" for i in range(500)])
    c.execute_command("TEVICT", "s", 120)
    tr(c, "s", 0, 7, "GROUP", "g")
    before = tr(c, "s", 0, 600, "WITHINFO")
    srv.stop()  # SHUTDOWN path: saves, then a clean start loads it
    srv.start()
    c = srv.client()
    assert tr(c, "s", 0, 600, "WITHINFO") == before
    assert c.get("g") == b"128"
    info = c.info("streams")
    assert info["stream_compressed_nodes"] > 0
    assert info["stream_messages"] == 379


@pytest.mark.slow
def test_del_then_save_survives_kill9(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    c = srv.client()
    for i in range(5):
        tw(c, "s", f"m{i}")
    c.save()
    c.delete("s")
    c.save()
    srv.kill9()
    srv.start()
    c = srv.client()
    assert c.exists("s") == 0
    assert tw(c, "s", "x") == 0


@pytest.mark.slow
def test_snapshot_keeps_fully_evicted_stream_ttls_and_binary_data(server_factory: Any) -> None:
    srv = server_factory(save="3600 1", stream_compression="zlib")
    cl = srv.client()
    key = b"bin\r\nkey\x00" + b"K" * 70000  # past any 16-bit length field
    big = random.Random(4).randbytes(1 << 19) * 3 + b"\r\n\x00"
    tw(cl, key, big, b"")
    tw(cl, "empty", "a", "b", "c")
    cl.execute_command("TEVICT", "empty", -0 + 100)
    cl.set("ttl", "v", ex=1000)
    cl.set(b"g\x00", 7)
    tw(cl, b"", "empty key")
    srv.stop()
    srv.start()
    cl = srv.client()
    assert tr(cl, key, 0, 5) == [big, b""]
    assert tr(cl, "empty", 0, 5, "WITHINFO") == [[3, 2, 0, 3], None, None, None]
    assert tw(cl, "empty", "d") == 3
    assert 990 <= cl.ttl("ttl") <= 1000
    assert cl.get(b"g\x00") == b"7"
    assert tr(cl, b"", 0, 1) == [b"empty key"]


@pytest.mark.slow
def test_snapshot_from_aof_mode_loads_exactly_without_aof(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", save="3600 1")
    cl = srv.client()
    tw(cl, "s", *[f"m{i}" for i in range(10)])
    cl.save()
    srv.kill9()
    srv.directives["appendonly"] = "no"
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", 0, 20, "WITHINFO")[0] == [0, 9, 0, 10]
    assert tw(cl, "s", "next") == 10


@pytest.mark.slow
@pytest.mark.parametrize("during_bgsave", [False, True], ids=["plain", "during-bgsave"])
def test_flushall_with_save_points_stays_flushed_after_kill9(
    server_factory: Any, during_bgsave: bool
) -> None:
    # redis-server 7: FLUSHALL with save points configured saves the empty
    # dataset at once (and kills a running BGSAVE), so a crash cannot undo it.
    srv = server_factory(save="3600 1")
    cl = srv.client()
    tw(cl, "s", *[b"y" * 500] * 5000)
    cl.set("k", "v")
    cl.save()
    if during_bgsave:
        pipe = cl.pipeline(transaction=False)
        pipe.bgsave()
        pipe.flushall()
        pipe.execute()
        wait_for(lambda: cl.info("persistence")["rdb_bgsave_in_progress"] == 0)
    else:
        cl.flushall()
    srv.kill9()
    srv.start()
    cl = srv.client()
    assert cl.dbsize() == 0
    assert tw(cl, "s", "new") == 0


# ------------------------------------------------------------------ SHUTDOWN


@pytest.mark.slow
def test_shutdown_save_and_clean_restart_has_no_gap(server_factory) -> None:
    srv = server_factory()
    client = srv.client()
    assert twrite_entries(client, "s", b"a", b"b") == 0
    client.shutdown(save=True)  # redis-py swallows the closed connection
    assert srv.proc.wait(10) == 0
    assert (srv.dir / "dump.rcp").exists()
    srv.start()
    client = srv.client()
    assert read_all(client, "s") == [b"a", b"b"]
    assert twrite_entries(client, "s", b"c") == 2


@pytest.mark.slow
def test_shutdown_nosave_keeps_last_snapshot_and_reuses_no_offset(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    cl = srv.client()
    tw(cl, "s", "a", "b")
    cl.save()
    tw(cl, "s", "c", "d")
    with srv.raw() as raw:
        raw.send(b"SHUTDOWN NOSAVE\r\n")
        assert raw.read_until_closed() == b""  # no reply: the server is gone
    assert srv.proc is not None and srv.proc.wait(10) == 0
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", 0, 4) == [b"a", b"b", None, None]
    assert tw(cl, "s", "e") >= 4


@pytest.mark.slow
def test_shutdown_save_without_save_rules_saves(server_factory: Any) -> None:
    srv = server_factory()
    cl = srv.client()
    tw(cl, "s", "a", "b", "c")
    cl.set("k", "v")
    with srv.raw() as raw:
        raw.send(b"SHUTDOWN SAVE\r\n")
        assert raw.read_until_closed() == b""
    assert srv.proc is not None and srv.proc.wait(10) == 0
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", 0, 5) == [b"a", b"b", b"c"] and cl.get("k") == b"v"
    assert tw(cl, "s", "d") == 3


@pytest.mark.slow
def test_shutdown_while_bgsave_runs_saves_everything(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    cl = srv.client()
    for _ in range(4):
        cl.execute_command("TWRITE", "s", "ENTRIES", *[b"y" * 500] * 5000)
    cl.save()
    script = b"BGSAVE\r\nTWRITE s after\r\nSET k v\r\nSHUTDOWN\r\n"
    with srv.raw(timeout=20) as raw:
        raw.send(script)
        out = raw.read_until_closed()  # SHUTDOWN closes the connection
    assert out == b"+Background saving started\r\n:20000\r\n+OK\r\n"
    assert srv.proc is not None and srv.proc.wait(20) == 0
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", -1, 1, "WITHINFO") == [[0, 20000, 20000, 1], b"after"]
    assert cl.get("k") == b"v"
    assert tw(cl, "s", "n") == 20001


# -------------------------------------------------- file names and directory


@pytest.mark.slow
def test_dbfilename_and_appendfilename_are_used(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", appendfilename="my.aof", dbfilename="snap.db")
    cl = srv.client()
    tw(cl, "s", "a")
    cl.save()
    names = {p.name for p in srv.dir.rglob("*")}
    assert "snap.db" in names and any(n.startswith("my.aof") for n in names)
    assert "dump.rcp" not in names and "appendonly.aof" not in names
    srv.kill9()
    srv.start()
    assert tr(srv.client(), "s", 0, 5) == [b"a"]


def test_config_set_dir_moves_the_next_snapshot(server_factory: Any, tmp_path: Path) -> None:
    srv = server_factory(save="3600 1", enable_protected_configs="yes")
    cl = srv.client()
    tw(cl, "s", "a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cl.config_set("dir", str(elsewhere))
    cl.save()
    assert (elsewhere / "dump.rcp").exists()


@pytest.mark.slow
def test_config_set_dir_moves_snapshot_and_offsets(server_factory, tmp_path: Path) -> None:
    srv = server_factory(enable_protected_configs="yes")
    client = srv.client()
    twrite_entries(client, "s", b"a", b"b")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    client.config_set("dir", str(elsewhere))
    twrite_entries(client, "s", b"c")
    assert client.save()
    assert (elsewhere / "dump.rcp").exists()
    assert (elsewhere / "dump.rcp.offsets").exists()
    twrite_entries(client, "s", b"lost")  # after the snapshot: lost by the crash below
    srv.kill9()
    srv.directives["dir"] = str(elsewhere)
    srv.start()
    client = srv.client()
    assert client.execute_command("TREAD", "s", 0, 3) == [b"a", b"b", b"c"]
    # The offset of "lost" is never handed out again.
    assert twrite_entries(client, "s", b"new") > 3
