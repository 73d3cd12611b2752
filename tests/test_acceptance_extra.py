"""Black-box acceptance tests, second pass: SPEC.md rules the first pass
(tests/test_acceptance.py) does not pin down, checked as a user would.

Everything goes over the network (redis-py RESP2/RESP3, raw sockets,
redis-cli, redis-benchmark) or through files and signals (kill -9, config
files). Nothing imports the server. Where SPEC.md is silent, Debian's
redis-server 7 is the reference; a few tests run it side by side. Tests for
open bugs are ``xfail(strict=True)`` naming their entry in
/work/notes/bugs2.md.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import ServerProcess

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
MAX = 2**63 - 1


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def c(srv: ServerProcess, request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    client = srv.client(protocol=request.param)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def c2(srv: ServerProcess) -> Iterator[redis.Redis]:
    client = srv.client(protocol=2)
    client.flushall()
    yield client
    client.close()


def raw(port: int, data: bytes, until: bytes = b"", timeout: float = 3.0) -> bytes:
    """Send bytes on a fresh socket and collect the answer until it ends with
    `until`, the server closes, or (without `until`) the line goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        if not until:
            sock.settimeout(0.3)
        while not (until and out.endswith(until)):
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
        return out


def closed_by_server(sock: socket.socket, timeout: float = 3.0) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def tw(cl: redis.Redis, key: str, *entries: Any) -> int:
    if len(entries) == 1:
        return cl.execute_command("TWRITE", key, entries[0])
    return cl.execute_command("TWRITE", key, "ENTRIES", *entries)


def tr(cl: redis.Redis, *args: Any) -> Any:
    return cl.execute_command("TREAD", *args)


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["reply"] = fn()
        except Exception as exc:  # the test asserts on it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def wait_blocked(cl: redis.Redis, n: int) -> None:
    deadline = time.monotonic() + 5
    while cl.info("clients")["blocked_clients"] != n:
        assert time.monotonic() < deadline, f"blocked_clients never reached {n}"
        time.sleep(0.01)


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)


def s(value: Any) -> Any:
    """bytes -> str, so RESP2 and RESP3 replies compare alike."""
    return value.decode() if isinstance(value, bytes) else value


def raise_next(srv: ServerProcess, key: str, next_offset: int) -> None:
    """Put `key` at next offset `next_offset` without writing that many
    messages: the AOF record the server itself logs when a stream's next
    offset is raised (as the first acceptance pass does)."""
    record = [b"RCP11-RAISE-NEXT", key.encode(), b"%d" % next_offset]
    srv.dir.joinpath("appendonly.aof").write_bytes(
        b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in record)
    )


# ------------------------------------------------------------ 1. data model


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


def test_set_over_a_stream_replaces_it_and_stream_commands_then_refuse(c: redis.Redis) -> None:
    tw(c, "s", "a", "b")
    c.set("s", "plain")
    assert s(c.type("s")) == "string"
    for cmd in (["TWRITE", "s", "x"], ["TREAD", "s", 0, 1], ["TEVICT", "s", 0]):
        with pytest.raises(redis.ResponseError, match=WRONGTYPE):
            c.execute_command(*cmd)
    c.delete("s")
    assert tw(c, "s", "new") == 0


def test_flushall_and_flushdb_restart_every_stream_at_zero(c: redis.Redis) -> None:
    tw(c, "a", "x", "y")
    tw(c, "b", "z")
    c.flushdb()
    assert tw(c, "a", "n") == 0
    c.flushall()
    assert tw(c, "b", "n") == 0
    assert c.dbsize() == 1


def test_rename_moves_history_and_offsets(c: redis.Redis) -> None:
    tw(c, "src", "a", "b", "c")
    c.execute_command("TEVICT", "src", 0)
    tw(c, "dst", "other")
    c.rename("src", "dst")
    assert tr(c, "dst", 0, 5, "WITHINFO") == [[1, 2, 0, 3], None, b"b", b"c"]
    assert tw(c, "dst", "d") == 3
    assert c.exists("src") == 0
    assert tw(c, "src", "fresh") == 0


# ---------------------------------------------------------------- 2. TWRITE


