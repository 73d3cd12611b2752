"""Keys with a TTL across a restart (AOF replay, snapshots, AOF rewrite).

As redis-server 7: nothing expires while the files load. A TTL command whose
deadline has passed by the time it is replayed sets the TTL instead of
deleting the key, so the commands logged after it replay onto the same key
they ran on; the key then expires after loading (lazily or by the cron),
and that expiry is logged as DEL. A message never reads as other data and a
stream that still exists never hands an offset out twice.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from conftest import finish_rewrite, persistence_in_process, tr, tw, wait_for

from rcp11 import errors
from rcp11.commands import execute
from rcp11.persistence import Persistence, encode_command
from rcp11.resp import Error
from rcp11.state import ClientState, ServerState

# ---------------------------------------------------------------------------
# In process: every command that gives a key a deadline
# ---------------------------------------------------------------------------


def load(directory: Path, appendonly: str = "yes") -> tuple[ServerState, Persistence]:
    state, persistence = persistence_in_process(
        directory, appendonly=appendonly, appendfsync="always"
    )
    persistence.load()
    return state, persistence


def run(state: ServerState, persistence: Persistence, *argv: bytes | str | int) -> object:
    args = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
    reply = execute(state, ClientState(authenticated=True), args)
    assert persistence.flush()
    return reply


def now_ms() -> int:
    return int(time.time() * 1000)


def ttl_variants(deadline: int) -> list[tuple[bytes, list[list[object]]]]:
    """(key, commands) pairs: each key gets a deadline `deadline` (unix ms)
    from a different command, then is changed by a command that keeps the
    TTL. Replayed after the deadline, every one of these keys must come
    back with its TTL (and then expire), never as a fresh key without one."""
    in_ms = max(deadline - now_ms(), 1)
    in_s = max(in_ms // 1000, 1)
    return [
        (b"k-pexpire", [["SET", "k-pexpire", "v"], ["PEXPIRE", "k-pexpire", in_ms]]),
        (b"k-expire", [["SET", "k-expire", "v"], ["EXPIRE", "k-expire", in_s]]),
        (b"k-pexpireat", [["SET", "k-pexpireat", "v"], ["PEXPIREAT", "k-pexpireat", deadline]]),
        (
            b"k-expireat",
            [["SET", "k-expireat", "v"], ["EXPIREAT", "k-expireat", -(-deadline // 1000)]],
        ),
        (b"k-set-px", [["SET", "k-set-px", "v", "PX", in_ms]]),
        (b"k-set-ex", [["SET", "k-set-ex", "v", "EX", in_s]]),
        (b"k-set-pxat", [["SET", "k-set-pxat", "v", "PXAT", deadline]]),
        (b"k-set-exat", [["SET", "k-set-exat", "v", "EXAT", -(-deadline // 1000)]]),
        (b"k-setex", [["SETEX", "k-setex", in_s, "v"]]),
        (b"k-psetex", [["PSETEX", "k-psetex", in_ms, "v"]]),
        # The TTL is kept by later commands that do not reset it.
        (b"k-append", [["SET", "k-append", "v"], ["PEXPIRE", "k-append", in_ms]]),
        (b"k-incr", [["SET", "k-incr", "1"], ["PEXPIRE", "k-incr", in_ms]]),
        (b"k-keepttl", [["SET", "k-keepttl", "v"], ["PEXPIRE", "k-keepttl", in_ms]]),
        (b"k-renamed", [["SET", "k-rename-src", "v"], ["PEXPIRE", "k-rename-src", in_ms]]),
        (b"s-stream", [["TWRITE", "s-stream", "a"], ["PEXPIRE", "s-stream", in_ms]]),
    ]


AFTER_TTL = [
    ["APPEND", "k-append", "x"],
    ["INCR", "k-incr"],
    ["SET", "k-keepttl", "w", "KEEPTTL"],
    ["RENAME", "k-rename-src", "k-renamed"],
    ["TWRITE", "s-stream", "b"],
    ["MULTI"],
    ["APPEND", "k-pexpire", "y"],
    ["EXEC"],
]


@pytest.mark.slow
def test_ttl_commands_replayed_after_their_deadline_keep_the_ttl(tmp_path: Path) -> None:
    # The set-up must run before the first deadline (else AFTER_TTL's
    # commands find keys expired and recreate them). With appendfsync always
    # each command is an fsync, which on a loaded machine can outlast a short
    # TTL: the TTL grows until the set-up fits in it.
    for budget_ms in (400, 3_000, 15_000):
        directory = tmp_path / f"ttl-{budget_ms}"
        directory.mkdir()
        state, persistence = load(directory)
        deadline = now_ms() + budget_ms
        variants = ttl_variants(deadline)
        for _key, commands in variants:
            for command in commands:
                run(state, persistence, *command)
        client = ClientState(authenticated=True)
        for command in AFTER_TTL:
            execute(state, client, [str(a).encode() for a in command])
        assert persistence.flush()
        if now_ms() < deadline:
            break
        persistence.shutdown("nosave")
    else:
        pytest.fail("the set-up outlasted a 15 s TTL")
    keys = [key for key, _ in variants]
    # Every key still lives and has a deadline when the process "crashes".
    assert all(key in state.keyspace.expires for key in keys)
    deadlines = {key: state.keyspace.expires[key] for key in keys}
    wait_for(lambda: now_ms() > max(deadlines.values()) + 5)

    # Replayed after every deadline passed: the keys were there while the
    # files loaded, with the values the later commands made and their TTLs
    # (read through .data, which does not expire anything).
    loaded_state, probe = load(directory)
    replayed = {key: loaded_state.keyspace.data.get(key) for key in keys}
    assert replayed[b"k-append"] == b"vx"
    assert replayed[b"k-incr"] == b"2"
    assert replayed[b"k-keepttl"] == b"w"
    assert replayed[b"k-renamed"] == b"v"
    assert replayed[b"k-pexpire"] == b"vy"
    stream = replayed[b"s-stream"]
    assert stream is not None and not isinstance(stream, bytes)
    assert stream.read(0, 2) == [b"a", b"b"]
    for key in keys:
        assert loaded_state.keyspace.expires.get(key) == deadlines[key], key

    # After loading they expire: lazily on access, or from the cron, and
    # either way the expiry is logged, so the next start agrees.
    assert run(loaded_state, probe, "GET", "k-append") is None
    assert run(loaded_state, probe, "EXISTS", "s-stream") == 0
    assert loaded_state.keyspace.expire_due() == len(keys) - 2
    assert probe.flush()
    assert len(loaded_state.keyspace) == 0
    logged = (directory / "appendonly.aof").read_bytes()
    assert all(encode_command([b"DEL", key]) in logged for key in keys)
    again, _ = load(directory)
    assert len(again.keyspace) == 0


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["RENAME", "s", "t"], "ERR no such key"),
        (["RENAMENX", "s", "t"], "ERR no such key"),
        (["TREAD", "s", 0, 1, "GROUP", "s"], errors.GROUP_IS_KEY),
    ],
    ids=["rename", "renamenx", "tread-group-is-key"],
)
def test_a_command_refused_on_a_key_it_found_expired_answers_its_own_error(
    tmp_path: Path, argv: list[str | int], error: str
) -> None:
    # Finding the key expired deletes it (logged as DEL by the keyspace):
    # that is no change made by the command, whose error stays the plain
    # one, with nothing but the DEL logged.
    state, persistence = load(tmp_path)
    run(state, persistence, "TWRITE", "s", "a")
    run(state, persistence, "SET", "t", "x")
    deadline = int(time.time() * 1000) + 5
    run(state, persistence, "PEXPIREAT", "s", deadline)
    wait_for(lambda: time.time() * 1000 > deadline + 1)
    size = (tmp_path / "appendonly.aof").stat().st_size
    reply = run(state, persistence, *argv)
    assert isinstance(reply, Error) and reply.message == error
    assert (tmp_path / "appendonly.aof").read_bytes()[size:] == encode_command([b"DEL", b"s"])
    assert state.stats.expired_keys == 1


def test_ttl_survives_a_restart_before_its_deadline(tmp_path: Path) -> None:
    state, persistence = load(tmp_path)
    deadline = now_ms() + 60_000
    for _key, commands in ttl_variants(deadline):
        for command in commands:
            run(state, persistence, *command)
    for command in AFTER_TTL:
        execute(state, ClientState(authenticated=True), [str(a).encode() for a in command])
    assert persistence.flush()
    expected = dict(state.keyspace.expires)
    again, _ = load(tmp_path)
    assert again.keyspace.expires == expected
    assert again.keyspace.get(b"k-append") == b"vx"


@pytest.mark.parametrize("how", ["save", "bgrewriteaof"])
def test_expired_but_not_deleted_keys_in_a_snapshot_expire_after_loading(
    tmp_path: Path, how: str
) -> None:
    """SAVE and an AOF rewrite both write a key whose deadline passed but
    that nobody touched yet. Loading keeps it (with its deadline) and then
    it expires; commands logged after the rewrite replay onto it."""
    state, persistence = load(tmp_path, appendonly="yes" if how == "bgrewriteaof" else "no")
    run(state, persistence, "SET", "k", "v", "PX", 200)
    run(state, persistence, "TWRITE", "s", "a")
    run(state, persistence, "PEXPIRE", "s", 200)
    run(state, persistence, "SET", "plain", "p")
    deadline = max(state.keyspace.expires.values())
    wait_for(lambda: now_ms() > deadline + 5)
    assert len(state.keyspace.data) == 3  # expired, but not yet deleted
    if how == "save":
        assert persistence.save() == "OK"
    else:
        persistence.bgrewriteaof()
        finish_rewrite(persistence)
        assert persistence.info()["aof_last_bgrewrite_status"] == "ok"
        assert (tmp_path / "appendonly.aof").read_bytes().startswith(b"RCP11SNAP")
    persistence.shutdown("nosave")
    loaded, reloaded = load(tmp_path, appendonly="yes" if how == "bgrewriteaof" else "no")
    assert set(loaded.keyspace.data) == {b"k", b"s", b"plain"}
    assert loaded.keyspace.expires.get(b"k", 0) <= now_ms()
    assert run(loaded, reloaded, "GET", "k") is None
    assert run(loaded, reloaded, "EXISTS", "s") == 0
    assert run(loaded, reloaded, "GET", "plain") == b"p"


# ---------------------------------------------------------------------------
# Through a real server: the reproduction of issue 8, with kill -9
# ---------------------------------------------------------------------------


def issue_reproduction(client: redis.Redis, ttl_ms: int) -> int:
    """TWRITE s a; PEXPIRE s ttl; TWRITE s b; SET k v; PEXPIRE k ttl;
    APPEND k x. Returns the latest deadline (unix ms)."""
    assert tw(client, "s", "a") == 0
    assert client.pexpire("s", ttl_ms)
    assert tw(client, "s", "b") == 1
    assert client.set("k", "v")
    assert client.pexpire("k", ttl_ms)
    assert client.append("k", "x") == 2
    return now_ms() + ttl_ms


@pytest.mark.slow
def test_kill9_then_restart_after_the_deadline_resurrects_nothing(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always")
    deadline = issue_reproduction(srv.client(), 1500)
    srv.kill9()
    wait_for(lambda: now_ms() > deadline + 50)
    srv.start()
    client = srv.client()
    assert client.get("k") is None
    assert client.exists("s", "k") == 0
    assert tr(client, "s", 0, 2) == []  # no stream: nothing to read
    # The expiry was logged: a second restart (kill -9 again) agrees.
    srv.kill9()
    srv.start()
    client = srv.client()
    assert client.exists("s", "k") == 0


@pytest.mark.slow
def test_kill9_then_restart_before_the_deadline_keeps_ttls_and_offsets(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always")
    issue_reproduction(srv.client(), 60_000)
    srv.kill9()
    srv.start()
    client = srv.client()
    assert client.get("k") == b"vx"
    assert 0 < client.pttl("k") <= 60_000
    assert 0 < client.pttl("s") <= 60_000
    assert tr(client, "s", 0, 2) == [b"a", b"b"]
    assert tw(client, "s", "c") > 1
    # Expiring later still works, and is kept across another restart.
    client.pexpire("k", 1)
    wait_for(lambda: client.exists("k") == 0)
    srv.restart()
    assert srv.client().get("k") is None


@pytest.mark.slow
def test_redis_cli_ttl_survives_kill9(server_factory) -> None:
    from conftest import require

    require("redis-cli")
    import subprocess

    srv = server_factory(appendonly="yes", appendfsync="always")

    def cli(*args: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(srv.port), *args], capture_output=True, text=True, timeout=20
        )
        return done.stdout.strip()

    assert cli("SET", "k", "v") == "OK"
    assert cli("EXPIRE", "k", "1") == "1"
    assert cli("APPEND", "k", "x") == "2"
    deadline = now_ms() + 1000
    srv.kill9()
    wait_for(lambda: now_ms() > deadline + 50)
    srv.start()
    assert cli("EXISTS", "k") == "0"
    assert cli("GET", "k") == ""


@pytest.mark.slow
def test_redis_py_sees_no_stale_value(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    client = srv.client()
    client.set("k", "v", px=800)
    client.incr("n")
    client.pexpire("n", 800)
    client.incr("n")
    deadline = now_ms() + 800
    srv.kill9()
    wait_for(lambda: now_ms() > deadline + 50)
    srv.start()
    client = srv.client()
    assert client.mget("k", "n") == [None, None]
    wait_for(lambda: client.dbsize() == 0)  # the cron deletes what nobody reads
