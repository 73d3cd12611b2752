"""A pipeline of TWRITEs costs time linear in its length, whatever disables
the one-append run fast path (issue 8, item 3).

execute_run() used to scan up to 64 KB of the pipeline ahead before it
checked what refuses a run, and the server calls it for every TWRITE: with
a reader blocked on any key, maxmemory set, a TTL, or inside MULTI, 100k
pipelined TWRITEs read ~n^2/2 commands (820k/s fell to 2.7k/s; queuing them
in MULTI took 40 s). Counted here, not timed: a list that counts how often
the dispatch loop reads it.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import dispatch_read

from rcp11.commands import BLOCKED, execute, execute_run
from rcp11.config import Config
from rcp11.state import ClientState, ServerState


class CountingList(list):
    """A pipeline that counts the commands read from it."""

    reads = 0

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        self.reads += len(item) if isinstance(index, slice) else 1
        return item


def fresh() -> tuple[ServerState, ClientState]:
    state = ServerState(Config())
    client = ClientState(authenticated=True)
    assert execute(state, client, [b"TWRITE", b"pk", b"first"]) == 0
    return state, client


def block_reader(state: ServerState, key: bytes, offset: bytes = b"0") -> ClientState:
    reader = ClientState(authenticated=True)
    assert execute(state, reader, [b"TREAD", key, offset, b"1", b"BLOCK", b"0"]) is BLOCKED
    return reader


def maxmemory(state: ServerState, client: ClientState) -> None:
    state.config.set("maxmemory", "1gb")


def multi(state: ServerState, client: ClientState) -> None:
    execute(state, client, [b"MULTI"])


def ttl(state: ServerState, client: ClientState) -> None:
    execute(state, client, [b"EXPIRE", b"pk", b"1000"])


def reader_elsewhere(state: ServerState, client: ClientState) -> None:
    block_reader(state, b"other")


def reader_on_the_stream(state: ServerState, client: ClientState) -> None:
    block_reader(state, b"pk", b"1")


def nothing(state: ServerState, client: ClientState) -> None:
    pass


@pytest.mark.parametrize(
    "condition", [nothing, maxmemory, multi, ttl, reader_elsewhere, reader_on_the_stream]
)
def test_pipeline_reads_are_linear_whatever_disables_runs(condition: Any) -> None:
    per_command = []
    for n in (1_000, 4_000):
        state, client = fresh()
        condition(state, client)
        commands = CountingList([[b"TWRITE", b"pk", b"x"] for _ in range(n)])
        replies = dispatch_read(state, client, commands)
        assert len(replies) == n
        per_command.append(commands.reads / n)
    # Each command is read a bounded number of times (a scan that runs its
    # run reads each follower once more), the same for a 4x longer pipeline.
    assert per_command[0] <= 4 and per_command[1] <= 4, per_command


def test_a_reader_blocked_on_another_stream_keeps_runs() -> None:
    state, client = fresh()
    reader = block_reader(state, b"other")
    commands = [[b"TWRITE", b"pk", b"x"] for _ in range(100)]
    assert execute_run(state, client, commands, 0) == list(range(1, 101))
    assert reader.blocked is not None  # still waiting, nothing for it


def test_runs_stop_short_of_the_largest_offset() -> None:
    state, client = fresh()
    stream = state.keyspace.data[b"pk"]
    stream.raise_next_offset(2**63 - 3)  # room for three more offsets
    commands = [[b"TWRITE", b"pk", b"x"] for _ in range(5)]
    replies = dispatch_read(state, client, commands)
    assert replies[:3] == [2**63 - 3, 2**63 - 2, 2**63 - 1]
    assert all("exceed" in reply.message for reply in replies[3:])