def test_twrite_options_are_case_insensitive(c: redis.Redis) -> None:
    assert c.execute_command("TWRITE", "s", "entries", "a", "b") == 0
    assert c.execute_command("TWRITE", "s", "Backlog", 2, "Entries", "c") == 2
    assert tr(c, "s", 0, 5) == [None, b"b", b"c"]


def test_twrite_entries_with_one_entry_writes_only_that_entry(c: redis.Redis) -> None:
    assert c.execute_command("TWRITE", "s", "ENTRIES", "a") == 0
    assert c.execute_command("TWRITE", "s", "ENTRIES", "ENTRIES", "BACKLOG") == 1
    assert tr(c, "s", 0, 5) == [b"a", b"ENTRIES", b"BACKLOG"]


def test_backlog_smaller_than_the_batch_keeps_its_newest(c: redis.Redis) -> None:
    assert c.execute_command("TWRITE", "s", "BACKLOG", 1, "ENTRIES", "a", "b", "c") == 0
    assert tr(c, "s", 0, 5, "WITHINFO") == [[2, 2, 0, 3], None, None, b"c"]


def test_backlog_count_bounds(c: redis.Redis) -> None:
    assert c.execute_command("TWRITE", "s", "BACKLOG", MAX, "ENTRIES", "a") == 0
    for bad in (MAX + 1, -1, "1.5", ""):
        with pytest.raises(redis.ResponseError):
            c.execute_command("TWRITE", "s", "BACKLOG", bad, "ENTRIES", "b")
    assert tr(c, "s", 0, 5) == [b"a"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["BACKLOG", "1", "x"], "ENTRIES"),
        (["FOO", "1", "ENTRIES", "x"], "FOO"),
        (["BACKLOG", "x", "ENTRIES", "x"], "BACKLOG"),
    ],
)
def test_twrite_syntax_errors_are_err_and_name_the_problem(
    srv: ServerProcess, args: list[str], names: str
) -> None:
    reply = raw(srv.port, ("TWRITE synt " + " ".join(args) + "\r\nEXISTS synt\r\n").encode())
    first, rest = reply.split(b"\r\n", 1)
    assert first.startswith(b"-ERR ")
    assert names.encode() in first
    assert rest == b":0\r\n"


def test_twrite_entries_without_entry_is_an_error(c: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError):
        c.execute_command("TWRITE", "s", "BACKLOG", 1, "ENTRIES")
    assert c.exists("s") == 0


# ----------------------------------------------------------------- 3. TREAD


def test_tread_wrong_arity(c: redis.Redis) -> None:
    for args in (["s"], ["s", 0]):
        with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'tread'"):
            tr(c, *args)


def test_tread_int64_edges(c: redis.Redis) -> None:
    tw(c, "s", "a", "b", "c")
    assert tr(c, "s", -(2**63), 2) == [b"a", b"b"]
    assert tr(c, "s", MAX, 2) == []
    assert tr(c, "s", 0, MAX) == [b"a", b"b", b"c"]
    assert tr(c, "s", -(2**63), 1, "WITHINFO")[0] == [0, 2, 0, 1]
    for offset, count in ((2**63, 1), (-(2**63) - 1, 1), (0, 2**63), ("1.0", 1), ("", 1)):
        with pytest.raises(redis.ResponseError):
            tr(c, "s", offset, count)


def test_tread_options_are_case_insensitive(c: redis.Redis) -> None:
    tw(c, "s", "a", "b")
    assert tr(c, "s", 0, 5, "withinfo", "block", 10, "group", "g") == [[0, 1, 0, 2], b"a", b"b"]
    assert tr(c, "s", 0, 5, "groupnew", "h") == []
    assert c.get("h") == b"2"


def test_tread_bad_block_values(c: redis.Redis) -> None:
    for bad in ("0.5", "", str(2**63)):
        with pytest.raises(redis.ResponseError):
            tr(c, "s", 0, 1, "BLOCK", bad)


def test_group_read_still_parses_the_offset(c: redis.Redis) -> None:
    tw(c, "s", "a")
    with pytest.raises(redis.ResponseError):
        tr(c, "s", "x", 1, "GROUP", "g")
    assert c.exists("g") == 0


