"""TCONCAT dst src [src ...] (docs/PROTOCOL.md): appends the readable
messages of each source to dst atomically and deletes the sources; the
commit step of the Spark sink's two-phase write."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import redis
from conftest import (
    ServerProcess,
    in_thread,
    persistence_in_process,
    require,
    tr,
    tw,
    wait_blocked,
)
from helpers_dispatch import Client, recording_state, run

from rcp11 import errors
from rcp11.commands import streams
from rcp11.persistence.reservations import OffsetReservations
from rcp11.resp import Error, encode
from rcp11.state import ServerState


def tconcat(client: redis.Redis, *keys: str) -> Any:
    return client.execute_command("TCONCAT", *keys)


def everything(client: redis.Redis) -> dict[bytes, Any]:
    """Every key with its content: a stream as (info, messages), a string as bytes."""
    out: dict[bytes, Any] = {}
    for key in client.keys("*"):
        if client.type(key) == b"string":
            out[key] = client.get(key)
        else:
            reply = tr(client, key, 0, 1_000_000, "WITHINFO")
            out[key] = (reply[0], reply[1:])
    return out


# ---------------------------------------------------------------- behaviour


def test_appends_sources_in_order_and_deletes_them(shared_client: redis.Redis) -> None:
    tw(shared_client, "dst", "d0", "d1")
    tw(shared_client, "a", "a0", "a1", "a2")
    tw(shared_client, "b", "b0")
    assert tconcat(shared_client, "dst", "a", "b") == 2
    assert tr(shared_client, "dst", 0, 100) == [b"d0", b"d1", b"a0", b"a1", b"a2", b"b0"]
    assert shared_client.exists("a", "b") == 0
    assert tw(shared_client, "dst", "next") == 6
    # A source re-created after TCONCAT starts again at offset 0.
    assert tw(shared_client, "a", "again") == 0


def test_creates_a_missing_destination(shared_client: redis.Redis) -> None:
    tw(shared_client, "a", "x", "y")
    assert tconcat(shared_client, "new", "a") == 0
    assert tr(shared_client, "new", 0, 10) == [b"x", b"y"]
    assert shared_client.type("new") != b"none"


def test_evicted_and_lost_messages_are_skipped(shared_client: redis.Redis) -> None:
    tw(shared_client, "a", *[f"m{i}" for i in range(10)])
    shared_client.execute_command("TEVICT", "a", 6)
    tw(shared_client, "gone", "g0", "g1")
    shared_client.execute_command("TEVICT", "gone", 1)  # nothing readable left
    tw(shared_client, "dst", "d0")
    assert tconcat(shared_client, "dst", "gone", "a") == 1
    assert tr(shared_client, "dst", 0, 100) == [b"d0", b"m7", b"m8", b"m9"]
    # A fully evicted source is still deleted.
    assert shared_client.exists("gone", "a") == 0


def test_missing_sources_are_empty_streams(shared_client: redis.Redis) -> None:
    assert tconcat(shared_client, "dst", "nope", "nada") == 0
    assert shared_client.exists("dst") == 1  # created if missing, as the contract says
    assert tr(shared_client, "dst", 0, 0, "WITHINFO") == [[0, -1, 0, 0]]
    shared_client.delete("dst")
    tw(shared_client, "dst", "d0", "d1", "d2")
    shared_client.execute_command("TEVICT", "dst", 2)
    changes = shared_client.info("persistence")["rdb_changes_since_last_save"]
    # dst's next offset, even when nothing of it is readable.
    assert tconcat(shared_client, "dst", "nope") == 3
    assert shared_client.info("persistence")["rdb_changes_since_last_save"] == changes
    tw(shared_client, "a", "a0")
    assert tconcat(shared_client, "dst", "nope", "a") == 3
    assert tr(shared_client, "dst", 3, 10) == [b"a0"]


def test_wrongtype_and_repeated_keys_change_nothing(shared_client: redis.Redis) -> None:
    tw(shared_client, "dst", "d0")
    tw(shared_client, "a", "a0")
    tw(shared_client, "b", "b0")
    shared_client.set("str", "text")
    before = everything(shared_client)
    for keys, error in [
        (("str", "a"), "^WRONGTYPE"),
        (("dst", "a", "str"), "^WRONGTYPE"),
        (("dst", "str", "b"), "^WRONGTYPE"),
        (("dst", "a", "dst"), "source key 'dst' is the destination key"),
        (("dst", "dst"), "source key 'dst' is the destination key"),
        (("dst", "a", "b", "a"), "source key 'a' is given more than once"),
    ]:
        with pytest.raises(redis.ResponseError, match=error):
            tconcat(shared_client, *keys)
        assert everything(shared_client) == before, keys
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'tconcat'"):
        tconcat(shared_client, "dst")


def test_wakes_readers_blocked_on_the_destination(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    tw(shared_client, "dst", "d0")
    tw(shared_client, "a", "a0", "a1")
    reader = shared_server.client()
    thread, box = in_thread(lambda: tr(reader, "dst", 1, 10, "BLOCK", 0))
    wait_blocked(shared_client, 1)
    assert tconcat(shared_client, "dst", "a") == 1
    thread.join(10)
    assert box == {"reply": [b"a0", b"a1"]}
    reader.close()


def test_commit_protocol_with_watch_multi_exec(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    """The two-phase commit the Spark sink runs: the progress key guards it."""
    tw(shared_client, "stage1", "s0", "s1")
    tw(shared_client, "stage2", "s2")
    other = shared_server.client()

    def commit(batch: int) -> Any:
        pipe = shared_client.pipeline(transaction=True)
        pipe.watch("progress")
        pipe.multi()
        pipe.execute_command("TCONCAT", "target", "stage1", "stage2")
        pipe.set("progress", batch)
        try:
            return pipe.execute()
        except redis.WatchError:
            return None
        finally:
            pipe.reset()

    # Another committer moved the progress key between WATCH and EXEC.
    pipe = shared_client.pipeline(transaction=True)
    pipe.watch("progress")
    other.set("progress", 7)
    pipe.multi()
    pipe.execute_command("TCONCAT", "target", "stage1", "stage2")
    pipe.set("progress", 8)
    with pytest.raises(redis.WatchError):
        pipe.execute()
    pipe.reset()
    assert shared_client.exists("target") == 0 and shared_client.exists("stage1", "stage2") == 2
    assert shared_client.get("progress") == b"7"

    assert commit(8) == [0, True]
    assert tr(shared_client, "target", 0, 10) == [b"s0", b"s1", b"s2"]
    assert shared_client.exists("stage1", "stage2") == 0 and shared_client.get("progress") == b"8"
    other.close()


def test_watching_a_source_or_the_destination_sees_tconcat(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    for watched in ("a", "dst"):
        tw(shared_client, "a", "x")
        other = shared_server.client()
        pipe = other.pipeline(transaction=True)
        pipe.watch(watched)
        tconcat(shared_client, "dst", "a")
        pipe.multi()
        pipe.set("k", "v")
        with pytest.raises(redis.WatchError):
            pipe.execute()
        pipe.reset()
        other.close()
    assert shared_client.exists("k") == 0


def test_command_table_knows_every_key(shared_client: redis.Redis) -> None:
    info = shared_client.execute_command("COMMAND", "INFO", "TCONCAT")["tconcat"]
    assert info["arity"] == -3 and {"write", "denyoom"} <= set(info["flags"])
    assert (info["first_key_pos"], info["last_key_pos"], info["step_count"]) == (1, -1, 1)
    assert shared_client.command_getkeys("TCONCAT", "d", "a", "b") == ["d", "a", "b"]


def test_redis_cli(shared_server: ServerProcess, shared_client: redis.Redis) -> None:
    require("redis-cli")
    tw(shared_client, "dst", "d0")
    tw(shared_client, "a", "x", "y")

    def cli(*args: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(shared_server.port), *args],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return done.stdout.strip()

    assert cli("TCONCAT", "dst", "a") == "1"
    assert cli("TREAD", "dst", "0", "10") == "d0\nx\ny"
    assert cli("TYPE", "a") == "none"
    shared_client.set("s", "v")
    assert cli("TCONCAT", "dst", "s").startswith("WRONGTYPE")


# ---------------------------------------------------------------- limits and refusals


def test_oom_refuses_and_changes_nothing(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    tw(shared_client, "a", "x")
    shared_client.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            tconcat(shared_client, "dst", "a")
    finally:
        shared_client.config_set("maxmemory", 0)
    assert shared_client.exists("dst") == 0 and tr(shared_client, "a", 0, 5) == [b"x"]


@pytest.fixture
def state() -> ServerState:
    """A server without network, as in test_dispatch: what TCONCAT propagates
    and reserves is recorded."""
    return recording_state()


def test_reserves_the_whole_append_and_logs_the_command(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "dst", "d0")
    run(state, c, "TWRITE", "a", "ENTRIES", *[f"m{i}" for i in range(5000)])
    run(state, c, "TWRITE", "b", "ENTRIES", "b0", "b1")
    persistence = state.persistence
    persistence.log.clear()
    persistence.reserved.clear()
    assert run(state, c, "TCONCAT", "dst", "a", "b", "missing") == 1
    assert persistence.reserved == [(b"dst", 1 + 5002)]
    assert persistence.log == [[b"TCONCAT", b"dst", b"a", b"b", b"missing"]]
    # A refused reservation (MISCONF on the offsets file) writes nothing.
    run(state, c, "TWRITE", "c", "c0")

    def refuse(key: bytes, new_next_offset: int) -> None:
        raise errors.CommandError(errors.MISCONF)

    persistence.before_stream_write = refuse  # type: ignore[method-assign]
    assert run(state, c, "TCONCAT", "dst", "c") == Error(errors.MISCONF)
    assert state.keyspace.data[b"c"].length == 1
    assert state.keyspace.data[b"dst"].next_offset == 5003


def test_misconf_refuses_and_changes_nothing(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "a", "x")
    state.persistence.refuse = errors.MISCONF
    assert run(state, c, "TCONCAT", "dst", "a") == Error(errors.MISCONF)
    assert b"dst" not in state.keyspace.data and state.keyspace.data[b"a"].length == 1
    state.persistence.refuse = None
    assert run(state, c, "TCONCAT", "dst", "a") == 0


def test_too_many_messages_for_one_call_is_refused(
    state: ServerState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "TCONCAT_MAX_MESSAGES", 10)
    c = Client()
    run(state, c, "TWRITE", "a", "ENTRIES", *"abcdef")
    run(state, c, "TWRITE", "b", "ENTRIES", *"ghijk")
    reply = run(state, c, "TCONCAT", "dst", "a", "b")
    assert reply == Error(errors.tconcat_too_many(10))
    assert b"dst" not in state.keyspace.data and state.keyspace.data[b"a"].length == 6
    assert run(state, c, "TCONCAT", "dst", "a") == 0


def test_inside_multi_exec_replies_in_order(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "a", "ENTRIES", "x", "y")
    run(state, c, "MULTI")
    run(state, c, "TCONCAT", "dst", "a")
    run(state, c, "TWRITE", "dst", "z")
    run(state, c, "SET", "progress", "1")
    assert encode(run(state, c, "EXEC"), False) == b"*3\r\n:0\r\n:2\r\n+OK\r\n"
    assert state.keyspace.data[b"dst"].read(0, 3) == [b"x", b"y", b"z"]


def charged_bytes(state: ServerState) -> int:
    """What the keyspace should charge, counted afresh from every key."""
    keyspace = state.keyspace
    return sum(
        len(key) + keyspace.KEY_OVERHEAD + (len(v) if isinstance(v, bytes) else v.memory_bytes)
        for key, v in keyspace.data.items()
    )


def exec_after_watch(state: ServerState, watcher: Client) -> bytes:
    run(state, watcher, "MULTI")
    run(state, watcher, "SET", "elsewhere", "v")
    return encode(run(state, watcher, "EXEC"), False)


def test_thousands_of_sources_move_in_order_and_all_go(state: ServerState) -> None:
    """The one-call paths for many sources (docs/PROTOCOL.md, TCONCAT):
    every message in order, evicted ones skipped, missing sources passed
    over, every source deleted, memory charged right, and a WATCH on any
    source, a missing one too, aborts the transaction."""
    c = Client()
    run(state, c, "TWRITE", "dst", "d0")
    expected = [b"d0"]
    names = []
    for i in range(3000):
        name = f"s{i}"
        names.append(name)
        if i % 7 == 3:
            continue  # missing
        messages = [f"{i}-{j}".encode() for j in range(i % 150 + 1)]  # some span nodes
        run(state, c, "TWRITE", name, "ENTRIES", *messages)
        if i % 11 == 0 and len(messages) > 2:
            run(state, c, "TEVICT", name, 1)
            messages = messages[2:]
        expected += messages
    watchers = {name: Client() for name in ("s3", "s4", "s2999", "dst", "unrelated")}
    for name, watcher in watchers.items():
        run(state, watcher, "WATCH", name)
    state.persistence.log.clear()
    assert run(state, c, "TCONCAT", "dst", *names) == 1
    dst = state.keyspace.data[b"dst"]
    assert dst.next_offset == len(expected)
    assert dst.read(0, len(expected)) == expected
    assert list(state.keyspace.data) == [b"dst"]
    assert state.keyspace.used_bytes == charged_bytes(state)
    assert state.persistence.log == [[b"TCONCAT", b"dst", *(n.encode() for n in names)]]
    for name, watcher in watchers.items():
        aborted = exec_after_watch(state, watcher) == b"*-1\r\n"
        assert aborted == (name != "unrelated"), name


def test_only_missing_sources_still_count_as_modified(state: ServerState) -> None:
    """Nothing moves and nothing is logged, yet a WATCH on any named key
    aborts (as inside redis-server)."""
    c = Client()
    run(state, c, "TWRITE", "dst", "d0")
    watcher = Client()
    run(state, watcher, "WATCH", "gone500")
    state.persistence.log.clear()
    assert run(state, c, "TCONCAT", "dst", *[f"gone{i}" for i in range(1000)]) == 1
    assert state.persistence.log == []
    assert exec_after_watch(state, watcher) == b"*-1\r\n"


def test_many_deleted_streams_leave_the_offsets_file(tmp_path: Any) -> None:
    """With the AOF off and no snapshot, a deletion is durable at once: the
    offsets file read afresh holds the destination's mark and no mark of
    any source (DEL of many streams likewise)."""
    state, persistence = persistence_in_process(tmp_path, appendonly="no")
    persistence.load()
    c = Client()
    for i in range(2000):
        run(state, c, "TWRITE", f"s{i}", "m")
    run(state, c, "TCONCAT", "dst", *[f"s{i}" for i in range(1000)])
    assert run(state, c, "DEL", *[f"s{i}" for i in range(1000, 2000)], "missing") == 1000
    assert persistence.flush()
    marks = persistence.reservations.marks
    assert list(marks) == [b"dst"] and marks[b"dst"] >= 1000
    reread = OffsetReservations(persistence.reservations.path)
    assert reread.load() == {b"dst": marks[b"dst"]} and reread.deleted == {}
    persistence.reservations.close()


# ---------------------------------------------------------------- durability


@pytest.mark.slow
def test_kill9_with_aof_loses_nothing_and_reuses_no_offset(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    cl = srv.client()
    tw(cl, "dst", "d0", "d1")
    for name in ("s1", "s2", "s3"):
        tw(cl, name, *[f"{name}-{i}" for i in range(2000)])
    cl.execute_command("TEVICT", "s2", 999)
    assert tconcat(cl, "dst", "s1", "s2", "s3") == 2
    assert tw(cl, "dst", "after") == 2 + 2000 + 1000 + 2000
    tw(cl, "s1", "new-s1")
    expected = everything(cl)
    srv.kill9()
    srv.start()
    cl = srv.client()
    # Every acknowledged message is back at its offset; after a crash a
    # stream may continue past a gap of null offsets up to its reservation
    # (docs/PROTOCOL.md, Durability), never below what was acknowledged.
    after = everything(cl)
    assert after.keys() == expected.keys()
    for key, (info, messages) in expected.items():
        info_after, messages_after = after[key]
        assert messages_after[: len(messages)] == messages, key
        assert all(m is None for m in messages_after[len(messages) :]), key
        assert info_after[0] == info[0] and info_after[3] >= info[3], key
    assert tw(cl, "dst", "later") >= 5003
    assert tw(cl, "s1", "x") >= 1
    cl.close()


@pytest.mark.slow
@pytest.mark.parametrize("appendonly", ["no", "yes"])
def test_kill9_after_a_large_tconcat_reuses_no_offset(server_factory: Any, appendonly: str) -> None:
    """A TCONCAT moves dst's next offset by far more than TWRITE's reservation
    step: its reservation must cover all of it. Without the AOF the data is
    gone after kill -9, but dst comes back empty at its reservation mark."""
    srv = server_factory(appendonly=appendonly)
    cl = srv.client()
    tw(cl, "dst", "d0")
    size = 300_000
    for start in range(0, size, 50_000):
        tw(cl, "big", *[b"%d" % i for i in range(start, start + 50_000)])
    first = tconcat(cl, "dst", "big")
    assert first == 1
    acknowledged_next = first + size
    srv.kill9()
    srv.start()
    cl = srv.client()
    assert tw(cl, "dst", "after") >= acknowledged_next
    if appendonly == "yes":
        assert tr(cl, "dst", acknowledged_next - 1, 1) == [b"%d" % (size - 1)]
    cl.close()


def test_moved_messages_keep_their_append_times(state: ServerState) -> None:
    """TCONCAT moves nodes with their time index: a seek by time on dst finds
    the moved messages where they were written, not at the time of the move."""
    c = Client()
    old = state.new_stream()
    old.append([f"old{i}".encode() for i in range(3000)], now_ms=1_000_000)
    old.append([f"new{i}".encode() for i in range(3000)], now_ms=2_000_000)
    state.keyspace.set(b"src", old)
    assert run(state, c, "TCONCAT", "dst", "src") == 0
    dst = state.keyspace.data[b"dst"]
    assert dst.read(2999, 2) == [b"old2999", b"new0"]
    # At most 63 messages early (docs/PROTOCOL.md, TSEEK), never late.
    assert 3000 - 63 <= dst.seek_time(1_500_000) <= 3000
    assert dst.seek_time(1_000_000) == 0
    assert dst.seek_time(2_000_001) == 6000


@pytest.mark.slow
def test_kill9_with_aof_after_thousands_of_sources(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    cl = srv.client()
    pipe = cl.pipeline(transaction=False)
    for i in range(3000):
        pipe.execute_command("TWRITE", f"s{i}", "ENTRIES", f"{i}-a", f"{i}-b")
    pipe.execute()
    names = [f"s{i}" for i in range(3000)] + ["never"]
    assert tconcat(cl, "dst", *names) == 0
    assert cl.execute_command("DEL", "s0", "s1") == 0  # gone already
    srv.kill9()
    srv.start()
    cl = srv.client()
    assert cl.keys("*") == [b"dst"]
    expected = [f"{i}-{x}".encode() for i in range(3000) for x in "ab"]
    assert tr(cl, "dst", 0, 6000) == expected
    assert tw(cl, "dst", "after") >= 6000
    cl.close()
