"""The append-only file through a running server (docs/PROTOCOL.md section
8): every kind of write replays, BGREWRITEAOF and the automatic rewrite
(writes during a rewrite included), CONFIG SET appendonly at run time.
Torn and corrupt AOFs: test_crash_damaged_files.py; the format in
process: test_persistence_files.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis
from conftest import (
    assert_same_after_kill9,
    dataset,
    in_thread,
    random_workload,
    raw_pipeline,
    tr,
    tw,
    twrite_entries,
    wait_blocked,
    wait_for,
)


def rewrite_done(client: redis.Redis, count: int) -> bool:
    """`count` AOF rewrites have finished and none runs: the condition to
    wait for. aof_rewrite_in_progress alone is also 0 before a scheduled
    rewrite starts, and aof_enabled is 1 from CONFIG SET appendonly yes on."""
    info = client.info("persistence")
    return info["aof_rewrites"] >= count and info["aof_rewrite_in_progress"] == 0


# -------------------------------------------------------------------- replay


@pytest.mark.slow
def test_aof_round_trip_through_restart(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    random_workload(client, random.Random(1))
    before = dataset(client)
    srv.restart()
    assert dataset(srv.client()) == before


@pytest.mark.slow
def test_del_resets_stream_across_restart(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    twrite_entries(client, "s", b"a", b"b", b"c")
    client.delete("s")
    srv.restart()
    client = srv.client()
    assert client.exists("s") == 0
    assert twrite_entries(client, "s", b"new") == 0


@pytest.mark.slow
def test_aof_replays_every_kind_of_write(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes")
    cl = srv.client()
    tw(cl, "s", "before the flush")
    tw(cl, "wiped", "w")
    cl.set("k", "v")
    cl.flushall()
    big = random.Random(3).randbytes(1 << 19) * 3
    tw(cl, "big", big, b"tail")
    tw(cl, "s", *[f"m{i}" for i in range(10)])
    cl.execute_command("TWRITE", "b", "BACKLOG", 2, "ENTRIES", "x", "y", "z")
    tw(cl, "d", "a")
    cl.delete("d")
    tw(cl, "rn", "r0")
    cl.rename("rn", "rn2")
    cl.incr("cnt")
    cl.incrby("cnt", 5)
    cl.set("ttl", "v", ex=100)
    cl.set("gone", "v", px=1)
    tw(cl, "exp", "e")
    cl.pexpire("exp", 1)
    pipe = cl.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "m", "a")
    pipe.set("mk", "1")
    pipe.execute()
    cl.execute_command("TEVICT", "s", -4)
    tw(cl, "f", "x")
    # a group key moved by a served blocked reader, and one created while blocking
    reader = srv.client()
    thread, box = in_thread(lambda: tr(reader, "q", 0, 5, "GROUPNEW", "gq", "BLOCK", 5000))
    wait_blocked(cl, 1)
    tw(cl, "q", "q0", "q1")
    thread.join(5)
    assert box["reply"] == [b"q0", b"q1"]
    thread, box = in_thread(lambda: tr(reader, "w", 0, 5, "GROUP", "gw", "BLOCK", 5000))
    wait_blocked(cl, 1)
    srv.kill9()
    srv.start()
    cl = srv.client()
    # A kill -9 leaves a gap up to each stream's reservation mark: the
    # offsets after the last acknowledged one read as null.
    first, last, start, count = tr(cl, "s", 0, 10, "WITHINFO")[0]
    assert (first, start, count) == (6, 0, 10) and last >= 9
    assert cl.exists("wiped", "k") == 0 and tw(cl, "wiped", "again") == 0
    assert tr(cl, "big", 0, 2) == [big, b"tail"]
    assert tr(cl, "b", 0, 3) == [None, b"y", b"z"]
    assert cl.exists("d", "rn", "gone", "exp") == 0
    assert tw(cl, "d", "new") == 0 and tw(cl, "exp", "new") == 0
    assert tr(cl, "rn2", 0, 1) == [b"r0"]
    assert cl.get("cnt") == b"6"
    assert 90 <= cl.ttl("ttl") <= 100
    assert tr(cl, "m", 0, 1) == [b"a"] and cl.get("mk") == b"1"
    assert cl.get("gq") == b"2" and cl.get("gw") == b"0"
    assert tw(cl, "q", "q2") >= 2 and tr(cl, "q", 0, 2) == [b"q0", b"q1"]


# ------------------------------------------------------------------- rewrite


@pytest.mark.slow
def test_bgrewriteaof_while_writing_keeps_everything(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    client = srv.client()
    random_workload(client, random.Random(2))
    assert client.bgrewriteaof()
    random_workload(client, random.Random(3))
    wait_for(lambda: rewrite_done(client, 1))
    assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"
    random_workload(client, random.Random(4))
    before = dataset(client)
    assert (srv.dir / "appendonly.aof").read_bytes().startswith(b"RCP11SNAP")
    srv.kill9()
    srv.start()
    assert_same_after_kill9(before, dataset(srv.client()))


@pytest.mark.slow
def test_bgrewriteaof_then_more_writes_then_kill9(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", stream_node_max_entries=100)
    cl = srv.client()
    tw(cl, "s", *[b"x" * 100] * 1000)
    cl.execute_command("TEVICT", "s", 899)
    tr(cl, "s", 0, 10, "GROUP", "g")
    cl.set("t", "1", ex=500)
    aof = srv.dir / "appendonly.aof"
    before = aof.stat().st_size
    assert cl.bgrewriteaof()
    wait_for(
        lambda: (
            cl.info("persistence")["aof_rewrite_in_progress"] == 0
            and cl.info("persistence")["aof_rewrite_scheduled"] == 0
        )
    )
    tw(cl, "s", "after")
    assert aof.stat().st_size < before / 2
    srv.kill9()
    srv.start()
    cl = srv.client()
    first, last, start, count = tr(cl, "s", 899, 3, "WITHINFO")[0]
    assert (first, start, count) == (900, 899, 3) and last >= 1000
    assert tr(cl, "s", 1000, 1) == [b"after"]
    assert cl.get("g") == b"910"
    assert cl.ttl("t") > 400
    assert tw(cl, "s", "n") > 1000


@pytest.mark.slow
def test_auto_aof_rewrite_kicks_in(server_factory: Any) -> None:
    srv = server_factory(
        appendonly="yes", auto_aof_rewrite_min_size="64kb", auto_aof_rewrite_percentage=100
    )
    cl = srv.client()
    for _ in range(40):
        cl.execute_command("TWRITE", "s", "BACKLOG", 10, "ENTRIES", *[b"x" * 100] * 20)
    wait_for(lambda: cl.info("persistence")["aof_rewrites"] >= 1)
    wait_for(lambda: cl.info("persistence")["aof_rewrite_in_progress"] == 0)
    srv.kill9()
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", 790, 10) == [b"x" * 100] * 10
    first, last, _, _ = tr(cl, "s", 0, 0, "WITHINFO")[0]
    assert first == 790 and last >= 799  # a kill -9 leaves a gap up to the mark


@pytest.mark.slow
def test_writes_during_an_aof_rewrite_survive_kill9(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes")
    cl = srv.client()
    for _ in range(4):
        cl.execute_command("TWRITE", "s", "ENTRIES", *[b"y" * 500] * 5000)
    tw(cl, "doomed", "x")
    pipe = cl.pipeline(transaction=False)
    pipe.bgrewriteaof()
    for n in range(300):
        pipe.execute_command("TWRITE", "s", b"during%d" % n)
    pipe.execute_command("TREAD", "s", 0, 7, "GROUP", "g")
    pipe.delete("doomed")
    pipe.execute_command("TEVICT", "s", 99)
    replies = pipe.execute()
    assert replies[1] == 20000 and replies[300] == 20299
    wait_for(
        lambda: (
            cl.info("persistence")["aof_rewrite_in_progress"] == 0
            and cl.info("persistence")["aof_rewrite_scheduled"] == 0
        )
    )
    tw(cl, "s", "after")
    srv.kill9()
    srv.start()
    cl = srv.client()
    got = tr(cl, "s", 20298, 3, "WITHINFO")
    first, last, start, count = got[0]
    assert (first, start, count) == (100, 20298, 3) and last >= 20300
    assert got[1:] == [b"during298", b"during299", b"after"]
    assert cl.get("g") == b"7"
    assert cl.exists("doomed") == 0
    assert tw(cl, "s", "n") > 20300


@pytest.mark.slow
@pytest.mark.parametrize("how", ["bgrewriteaof", "config-set-appendonly"])
def test_a_rewrite_asked_inside_exec_waits_for_its_end(server_factory: Any, how: str) -> None:
    """BGREWRITEAOF (or CONFIG SET appendonly yes) inside MULTI: forked in
    the middle of EXEC, the rewrite's snapshot held the transaction's first
    commands and the new file the rest of its log, EXEC without its MULTI:
    the next start was refused. Redis schedules it for after the EXEC."""
    srv = server_factory(appendonly="no" if how == "config-set-appendonly" else "yes")
    client = srv.client()
    tw(client, "s", "before")
    client.set("n", 1)
    asked = ["BGREWRITEAOF"] if how == "bgrewriteaof" else ["CONFIG", "SET", "appendonly", "yes"]
    with srv.raw() as raw:
        for argv in (["MULTI"], ["TWRITE", "s", "in-exec-1"], ["INCR", "n"], asked):
            raw.command(*argv)
        raw.command("TWRITE", "s", "in-exec-2")
        raw.command("INCR", "n")
        replies = raw.command("EXEC")
    if how == "bgrewriteaof":
        assert replies[2] == b"Background append only file rewriting scheduled"
    wait_for(lambda: rewrite_done(client, 1))
    srv.kill9()
    srv.directives["appendonly"] = "yes"
    srv.start()
    client = srv.client()
    assert tr(client, "s", 0, 3) == [b"before", b"in-exec-1", b"in-exec-2"]
    assert client.get("n") == b"3"


def test_bgsave_inside_exec_is_scheduled(server_factory: Any) -> None:
    """As redis-server 7 answers it: the snapshot is taken after the EXEC,
    so it holds the whole transaction or none of it."""
    srv = server_factory()
    client = srv.client()
    with srv.raw() as raw:
        for argv in (["MULTI"], ["TWRITE", "s", "in-exec"], ["BGSAVE"]):
            raw.command(*argv)
        assert raw.command("EXEC")[1] == b"Background saving scheduled"
    saves = client.info("persistence")["rdb_saves"]
    wait_for(lambda: client.info("persistence")["rdb_saves"] > saves)


# ----------------------------------------------------- CONFIG SET appendonly


@pytest.mark.slow
def test_config_set_appendonly_yes_at_runtime(server_factory) -> None:
    srv = server_factory()
    client = srv.client()
    random_workload(client, random.Random(11))
    client.config_set("appendonly", "yes")
    # aof_enabled is 1 from the CONFIG SET on; the AOF holds the data once
    # the first rewrite has ended.
    wait_for(lambda: rewrite_done(client, 1))
    random_workload(client, random.Random(12))
    before = dataset(client)
    srv.kill9()
    srv.directives["appendonly"] = "yes"
    srv.start()
    assert_same_after_kill9(before, dataset(srv.client()))


@pytest.mark.slow
def test_config_set_appendonly_yes_at_runtime_then_kill9(server_factory: Any) -> None:
    srv = server_factory()
    cl = srv.client()
    tw(cl, "s", "a", "b")
    cl.set("g", "1")
    assert cl.config_set("appendonly", "yes")
    tw(cl, "s", "c")
    # a pipelined run while the first rewrite may still be going on
    out = raw_pipeline(srv.port, [["TWRITE", "s", f"p{n}"] for n in range(200)])
    assert out.endswith(b":202\r\n")
    wait_for(lambda: rewrite_done(cl, 1))
    tw(cl, "s", "d")
    srv.kill9()
    srv.directives["appendonly"] = "yes"
    srv.start()
    cl = srv.client()
    pipelined = [f"p{n}".encode() for n in range(200)]
    got = tr(cl, "s", 0, 10_000)
    assert got[:204] == [b"a", b"b", b"c", *pipelined, b"d"]
    assert set(got[204:]) <= {None}  # the gap a kill -9 leaves up to the mark
    assert cl.get("g") == b"1"
