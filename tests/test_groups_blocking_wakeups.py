"""Blocked readers are woken by every write to their keys, whatever command
made it, and a woken reader's group read goes through the same checks and
write protection as any command (docs/PROTOCOL.md section 3, BLOCK and
consumer groups). In process, through execute(): what clients receive."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import persistence_in_process
from helpers_dispatch import Client, recording_state, run

from rcp11 import errors
from rcp11.commands import BLOCKED, serve_ready
from rcp11.resp import Error, Raw
from rcp11.state import ServerState
from rcp11.storage import Stream


@pytest.fixture
def state() -> ServerState:
    return recording_state()


def test_a_group_read_that_turns_a_key_into_a_string_wakes_readers_of_that_key(
    state: ServerState,
) -> None:
    reader, writer = Client(), Client()
    assert run(state, reader, "TREAD", "g", 0, 1, "BLOCK", 0) is BLOCKED
    assert run(state, writer, "TWRITE", "s", "m") == 0
    # The group read writes its group key "g" (a string now): the reader
    # blocked on the stream "g" must hear it, as it would after SET g x.
    assert run(state, writer, "TREAD", "s", 0, 1, "GROUP", "g") == Raw(b"*1\r\n$1\r\nm\r\n")
    assert reader.received == [Error(errors.WRONGTYPE)]
    assert reader.blocked is None


def test_set_and_a_group_read_wake_alike(state: ServerState) -> None:
    by_set, by_group = Client(), Client()
    writer = Client()
    assert run(state, by_set, "TREAD", "a", 0, 1, "BLOCK", 0) is BLOCKED
    assert run(state, by_group, "TREAD", "b", 0, 1, "BLOCK", 0) is BLOCKED
    run(state, writer, "SET", "a", "x")
    run(state, writer, "TWRITE", "s", "m")
    run(state, writer, "TREAD", "s", 0, 1, "GROUPNEW", "b")
    assert by_set.received == by_group.received == [Error(errors.WRONGTYPE)]


def test_every_kind_of_write_to_a_group_key_rechecks_its_readers(state: ServerState) -> None:
    """A reader waiting in a group re-reads the group's position after any
    write to the group key (here INCR and APPEND, which no key list of a
    blocking command names), and is served from it."""
    reader, writer = Client(), Client()
    run(state, writer, "TWRITE", "s", "ENTRIES", "a", "b", "c")
    run(state, writer, "SET", "g", "3")
    assert run(state, reader, "TREAD", "s", 0, 1, "GROUP", "g", "BLOCK", 0) is BLOCKED
    run(state, writer, "DECR", "g")  # the group steps back to offset 2
    assert reader.received == [Raw(b"*1\r\n$1\r\nc\r\n")]
    assert state.keyspace.get(b"g") == b"3"


def test_a_del_of_many_keys_rechecks_the_readers_of_a_group_key_among_them(
    state: ServerState,
) -> None:
    """DEL signals the keys it deletes in one pass (Keyspace.delete_many):
    the readers waiting in a group whose key is one of thousands deleted
    start again from the first readable message, as after DEL g alone."""
    reader, writer = Client(), Client()
    run(state, writer, "TWRITE", "s", "ENTRIES", "a", "b", "c")
    run(state, writer, "SET", "g", "3")
    assert run(state, reader, "TREAD", "s", 0, 1, "GROUP", "g", "BLOCK", 0) is BLOCKED
    for i in range(3000):
        run(state, writer, "SET", f"k{i}", "v")
    keys = [f"k{i}" for i in range(1500)] + ["g"] + [f"k{i}" for i in range(1500, 3000)]
    assert run(state, writer, "DEL", *keys) == 3001
    assert reader.received == [Raw(b"*1\r\n$1\r\na\r\n")]


def test_a_served_group_read_obeys_misconf(state: ServerState) -> None:
    """Serving a blocked group read writes the group key: while writes are
    refused the reader gets -MISCONF instead of an unlogged move."""
    reader = Client()
    assert run(state, reader, "TREAD", "s", 0, 1, "GROUP", "g", "BLOCK", 0) is BLOCKED
    before = list(state.persistence.log)  # type: ignore[attr-defined]
    state.persistence.refuse = errors.MISCONF  # type: ignore[attr-defined]
    # TWRITE is refused too, so the stream grows the way a replayed AOF
    # does: past dispatch, then signalled.
    stream = Stream()
    stream.append([b"m"])
    state.keyspace.set(b"s", stream)
    serve_ready(state)
    assert reader.received == [Error(errors.MISCONF)]
    assert state.keyspace.get(b"g") == b"0"  # set when it blocked, not moved since
    assert state.persistence.log == before  # type: ignore[attr-defined]


class Injected(RuntimeError):
    """The bug a test plants."""


def test_a_served_group_read_that_raises_after_its_change_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half-applied-write protection covers blocked reads served later: a
    group read that moved its group key and then failed gets its command
    logged, so the AOF rebuilds the moved group."""
    state, persistence = persistence_in_process(tmp_path, appendonly="yes", appendfsync="always")
    persistence.load()
    reader, writer = Client(), Client()
    assert run(state, reader, "TREAD", "s", 0, 1, "GROUP", "g", "BLOCK", 0) is BLOCKED
    persistence.flush()
    keyspace_set = type(state.keyspace).set

    def set_then_fail(self: Any, key: bytes, value: Any, *args: Any, **kw: Any) -> None:
        keyspace_set(self, key, value, *args, **kw)
        if key == b"g" and value == b"1":
            raise Injected("planted after the group moved")

    monkeypatch.setattr(type(state.keyspace), "set", set_then_fail)
    assert run(state, writer, "TWRITE", "s", "m") == 0
    persistence.flush()
    monkeypatch.undo()
    [reply] = reader.received
    assert type(reply) is Error and "the change is kept and logged" in reply.message
    assert state.keyspace.get(b"g") == b"1"
    assert persistence.shutdown("nosave")
    replayed, loader = persistence_in_process(tmp_path, appendonly="yes")
    loader.load()
    assert replayed.keyspace.get(b"g") == b"1"
    assert loader.shutdown("nosave")
