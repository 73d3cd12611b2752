"""MULTI EXEC DISCARD WATCH UNWATCH."""

from __future__ import annotations

import bisect
import operator
from typing import Any

from rcp11 import errors
from rcp11.commands.core import call, end_transaction, unwatch_all
from rcp11.commands.lane import EXEC_WINDOW, lane_open, run_queued
from rcp11.commands.table import command
from rcp11.errors import CommandError
from rcp11.resp import NULL_ARRAY, OK, Parts, array_header, encode
from rcp11.state import ClientState, ServerState


@command(
    "multi", 1, "noscript loading stale fast", summary="Start a transaction", group="transactions"
)
def multi_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is not None:
        raise CommandError(errors.NESTED_MULTI)
    client.queued = []
    client.queued_outside_lane = []
    client.queued_write = client.queued_denyoom = False
    client.multi_error = False
    return OK


@command(
    "discard",
    1,
    "noscript loading stale fast",
    summary="Discard a transaction",
    group="transactions",
)
def discard_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is None:
        raise CommandError(errors.DISCARD_WITHOUT_MULTI)
    end_transaction(state, client)
    return OK


@command(
    "exec",
    1,
    "noscript loading stale skip_slowlog",
    summary="Run a transaction",
    group="transactions",
)
def exec_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    queued = client.queued
    if queued is None:
        raise CommandError(errors.EXEC_WITHOUT_MULTI)
    if client.multi_error:
        end_transaction(state, client)
        raise CommandError(errors.EXEC_ABORT)
    if client.dirty_cas:
        end_transaction(state, client)
        return NULL_ARRAY
    # MISCONF and OOM were checked for all of them when EXEC itself was
    # (core.check).
    run = _Run(state, client, queued, client.queued_outside_lane)
    end_transaction(state, client)
    # Everything the transaction propagates goes to the log between MULTI
    # and EXEC, so a replay applies it all or nothing; a transaction that
    # changed nothing logs nothing. Blocking commands answer at once.
    denied, client.deny_blocking = client.deny_blocking, True
    try:
        with state.transaction_log():
            run.run()
    finally:
        client.deny_blocking = denied
        client.output_building = 0
    if client.output_dropped:
        return NULL_ARRAY  # never sent
    header = array_header(len(queued))
    return Parts([header, *run.replies], len(header) + run.size)


# A queued command's request, encoded when it was queued (lane commands).
_request = operator.itemgetter(2)


class _Run:
    """One EXEC running its queued commands.

    Each reply is encoded as its command runs and held to the client's
    output limit (Redis's addReply checks it the same way): a client past
    it is closed, and the rest of the transaction runs for what it changes
    without building replies nobody will read.

    Runs of queued TWRITEs and TREADs go through the C lane (lane.py
    run_queued): 100k of them took 1.1 s on the general path, every other
    client waiting. Where the lane stops, the general path runs the command;
    after a run of none the lane is left alone for a doubling number of
    commands, so a transaction it cannot help costs no more."""

    def __init__(
        self,
        state: ServerState,
        client: ClientState,
        queued: list[tuple[Any, list[bytes], bytes | None]],
        outside_lane: list[int],
    ) -> None:
        self.state = state
        self.client = client
        self.queued = queued
        self.outside_lane = outside_lane  # indexes of the commands the lane does not run
        self.replies: list[bytes] = []
        self.size = 0
        self.room = client.output_room()
        self.lane = False  # run() asks, once the client left MULTI
        self.lane_from = 0
        self.backoff = 1

    def run(self) -> None:
        state, client, queued = self.state, self.client, self.queued
        resp3 = client.resp == 3
        self.lane = lane_open(state, client, in_exec=True)
        i = 0
        while i < len(queued):
            cmd, argv, _ = queued[i]
            if client.output_dropped:
                if not cmd.changes_nothing(argv):
                    call(state, client, cmd, argv)
                i += 1
                continue
            ran, data = self._in_lane(i) if cmd.in_lane else (0, b"")
            if ran:
                i += ran
            else:
                data = encode(call(state, client, cmd, argv), resp3)
                i += 1
            self._hold(data)

    def _in_lane(self, i: int) -> tuple[int, bytes]:
        """The lane's go at the run of lane commands from i: how many ran,
        their replies."""
        if not self.lane or i < self.lane_from:
            return 0, b""
        end = min(i + EXEC_WINDOW, len(self.queued))
        after = bisect.bisect_left(self.outside_lane, i)  # where this run ends
        if after < len(self.outside_lane):
            end = min(end, self.outside_lane[after])
        mark = None if self.room is None else self.room - self.size
        requests = b"".join(map(_request, self.queued[i:end]))
        ran, data = run_queued(self.state, self.client, requests, mark)
        if ran:
            self.backoff = 1
        else:
            self.lane_from = i + self.backoff
            self.backoff = min(2 * self.backoff, EXEC_WINDOW)
        return ran, data

    def _hold(self, data: bytes) -> None:
        """Keep replies, and close the client once they pass its limit."""
        client = self.client
        self.replies.append(data)
        self.size += len(data)
        client.output_building = self.size
        if self.room is not None and self.size > self.room and not client.output_dropped:
            client.output_overflow(0)  # what it holds is output_building
            client.output_dropped = True


@command("watch", -2, "noscript loading stale fast", summary="Watch keys", group="transactions")
def watch_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is not None:
        raise CommandError(errors.WATCH_IN_MULTI)
    for key in argv[1:]:
        state.keyspace.watchers.setdefault(key, set()).add(client)
        client.watched.add(key)
    return OK


@command(
    "unwatch", 1, "noscript loading stale fast", summary="Forget watched keys", group="transactions"
)
def unwatch_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    unwatch_all(state, client)
    return OK
