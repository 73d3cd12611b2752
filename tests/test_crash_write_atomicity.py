"""A handler that raises after it changed data must not leave a change that
memory holds and the AOF lacks (issue 8, item 1).

The bug: a request the parser let through stored "AB" in a stream, then the
handler raised; the change was neither logged nor undone, the client got an
error, and after kill -9 a later acknowledged write moved to another offset
and the next write reused one. Dispatch (commands.core.call) now sees that
the handler changed data and logs the command itself, wrapped in MULTI ...
EXEC, so a replay redoes the same change; when even that cannot be logged,
writes are refused until a restart.

Each test injects an exception right after a real mutation (monkeypatch) and
checks that the reply says so, that memory holds the change, and that the
AOF, replayed into a fresh server with the same (deterministic) bug,
rebuilds exactly that memory.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hiredis
import pytest
from conftest import ServerProcess, persistence_in_process

from rcp11 import errors
from rcp11.commands import execute, transactions
from rcp11.persistence import Persistence
from rcp11.resp import Error, encode
from rcp11.state import ClientState, Keyspace, ServerState
from rcp11.storage import Stream


class Injected(RuntimeError):
    """The bug a test plants in a handler."""


def run(state: ServerState, client: ClientState, *args: Any) -> Any:
    argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    reply = execute(state, client, argv)
    state.persistence.flush()  # what the server does before any reply leaves
    return reply


def memory(state: ServerState) -> dict[bytes, Any]:
    """Everything a client could read: strings, and each stream's offsets
    and messages."""
    out: dict[bytes, Any] = {}
    for key, value in state.keyspace.data.items():
        if isinstance(value, bytes):
            out[key] = value
        else:
            out[key] = (value.first_offset, value.next_offset, value.read(0, value.next_offset))
    return out


@pytest.fixture
def server_state(tmp_path: Path) -> Iterator[tuple[ServerState, ClientState]]:
    state, persistence = persistence_in_process(tmp_path, appendonly="yes", appendfsync="always")
    persistence.load()
    yield state, ClientState(authenticated=True)


def replayed(tmp_path: Path) -> ServerState:
    state, persistence = persistence_in_process(tmp_path, appendonly="yes", appendfsync="always")
    persistence.load()
    return state


def after(method: Callable[..., Any], when: Callable[..., bool]) -> Callable[..., Any]:
    """method, but raising Injected once it has done its work, if when(*args)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        if when(*args, **kwargs):
            raise Injected("planted after the change")
        return result

    return wrapper


def poisoned_entries(_self: Stream, entries: Any, *_when: Any) -> bool:
    return b"poison" in list(entries)


# (name, commands run first, the command that fails, what to patch and when)
SCENARIOS: list[tuple[str, list[list[str]], list[str], Any, str, Callable[..., bool]]] = [
    (
        "twrite-append",
        [["TWRITE", "k", "a"]],
        ["TWRITE", "k", "poison"],
        Stream,
        "append",
        poisoned_entries,
    ),
    (
        "twrite-entries-new-stream",
        [],
        ["TWRITE", "n", "ENTRIES", "x", "poison"],
        Keyspace,
        "set",
        lambda _ks, key, value, *a, **kw: key == b"n",
    ),
    (
        "twrite-backlog-evict",
        [["TWRITE", "k", "ENTRIES", "a", "b", "c"]],
        ["TWRITE", "k", "BACKLOG", "2", "ENTRIES", "d"],
        Stream,
        "evict_keep",
        lambda _s, keep: keep == 2,
    ),
    (
        "set",
        [["SET", "s", "old"]],
        ["SET", "s", "poison"],
        Keyspace,
        "set",
        lambda _ks, key, value, *a, **kw: value == b"poison",
    ),
    (
        "tevict",
        [["TWRITE", "k", "ENTRIES", "a", "b", "c", "d"]],
        ["TEVICT", "k", "1"],
        Stream,
        "evict_upto",
        lambda _s, offset: offset == 1,
    ),
    (
        "group-read",
        [["TWRITE", "k", "ENTRIES", "a", "b", "c"]],
        ["TREAD", "k", "0", "2", "GROUP", "g"],
        Keyspace,
        "set",
        lambda _ks, key, value, *a, **kw: key == b"g",
    ),
    (
        "touch-after-append",
        [["TWRITE", "k", "a"]],
        ["TWRITE", "k", "b"],
        Keyspace,
        "touch",
        lambda ks, key, *a, **kw: key == b"k" and ks.data[key].next_offset == 2,
    ),
]


@pytest.mark.parametrize(
    ("name", "setup", "failing", "owner", "method", "when"),
    SCENARIOS,
    ids=[s[0] for s in SCENARIOS],
)
def test_change_before_an_exception_is_kept_logged_and_replayed(
    tmp_path: Path,
    server_state: tuple[ServerState, ClientState],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    setup: list[list[str]],
    failing: list[str],
    owner: Any,
    method: str,
    when: Callable[..., bool],
) -> None:
    state, client = server_state
    for argv in setup:
        assert type(run(state, client, *argv)) is not Error, argv
    before = memory(state)
    monkeypatch.setattr(owner, method, after(getattr(owner, method), when))
    reply = run(state, client, *failing)
    assert type(reply) is Error
    assert "changed data; the change is kept and logged" in reply.message
    now = memory(state)
    assert now != before  # the change happened and stays
    assert state.writes_refused is None  # nothing needed refusing
    # A clean shutdown writes the reservation marks tight, so the restart
    # shows no gap of null offsets (a kill -9 would: test_crash.py).
    assert state.persistence.shutdown("nosave")
    # The AOF rebuilds the same memory, the bug included (handlers are
    # deterministic; the loader replays past the logged failure)...
    assert memory(replayed(tmp_path)) == now
    monkeypatch.undo()
    # ...and so does a server where the bug is fixed.
    assert memory(replayed(tmp_path)) == now
    # Later writes continue after the change: no offset is handed out twice.
    if "k" in failing or "n" in failing:
        key = failing[1]
        offset = run(state, client, "TWRITE", key, "after")
        assert offset == now[key.encode()][1]