@pytest.mark.parametrize("value", ["-3", " 1", "1 ", "abc", "1.5", ""])
def test_group_key_not_a_valid_offset_is_err_naming_it(c: redis.Redis, value: str) -> None:
    tw(c, "s", "a", "b")
    c.set("grp", value)
    with pytest.raises(redis.ResponseError, match="grp"):
        tr(c, "s", 0, 1, "GROUP", "grp")
    assert c.get("grp") == value.encode()


def test_group_key_holding_a_stream_is_wrongtype(c: redis.Redis) -> None:
    tw(c, "s", "a")
    tw(c, "other", "b")
    with pytest.raises(redis.ResponseError, match=WRONGTYPE):
        tr(c, "s", 0, 1, "GROUP", "other")
    assert tr(c, "other", 0, 5) == [b"b"]


def test_group_key_beyond_the_end_reads_nothing_and_stays(c: redis.Redis) -> None:
    tw(c, "s", "a", "b")
    c.set("g", 10)
    assert tr(c, "s", 0, 5, "GROUP", "g", "WITHINFO") == [[0, 1, 10, 0]]
    assert c.get("g") == b"10"
    tw(c, "s", *[f"m{i}" for i in range(2, 12)])
    assert tr(c, "s", 0, 1, "GROUP", "g") == [b"m10"]
    assert c.get("g") == b"11"


def test_group_read_of_count_zero_writes_the_start(c: redis.Redis) -> None:
    tw(c, "s", "a", "b", "c")
    c.execute_command("TEVICT", "s", 0)
    assert tr(c, "s", 0, 0, "GROUP", "g") == []
    assert c.get("g") == b"1"
    assert tr(c, "s", 0, 0, "GROUPNEW", "n", "WITHINFO") == [[1, 2, 3, 0]]
    assert c.get("n") == b"3"


def test_groupnew_on_an_existing_group_continues_it(c: redis.Redis) -> None:
    tw(c, "s", "a", "b", "c")
    c.set("g", 1)
    assert tr(c, "s", 0, 5, "GROUPNEW", "g") == [b"b", b"c"]
    assert c.get("g") == b"3"


def test_group_key_with_expiry_resets_the_group_when_it_expires(c: redis.Redis) -> None:
    tw(c, "s", "a", "b", "c")
    c.set("g", 2, px=100)
    wait_for(lambda: c.exists("g") == 0, timeout=3)
    assert tr(c, "s", 0, 1, "GROUP", "g") == [b"a"]


# ------------------------------------------------------------- 3. blocking


def test_blocked_group_reader_creates_group_key_at_first_offset(
    c2: redis.Redis, srv: ServerProcess
) -> None:
    tw(c2, "s", "a", "b")
    c2.execute_command("TEVICT", "s", 1)
    reader = srv.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "GROUP", "g", "BLOCK", 2000))
    wait_blocked(c2, 1)
    assert c2.get("g") == b"2"
    tw(c2, "s", "c")
    thread.join(5)
    assert box["reply"] == [b"c"]
    assert c2.get("g") == b"3"
    reader.close()


def test_blocked_group_timeout_leaves_group_key_at_start(c2: redis.Redis) -> None:
    assert tr(c2, "s", 0, 5, "GROUP", "g", "BLOCK", 30) is None
    assert c2.get("g") == b"0"
    tw(c2, "s", "a")
    assert tr(c2, "s", 0, 5, "GROUP", "g", "BLOCK", 30) == [b"a"]


def test_every_plain_blocked_reader_gets_the_same_messages(
    c2: redis.Redis, srv: ServerProcess
) -> None:
    readers = [srv.client(protocol=2 + n % 2) for n in range(3)]
    jobs = [in_thread(lambda cl=cl: tr(cl, "s", 0, 5, "BLOCK", 5000)) for cl in readers]
    wait_blocked(c2, 3)
    tw(c2, "s", "a", "b")
    for thread, _ in jobs:
        thread.join(5)
    assert [box["reply"] for _, box in jobs] == [[b"a", b"b"]] * 3
    for cl in readers:
        cl.close()


