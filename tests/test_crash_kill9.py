"""kill -9 at chosen moments (docs/PROTOCOL.md section 8): no acknowledged
write lost with the AOF on, a multi-entry TWRITE whole or not at all, and
no offset handed out twice in any mode (a kill leaves a gap of nulls up
to each stream's reservation mark). kill -9 at random moments under
load: test_crash_random_kills.py."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import (
    RawClient,
    ServerProcess,
    mbulk,
    raw_pipeline,
    tr,
    tw,
    twrite_entries,
    wait_for,
)
from redis.backoff import NoBackoff
from redis.retry import Retry

# ----------------------------------------------- acknowledged writes survive


@pytest.mark.slow
def test_appendonly_kill9_keeps_every_acknowledged_write(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", appendfsync="no")
    c = srv.client()
    pipe = c.pipeline(transaction=False)
    for i in range(500):
        pipe.execute_command("TWRITE", "s", f"m{i}")
    assert pipe.execute()[-1] == 499
    c.execute_command("TEVICT", "s", 9)
    tr(c, "s", 0, 5, "GROUP", "g")
    c.set("k", "v")
    srv.kill9()
    srv.start()
    c = srv.client()
    got = tr(c, "s", 0, 500, "WITHINFO")
    # A kill -9 leaves a gap of null offsets up to the stream's reservation
    # mark (the AOF cannot prove it holds every acknowledged write).
    first, last, start, count = got[0]
    assert (first, start, count) == (10, 0, 500) and last >= 499
    assert got[11] == b"m10" and got[-1] == b"m499"
    assert c.get("g") == b"15" and c.get("k") == b"v"
    after = tw(c, "s", "next")
    assert after > 499
    assert tr(c, "s", 500, after - 500 + 1) == [None] * (after - 500) + [b"next"]


@pytest.mark.slow
def test_replies_leave_only_after_the_aof_has_the_write(server_factory) -> None:
    # The server has persistence write the AOF in every loop iteration,
    # before that iteration's replies; without that, the acknowledged tail
    # would sit in a user-space buffer and die with the process.
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    conns = [RawClient(srv.port) for _ in range(4)]
    acknowledged: dict[bytes, int] = {}
    for round_ in range(20):
        for n, conn in enumerate(conns):
            key = b"k%d" % n
            conn.send(b"".join(mbulk(b"TWRITE", key, b"r%d-%d" % (round_, i)) for i in range(50)))
        for n, conn in enumerate(conns):
            for _ in range(50):
                acknowledged[b"k%d" % n] = conn.reply()
    srv.kill9()
    srv.start()
    client = srv.client()
    for key, last in acknowledged.items():
        assert client.execute_command("TREAD", key, last, 1) == [b"r19-49"]


def _hammer_then_kill9(srv: ServerProcess, writes: int, bgsave: bool) -> dict[int, bytes]:
    """Pipeline TWRITEs from a thread, kill -9 mid-stream once `writes` were
    acknowledged; return what was acknowledged."""
    acked: dict[int, bytes] = {}
    stop = threading.Event()

    def writer() -> None:
        cl = srv.client(socket_timeout=5, retry=Retry(NoBackoff(), 0))
        n = 0
        try:
            while not stop.is_set():
                pipe = cl.pipeline(transaction=False)
                batch = [b"m%d" % (n + k) for k in range(20)]
                for message in batch:
                    pipe.execute_command("TWRITE", "s", message)
                if bgsave and n % 400 == 0:
                    pipe.execute_command("BGSAVE")
                replies = pipe.execute(raise_on_error=False)
                for message, reply in zip(batch, replies[: len(batch)], strict=True):
                    if isinstance(reply, int):
                        acked[reply] = message
                n += 20
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # the kill

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    wait_for(lambda: len(acked) >= writes, timeout=30)  # well into the storm
    srv.kill9()
    stop.set()
    thread.join(10)
    return acked


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    ["always", "snapshot"],  # appendfsync no and no persistence: test_acceptance.py
)
def test_kill9_mid_write_storm_loses_nothing_acknowledged_and_reuses_nothing(
    server_factory: Any, mode: str
) -> None:
    if mode == "always":
        srv = server_factory(appendonly="yes", appendfsync=mode)
    else:
        srv = server_factory(save="3600 1" if mode == "snapshot" else "")
    acked = _hammer_then_kill9(srv, 2000, bgsave=mode == "snapshot")  # 5 BGSAVEs in snapshot
    assert acked, "nothing was acknowledged before the kill"
    srv.start()
    cl = srv.client()
    last = max(acked)
    got = tr(cl, "s", 0, last + 1)
    assert len(got) == last + 1
    wrong = [o for o, m in enumerate(got) if m is not None and m != acked.get(o)]
    assert wrong == []  # a message is either the acknowledged one or null, never other data
    if mode == "always":
        assert [o for o in acked if got[o] is None] == []
    assert tw(cl, "s", "after") > last


def _batch_storm_then_kill9(srv: ServerProcess, batches: int) -> dict[int, int]:
    """Multi-entry TWRITEs (with BGSAVEs) until kill -9, once `batches` were
    acknowledged: {first offset: size} acknowledged."""
    acked: dict[int, int] = {}
    stop = threading.Event()

    def writer() -> None:
        cl = srv.client(socket_timeout=5, retry=Retry(NoBackoff(), 0))
        n = 0
        try:
            while not stop.is_set():
                size = 1 + n % 37
                batch = [b"b%d-%d/%d" % (n, k, size) for k in range(size)]
                acked[cl.execute_command("TWRITE", "s", "ENTRIES", *batch)] = size
                if n % 50 == 0:
                    try:
                        cl.execute_command("BGSAVE", "SCHEDULE")
                    except redis.ResponseError:
                        pass  # "Background save already in progress", as redis-server says
                n += 1
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # the kill

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    wait_for(lambda: len(acked) >= batches, timeout=30)
    srv.kill9()
    stop.set()
    thread.join(10)
    return acked


@pytest.mark.slow
def test_a_multi_entry_twrite_survives_kill9_whole_or_not_at_all(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", save="3600 1")
    acked = _batch_storm_then_kill9(srv, 300)  # 6 BGSAVE SCHEDULEs
    assert acked
    srv.start()
    cl = srv.client()
    got = tr(cl, "s", 0, max(acked) + 40)
    batches: dict[bytes, list[bytes | None]] = {}
    for message in got:
        if message is not None:
            batches.setdefault(message.split(b"-")[0], []).append(message)
    for name, parts in batches.items():
        size = int(parts[0].rsplit(b"/", 1)[1])
        assert len(parts) == size, f"batch {name!r}: {len(parts)} of {size} entries"
    assert all(got[first] is not None for first in acked)


@pytest.mark.slow
def test_group_progress_survives_kill9_no_message_handed_out_twice(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", appendfsync="no")
    delivered: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def consumer() -> None:
        cl = srv.client(socket_timeout=5, retry=Retry(NoBackoff(), 0))
        try:
            while not stop.is_set():
                reply = tr(cl, "s", 0, 3, "GROUP", "g", "BLOCK", 200, "WITHINFO")
                if reply:
                    start, count = reply[0][2], reply[0][3]
                    with lock:
                        delivered.extend(range(start, start + count))
        except (redis.ConnectionError, redis.TimeoutError):
            pass

    def producer() -> None:
        cl = srv.client(socket_timeout=5, retry=Retry(NoBackoff(), 0))
        n = 0
        try:
            while not stop.is_set():
                tw(cl, "s", b"m%d" % n)
                n += 1
        except (redis.ConnectionError, redis.TimeoutError):
            pass

    threads = [threading.Thread(target=consumer, daemon=True) for _ in range(3)]
    threads.append(threading.Thread(target=producer, daemon=True))
    for thread in threads:
        thread.start()
    wait_for(lambda: len(delivered) >= 100, timeout=30)
    srv.kill9()
    stop.set()
    for thread in threads:
        thread.join(10)
    assert delivered
    assert len(delivered) == len(set(delivered))  # each message to one member only
    srv.start()
    cl = srv.client()
    assert int(cl.get("g")) >= max(delivered) + 1


# ------------------------------------------------------ offsets never reused


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "snapshot"])
def test_kill9_never_reuses_offsets(server_factory: Any, mode: str) -> None:
    srv = server_factory(save="3600 1" if mode == "snapshot" else "")
    c = srv.client()
    for i in range(5):
        tw(c, "s", f"a{i}")
    if mode == "snapshot":
        c.save()
    for i in range(5):
        tw(c, "s", f"b{i}")
    srv.kill9()
    srv.start()
    c = srv.client()
    assert tw(c, "s", "new") >= 10
    lost = tr(c, "s", 5, 5)
    assert all(m is None for m in lost)
    if mode == "snapshot":
        assert tr(c, "s", 0, 5) == [f"a{i}".encode() for i in range(5)]


@pytest.mark.slow
def test_del_then_kill9_without_persistence_keeps_key_deleted(server_factory: Any) -> None:
    srv = server_factory()
    c = srv.client()
    for i in range(5):
        tw(c, "s", f"m{i}")
    c.delete("s")
    srv.kill9()
    srv.start()
    c = srv.client()
    assert c.exists("s") == 0
    assert tw(c, "s", "x") == 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm-no-persistence", "aof-then-restart-without-aof"])
def test_restart_that_drops_the_data_still_reuses_no_offset(server_factory: Any, how: str) -> None:
    srv = server_factory(appendonly="yes" if how.startswith("aof") else "no")
    cl = srv.client()
    tw(cl, "s", "a", "b", "c")
    if how.startswith("aof"):
        srv.restart(appendonly="no")
    else:
        srv.restart()
    cl = srv.client()
    assert tw(cl, "s", "x") >= 3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "aof"])
def test_renamed_stream_keeps_its_no_reuse_guarantee_across_kill9(
    server_factory: Any, mode: str
) -> None:
    directives = {"none": {}, "snapshot": {"save": "3600 1"}, "aof": {"appendonly": "yes"}}
    srv = server_factory(**directives[mode])
    cl = srv.client()
    for i in range(5):
        tw(cl, "src", f"m{i}")
    if mode == "snapshot":
        cl.save()
    cl.rename("src", "dst")
    last = tw(cl, "dst", "after-rename")
    tw(cl, "big", *[f"b{i}" for i in range(50)])
    tw(cl, "small", "s0")
    cl.rename("small", "big")  # replaces the longer stream: its history is gone
    last_big = tw(cl, "big", "x")
    assert (last, last_big) == (5, 1)
    srv.kill9()
    srv.start()
    cl = srv.client()
    n_at = tw(cl, "dst", "n")
    assert n_at > last
    assert tw(cl, "big", "n") > last_big
    if mode == "aof":
        assert tr(cl, "dst", 0, 6) == [*(f"m{i}".encode() for i in range(5)), b"after-rename"]
        assert tr(cl, "dst", n_at, 1) == [b"n"]


@pytest.mark.slow
def test_config_set_appendonly_no_then_pipelined_writes_reuse_nothing_after_kill9(
    server_factory: Any,
) -> None:
    srv = server_factory(appendonly="yes")
    cl = srv.client()
    tw(cl, "s", "first")
    assert cl.config_set("appendonly", "no")
    out = raw_pipeline(srv.port, [["TWRITE", "s", f"m{n}"] for n in range(3000)])
    assert out.endswith(b":3000\r\n")
    srv.kill9()
    srv.directives["appendonly"] = "no"
    srv.start()
    cl = srv.client()
    assert tw(cl, "s", "n") > 3000


@pytest.mark.slow
def test_config_set_dir_never_trusts_a_stale_aof_there(server_factory, tmp_path: Path) -> None:
    # The open AOF stays in the old dir; the AOF a later start finds in the
    # new dir (here an old copy) must not be taken as holding every write.
    srv = server_factory(appendonly="yes", enable_protected_configs="yes")
    client = srv.client()
    for index in range(5):
        twrite_entries(client, "s", b"m%d" % index)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(srv.dir / "appendonly.aof", elsewhere / "appendonly.aof")
    client.config_set("dir", str(elsewhere))
    last = [twrite_entries(client, "s", b"n%d" % index) for index in range(5)][-1]
    srv.kill9()
    srv.directives["dir"] = str(elsewhere)
    srv.start()
    client = srv.client()
    assert twrite_entries(client, "s", b"new") > last
    assert client.execute_command("TREAD", "s", last, 1) == [None]