def test_failure_inside_exec_is_logged_inside_its_transaction(
    tmp_path: Path,
    server_state: tuple[ServerState, ClientState],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, client = server_state
    monkeypatch.setattr(Stream, "append", after(Stream.append, poisoned_entries))
    # The general path's protection is under test: EXEC would otherwise run
    # these TWRITEs in the C lane, which never raises half way.
    monkeypatch.setattr(transactions, "lane_open", lambda *args, **kw: False)
    run(state, client, "MULTI")
    for value in ("x", "poison", "y"):
        run(state, client, "TWRITE", "k", value)
    reader = hiredis.Reader()
    reader.feed(encode(run(state, client, "EXEC"), False))
    replies = reader.gets()
    assert replies[0] == 0 and replies[2] == 2
    assert isinstance(replies[1], hiredis.ReplyError) and "kept and logged" in str(replies[1])
    now = memory(state)
    assert now[b"k"][2] == [b"x", b"poison", b"y"]
    assert state.persistence.shutdown("nosave")  # tight marks: no gap at restart
    assert memory(replayed(tmp_path)) == now
    aof = (tmp_path / "appendonly.aof").read_bytes()
    assert aof.count(b"MULTI") == 1 and aof.count(b"EXEC") == 1


def test_exception_before_any_change_logs_nothing(
    tmp_path: Path,
    server_state: tuple[ServerState, ClientState],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, client = server_state
    run(state, client, "TWRITE", "k", "a")
    size = (tmp_path / "appendonly.aof").stat().st_size

    def broken(*_args: Any) -> int:
        raise Injected("planted before the change")

    monkeypatch.setattr(Stream, "append", broken)
    reply = run(state, client, "TWRITE", "k", "b")
    assert type(reply) is Error and reply.message.startswith("ERR internal error in 'twrite'")
    assert "changed data" not in reply.message
    assert (tmp_path / "appendonly.aof").stat().st_size == size
    assert memory(state)[b"k"] == (0, 1, [b"a"])


def test_change_that_cannot_be_logged_refuses_every_later_write(
    server_state: tuple[ServerState, ClientState],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, client = server_state
    run(state, client, "TWRITE", "k", "a")
    monkeypatch.setattr(Stream, "append", after(Stream.append, poisoned_entries))
    persistence = state.persistence
    assert isinstance(persistence, Persistence)

    def refuse(argv: list[bytes]) -> None:
        raise Injected("the AOF buffer is broken")

    monkeypatch.setattr(persistence, "propagate", refuse)
    reply = run(state, client, "TWRITE", "k", "poison")
    assert type(reply) is Error and "could not be logged" in reply.message
    monkeypatch.undo()
    assert state.writes_refused == errors.UNLOGGED_CHANGE
    for argv in (["TWRITE", "k", "c"], ["SET", "s", "v"], ["TREAD", "k", "0", "1", "GROUP", "g"]):
        assert run(state, client, *argv) == Error(errors.UNLOGGED_CHANGE), argv
    run(state, client, "MULTI")
    assert run(state, client, "TWRITE", "k", "c") == Error(errors.UNLOGGED_CHANGE)
    assert run(state, client, "EXEC") == Error(errors.EXEC_ABORT)
    assert memory(state)[b"k"] == (0, 2, [b"a", b"poison"])
    assert type(run(state, client, "TREAD", "k", "0", "5")) is not Error  # reads still work


# -- over the network: kill -9 and restart, offsets never reused -----------------------

# The bug is planted in Stream.append, which the TWRITE handler calls; the
# C lane appends in C without it, so the lane is kept out (lane_open).
LAUNCHER = """
import sys
from rcp11 import storage
from rcp11.commands import lane
from rcp11.server import main

lane.lane_open = lambda state, client: False

original = storage.Stream.append


def append(self, entries, now_ms=None):
    first = original(self, entries, now_ms)
    if b"poison" in list(entries):
        raise RuntimeError("a handler bug after the append")
    return first


storage.Stream.append = append
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_failed_write_keeps_its_offsets_across_kill9(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    launcher = tmp_path / "buggy_server.py"
    launcher.write_text(LAUNCHER)
    # The poison must reach the Python handler: no C lane, in Python
    # (lane_open) or in the C loop (lane-sockets no).
    srv = server_factory(start=False, appendonly="yes", appendfsync="always", lane_sockets="no")
    srv.program = lambda: [sys.executable, str(launcher)]  # type: ignore[method-assign]
    srv.start()
    client = srv.client()
    assert client.execute_command("TWRITE", "k", "a") == 0
    with pytest.raises(Exception, match="the change is kept and logged"):
        client.execute_command("TWRITE", "k", "poison")
    assert client.execute_command("TWRITE", "k", "c") == 2
    assert client.execute_command("TREAD", "k", 0, 10) == [b"a", b"poison", b"c"]
    srv.kill9()
    srv.start()
    client = srv.client()
    # After a kill -9 the offsets above the last write up to the stream's
    # reservation read as null (docs/PROTOCOL.md section 8): never reused.
    assert client.execute_command("TREAD", "k", 0, 3) == [b"a", b"poison", b"c"]
    assert client.execute_command("TWRITE", "k", "d") >= 3