def test_blocked_reader_is_not_woken_by_other_keys(c2: redis.Redis, srv: ServerProcess) -> None:
    reader = srv.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "BLOCK", 5000))
    wait_blocked(c2, 1)
    tw(c2, "other", "x")
    c2.set("s2", "y")
    c2.ping()
    assert c2.info("clients")["blocked_clients"] == 1
    tw(c2, "s", "mine")
    thread.join(5)
    assert box["reply"] == [b"mine"]
    reader.close()


def test_blocked_reader_woken_by_backlog_write_sees_evicted_as_null(
    c2: redis.Redis, srv: ServerProcess
) -> None:
    reader = srv.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "BLOCK", 5000, "WITHINFO"))
    wait_blocked(c2, 1)
    c2.execute_command("TWRITE", "s", "BACKLOG", 1, "ENTRIES", "a", "b", "c")
    thread.join(5)
    assert box["reply"] == [[2, 2, 0, 3], None, None, b"c"]
    reader.close()


def test_blocked_negative_offset_on_empty_stream_gets_first_write(
    c2: redis.Redis, srv: ServerProcess
) -> None:
    reader = srv.client()
    thread, box = in_thread(lambda: tr(reader, "s", -1, 5, "BLOCK", 5000))
    wait_blocked(c2, 1)
    tw(c2, "s", "a", "b")
    thread.join(5)
    assert box["reply"] == [b"a", b"b"]
    reader.close()


def test_exec_wakes_blocked_reader_with_the_whole_transaction(
    c2: redis.Redis, srv: ServerProcess
) -> None:
    reader = srv.client()
    thread, box = in_thread(lambda: tr(reader, "s", 0, 10, "BLOCK", 5000))
    wait_blocked(c2, 1)
    pipe = c2.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s", "a")
    pipe.execute_command("TWRITE", "s", "ENTRIES", "b", "c")
    assert pipe.execute() == [0, 1]
    thread.join(5)
    assert box["reply"] == [b"a", b"b", b"c"]
    reader.close()


def test_rename_onto_an_awaited_key_wakes_the_reader(c2: redis.Redis, srv: ServerProcess) -> None:
    # redis-server 7 serves a blocked XREAD when RENAME brings a stream to its key.
    tw(c2, "src", "x", "y")
    reader = srv.client()
    thread, box = in_thread(lambda: tr(reader, "dst", 0, 5, "BLOCK", 3000))
    wait_blocked(c2, 1)
    c2.rename("src", "dst")
    thread.join(5)
    assert box["reply"] == [b"x", b"y"]
    reader.close()


