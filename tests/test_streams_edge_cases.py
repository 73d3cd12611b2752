"""Edge cases of TWRITE / TREAD / TEVICT on rcp11-server (docs/PROTOCOL.md
sections 1-4): int64 bounds and the offset ceiling, options in any case,
syntax errors that write nothing, stream keys under SET/RENAME/FLUSHALL,
stream commands inside MULTI/EXEC and WATCH, and the memory a BACKLOG
bound keeps. The everyday semantics, on both servers: test_streams.py."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import (
    WRONGTYPE,
    ServerProcess,
    as_str,
    exchange,
    tr,
    tw,
)

MAX = 2**63 - 1


def raise_next(srv: ServerProcess, key: str, next_offset: int) -> None:
    """Put `key` at next offset `next_offset` without writing that many
    messages: the AOF record the server itself logs when a stream's next
    offset is raised (as the first acceptance pass does)."""
    record = [b"RCP11-RAISE-NEXT", key.encode(), b"%d" % next_offset]
    srv.dir.joinpath("appendonly.aof").write_bytes(
        b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in record)
    )


# ------------------------------------------------------------ offset ceiling


@pytest.mark.slow
def test_write_crossing_the_offset_ceiling_fails_and_writes_nothing(server_factory: Any) -> None:
    srv = server_factory(appendonly="yes", start=False)
    raise_next(srv, "s", MAX - 1)
    srv.start()
    cl = srv.client()
    with pytest.raises(redis.ResponseError):
        tw(cl, "s", "a", "b", "c")  # would need offsets MAX-1, MAX, MAX+1
    assert tr(cl, "s", MAX - 1, 1, "WITHINFO") == [[MAX - 1, MAX - 2, MAX - 1, 0]]
    assert tw(cl, "s", "a", "b") == MAX - 1
    assert tr(cl, "s", MAX - 1, 5) == [b"a", b"b"]
    with pytest.raises(redis.ResponseError):
        tw(cl, "s", "x")
    assert tr(cl, "s", -5, 5, "WITHINFO")[0] == [MAX - 1, MAX, MAX - 4, 5]
    srv.kill9()
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", MAX - 1, 5) == [b"a", b"b"]
    with pytest.raises(redis.ResponseError):
        tw(cl, "s", "x")


@pytest.mark.slow
def test_stream_at_offset_ceiling_reads_and_shuts_down(server_factory: Any) -> None:
    # The only way to a stream at 2^63-1 without writing 2^63 messages: the
    # AOF record the server itself logs when it raises a stream's next offset.
    srv = server_factory(appendonly="yes", start=False)
    record = [b"RCP11-RAISE-NEXT", b"s", b"%d" % (2**63 - 1)]
    srv.dir.joinpath("appendonly.aof").write_bytes(
        b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in record)
    )
    srv.start()
    c = srv.client()
    assert tw(c, "s", "last") == 2**63 - 1
    with pytest.raises(redis.ResponseError):
        tw(c, "s", "past")
    c.execute_command("TEVICT", "s", 2**63 - 1)
    info = tr(c, "s", -1, 1, "WITHINFO")[0]  # must be parseable int64s
    assert info[1] == 2**63 - 1
    # A group that read the last possible offset can read again (nothing).
    assert tr(c, "s", 0, 10, "GROUP", "g") == []
    assert tr(c, "s", 0, 10, "GROUP", "g") == []
    assert srv.stop(timeout=5) == 0


# ---------------------------------------- stream keys under generic commands


def test_set_over_a_stream_replaces_it_and_stream_commands_then_refuse(
    shared_client_resp: redis.Redis,
) -> None:
    tw(shared_client_resp, "s", "a", "b")
    shared_client_resp.set("s", "plain")
    assert as_str(shared_client_resp.type("s")) == "string"
    for cmd in (["TWRITE", "s", "x"], ["TREAD", "s", 0, 1], ["TEVICT", "s", 0]):
        with pytest.raises(redis.ResponseError, match=WRONGTYPE):
            shared_client_resp.execute_command(*cmd)
    shared_client_resp.delete("s")
    assert tw(shared_client_resp, "s", "new") == 0


def test_flushall_and_flushdb_restart_every_stream_at_zero(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "a", "x", "y")
    tw(shared_client_resp, "b", "z")
    shared_client_resp.flushdb()
    assert tw(shared_client_resp, "a", "n") == 0
    shared_client_resp.flushall()
    assert tw(shared_client_resp, "b", "n") == 0
    assert shared_client_resp.dbsize() == 1


def test_rename_moves_history_and_offsets(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "src", "a", "b", "c")
    shared_client_resp.execute_command("TEVICT", "src", 0)
    tw(shared_client_resp, "dst", "other")
    shared_client_resp.rename("src", "dst")
    assert tr(shared_client_resp, "dst", 0, 5, "WITHINFO") == [[1, 2, 0, 3], None, b"b", b"c"]
    assert tw(shared_client_resp, "dst", "d") == 3
    assert shared_client_resp.exists("src") == 0
    assert tw(shared_client_resp, "src", "fresh") == 0


# -------------------------------------------------------------------- TWRITE


def test_twrite_options_are_case_insensitive(shared_client_resp: redis.Redis) -> None:
    assert shared_client_resp.execute_command("TWRITE", "s", "entries", "a", "b") == 0
    assert shared_client_resp.execute_command("TWRITE", "s", "Backlog", 2, "Entries", "c") == 2
    assert tr(shared_client_resp, "s", 0, 5) == [None, b"b", b"c"]


def test_twrite_entries_with_one_entry_writes_only_that_entry(
    shared_client_resp: redis.Redis,
) -> None:
    assert shared_client_resp.execute_command("TWRITE", "s", "ENTRIES", "a") == 0
    assert shared_client_resp.execute_command("TWRITE", "s", "ENTRIES", "ENTRIES", "BACKLOG") == 1
    assert tr(shared_client_resp, "s", 0, 5) == [b"a", b"ENTRIES", b"BACKLOG"]


def test_backlog_smaller_than_the_batch_keeps_its_newest(shared_client_resp: redis.Redis) -> None:
    assert (
        shared_client_resp.execute_command("TWRITE", "s", "BACKLOG", 1, "ENTRIES", "a", "b", "c")
        == 0
    )
    assert tr(shared_client_resp, "s", 0, 5, "WITHINFO") == [[2, 2, 0, 3], None, None, b"c"]


def test_backlog_count_bounds(shared_client_resp: redis.Redis) -> None:
    assert shared_client_resp.execute_command("TWRITE", "s", "BACKLOG", MAX, "ENTRIES", "a") == 0
    for bad in (MAX + 1, -1, "1.5", ""):
        with pytest.raises(redis.ResponseError):
            shared_client_resp.execute_command("TWRITE", "s", "BACKLOG", bad, "ENTRIES", "b")
    assert tr(shared_client_resp, "s", 0, 5) == [b"a"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["BACKLOG", "1", "x"], "ENTRIES"),
        (["FOO", "1", "ENTRIES", "x"], "FOO"),
        (["BACKLOG", "x", "ENTRIES", "x"], "BACKLOG"),
    ],
)
def test_twrite_syntax_errors_are_err_and_name_the_problem(
    shared_server: ServerProcess, args: list[str], names: str
) -> None:
    reply = exchange(
        shared_server.port,
        ("TWRITE synt " + " ".join(args) + "\r\nEXISTS synt\r\n").encode(),
        lines=2,
    )
    first, rest = reply.split(b"\r\n", 1)
    assert first.startswith(b"-ERR ")
    assert names.encode() in first
    assert rest == b":0\r\n"


def test_twrite_entries_without_entry_is_an_error(shared_client_resp: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError):
        shared_client_resp.execute_command("TWRITE", "s", "BACKLOG", 1, "ENTRIES")
    assert shared_client_resp.exists("s") == 0


@pytest.mark.slow
def test_backlog_bounded_stream_keeps_memory_bounded(server_factory: Any) -> None:
    srv = server_factory(stream_node_max_entries=100)
    cl = srv.client()
    pipe = cl.pipeline(transaction=False)
    for _ in range(200):
        pipe.execute_command("TWRITE", "s", "BACKLOG", 150, "ENTRIES", *[b"z" * 50] * 100)
    assert pipe.execute()[-1] == 19900
    info = cl.info("streams")
    assert info["stream_messages"] == 150
    assert info["stream_nodes"] <= 3
    assert cl.memory_usage("s") < 100 * 1024
    assert tr(cl, "s", -150, 1, "WITHINFO")[0] == [19850, 19999, 19850, 1]


# --------------------------------------------------------------------- TREAD


def test_tread_wrong_arity(shared_client_resp: redis.Redis) -> None:
    for args in (["s"], ["s", 0]):
        with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'tread'"):
            tr(shared_client_resp, *args)


def test_tread_int64_edges(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a", "b", "c")
    assert tr(shared_client_resp, "s", -(2**63), 2) == [b"a", b"b"]
    assert tr(shared_client_resp, "s", MAX, 2) == []
    assert tr(shared_client_resp, "s", 0, MAX) == [b"a", b"b", b"c"]
    assert tr(shared_client_resp, "s", -(2**63), 1, "WITHINFO")[0] == [0, 2, 0, 1]
    for offset, count in ((2**63, 1), (-(2**63) - 1, 1), (0, 2**63), ("1.0", 1), ("", 1)):
        with pytest.raises(redis.ResponseError):
            tr(shared_client_resp, "s", offset, count)


def test_tread_options_are_case_insensitive(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a", "b")
    assert tr(shared_client_resp, "s", 0, 5, "withinfo", "block", 10, "group", "g") == [
        [0, 1, 0, 2],
        b"a",
        b"b",
    ]
    assert tr(shared_client_resp, "s", 0, 5, "groupnew", "h") == []
    assert shared_client_resp.get("h") == b"2"


def test_tread_bad_block_values(shared_client_resp: redis.Redis) -> None:
    for bad in ("0.5", "", str(2**63)):
        with pytest.raises(redis.ResponseError):
            tr(shared_client_resp, "s", 0, 1, "BLOCK", bad)


# -------------------------------------------------------------------- TEVICT


def test_tevict_arity_and_bad_offsets(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a", "b")
    for args in (["s"], ["s", 1, 2]):
        with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'tevict'"):
            shared_client_resp.execute_command("TEVICT", *args)
    for bad in ("x", "1.0", str(2**63), str(-(2**63) - 1), ""):
        with pytest.raises(redis.ResponseError):
            shared_client_resp.execute_command("TEVICT", "s", bad)
    assert tr(shared_client_resp, "s", 0, 5) == [b"a", b"b"]


def test_tevict_int64_edges(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", "a", "b", "c")
    assert shared_client_resp.execute_command("TEVICT", "s", -(2**63)) == 0
    assert shared_client_resp.execute_command("TEVICT", "s", MAX) == 3
    assert tr(shared_client_resp, "s", 0, 5, "WITHINFO") == [[3, 2, 0, 3], None, None, None]
    assert shared_client_resp.execute_command("TEVICT", "missing", MAX) == 0
    assert shared_client_resp.exists("missing") == 0


def test_tevict_then_read_from_the_middle(shared_client_resp: redis.Redis) -> None:
    tw(shared_client_resp, "s", *[f"m{i}" for i in range(3000)])
    assert shared_client_resp.execute_command("TEVICT", "s", 1500) == 1501
    got = tr(shared_client_resp, "s", 1499, 4, "WITHINFO")
    assert got == [[1501, 2999, 1499, 4], None, None, b"m1501", b"m1502"]
    assert shared_client_resp.execute_command("TEVICT", "s", -1) == 1498
    assert tr(shared_client_resp, "s", -1, 5) == [b"m2999"]


# -------------------------------------------------------------- transactions


def _watch_then(cl: redis.Redis, other: redis.Redis, action: Any) -> bool:
    """True when EXEC ran, False when WATCH aborted it."""
    pipe = cl.pipeline(transaction=True)
    pipe.watch("s", "g")
    pipe.multi()
    pipe.execute_command("TREAD", "s", 0, 5)
    action(other)
    try:
        pipe.execute()
    except redis.WatchError:
        return False
    return True


@pytest.mark.parametrize(
    ("action", "runs"),
    [
        (lambda o: tw(o, "s", "b"), False),
        (lambda o: tr(o, "s", 0, 5, "GROUP", "g"), False),
        (lambda o: o.execute_command("TEVICT", "s", 0), False),
        (lambda o: o.delete("s"), False),
        (lambda o: tr(o, "s", 0, 5), True),
        (lambda o: tw(o, "unrelated", "x"), True),
    ],
    ids=["twrite", "group-read", "tevict", "del", "plain-read", "other-key"],
)
def test_watch_sees_stream_and_group_writes(
    shared_client: redis.Redis, shared_server: ServerProcess, action: Any, runs: bool
) -> None:
    tw(shared_client, "s", "a")
    other = shared_server.client()
    assert _watch_then(shared_client, other, action) is runs
    other.close()


def test_exec_runs_the_rest_after_a_runtime_error(shared_client_resp: redis.Redis) -> None:
    shared_client_resp.set("str", "x")
    pipe = shared_client_resp.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s", "a")
    pipe.execute_command("TWRITE", "str", "a")
    pipe.execute_command("TWRITE", "s", "a", "b")
    pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g", "WITHINFO")
    replies = pipe.execute(raise_on_error=False)
    assert replies[0] == 0 and replies[3] == [[0, 0, 0, 1], b"a"]
    assert WRONGTYPE in str(replies[1])
    assert isinstance(replies[2], redis.ResponseError)


def test_exec_aborts_on_queue_time_arity_error(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    out = exchange(
        shared_server.port,
        b"MULTI\r\nTWRITE s a\r\nTWRITE s\r\nEXEC\r\nEXISTS s\r\n",
        until=b":0\r\n",
    )
    assert out == (
        b"+OK\r\n+QUEUED\r\n-ERR wrong number of arguments for 'twrite' command\r\n"
        b"-EXECABORT Transaction discarded because of previous errors.\r\n:0\r\n"
    )