def test_client_kill_of_a_blocked_reader_forgets_it(c2: redis.Redis, srv: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(b"CLIENT SETNAME victim\r\nTREAD s 0 5 GROUP g BLOCK 0\r\n")
        wait_blocked(c2, 1)
        entry = next(cl for cl in c2.client_list() if cl["name"] == "victim")
        assert "b" in entry["flags"] and entry["cmd"] == "tread"
        assert c2.execute_command("CLIENT", "KILL", "ID", entry["id"]) == 1
        wait_blocked(c2, 0)
        assert closed_by_server(sock)
    tw(c2, "s", "a", "b")
    assert tr(c2, "s", 0, 5, "GROUP", "g") == [b"a", b"b"]


def test_client_vanishing_mid_command_writes_nothing(c2: redis.Redis, srv: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.sendall(b"*3\r\n$6\r\nTWRITE\r\n$4\r\nhalf\r\n$100\r\nonly-part-of-it")
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.sendall(b"*4\r\n$6\r\nTWRITE\r\n$4\r\nhalf\r\n$7\r\nENTRIES\r\n")
    wait_for(lambda: c2.info("clients")["connected_clients"] == 1)
    assert c2.exists("half") == 0
    assert tw(c2, "half", "whole") == 0


def test_pipeline_mixing_blocking_and_plain_commands(c: redis.Redis) -> None:
    pipe = c.pipeline(transaction=False)
    pipe.execute_command("TWRITE", "s", "a")
    pipe.execute_command("TREAD", "s", 5, 1, "BLOCK", 30)  # times out
    pipe.execute_command("TREAD", "s", 0, 1, "BLOCK", 0)  # data there: no wait
    pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g", "BLOCK", 0)
    pipe.execute_command("TWRITE", "s", "b")
    pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g", "BLOCK", 1000)
    pipe.ping()
    assert pipe.execute() == [0, None, [b"a"], [b"a"], 1, [b"b"], True]


def test_blocked_reader_survives_idle_timeout(server_factory: Any) -> None:
    # redis-server never closes a blocked client for `timeout`, only idle ones.
    srv = server_factory(timeout=1)
    admin = srv.client()
    reader = srv.client()
    idle = socket.create_connection(("127.0.0.1", srv.port))
    thread, box = in_thread(lambda: tr(reader, "s", 0, 5, "BLOCK", 0))
    wait_blocked(admin, 1)
    assert closed_by_server(idle, timeout=6)  # the idle one goes within ~1-2 s
    idle.close()
    assert admin.info("clients")["blocked_clients"] == 1
    tw(admin, "s", "late")
    thread.join(5)
    assert box["reply"] == [b"late"]


# ---------------------------------------------------- transactions (WATCH)


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
    c2: redis.Redis, srv: ServerProcess, action: Any, runs: bool
) -> None:
    tw(c2, "s", "a")
    other = srv.client()
    assert _watch_then(c2, other, action) is runs
    other.close()


def test_exec_runs_the_rest_after_a_runtime_error(c: redis.Redis) -> None:
    c.set("str", "x")
    pipe = c.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s", "a")
    pipe.execute_command("TWRITE", "str", "a")
    pipe.execute_command("TWRITE", "s", "a", "b")
    pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g", "WITHINFO")
    replies = pipe.execute(raise_on_error=False)
    assert replies[0] == 0 and replies[3] == [[0, 0, 0, 1], b"a"]
    assert WRONGTYPE in str(replies[1])
    assert isinstance(replies[2], redis.ResponseError)


def test_exec_aborts_on_queue_time_arity_error(srv: ServerProcess, c2: redis.Redis) -> None:
    out = raw(
        srv.port,
        b"MULTI\r\nTWRITE s a\r\nTWRITE s\r\nEXEC\r\nEXISTS s\r\n",
        until=b":0\r\n",
    )
    assert out == (
        b"+OK\r\n+QUEUED\r\n-ERR wrong number of arguments for 'twrite' command\r\n"
        b"-EXECABORT Transaction discarded because of previous errors.\r\n:0\r\n"
    )


# ---------------------------------------------------------------- 4. TEVICT


def test_tevict_arity_and_bad_offsets(c: redis.Redis) -> None:
    tw(c, "s", "a", "b")
    for args in (["s"], ["s", 1, 2]):
        with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'tevict'"):
            c.execute_command("TEVICT", *args)
    for bad in ("x", "1.0", str(2**63), str(-(2**63) - 1), ""):
        with pytest.raises(redis.ResponseError):
            c.execute_command("TEVICT", "s", bad)
    assert tr(c, "s", 0, 5) == [b"a", b"b"]


def test_tevict_int64_edges(c: redis.Redis) -> None:
    tw(c, "s", "a", "b", "c")
    assert c.execute_command("TEVICT", "s", -(2**63)) == 0
    assert c.execute_command("TEVICT", "s", MAX) == 3
    assert tr(c, "s", 0, 5, "WITHINFO") == [[3, 2, 0, 3], None, None, None]
    assert c.execute_command("TEVICT", "missing", MAX) == 0
    assert c.exists("missing") == 0


def test_tevict_then_read_from_the_middle(c: redis.Redis) -> None:
    tw(c, "s", *[f"m{i}" for i in range(3000)])
    assert c.execute_command("TEVICT", "s", 1500) == 1501
    got = tr(c, "s", 1499, 4, "WITHINFO")
    assert got == [[1501, 2999, 1499, 4], None, None, b"m1501", b"m1502"]
    assert c.execute_command("TEVICT", "s", -1) == 1498
    assert tr(c, "s", -1, 5) == [b"m2999"]
