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


# A queued command's request, encoded when it was queued (lane commands).
_request = operator.itemgetter(2)


@command("exec", 1, "noscript loading stale", summary="Run a transaction", group="transactions")
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
    outside_lane = client.queued_outside_lane
    end_transaction(state, client)
    # Everything the transaction propagates goes to the log between MULTI
    # and EXEC, so a replay applies it all or nothing; a transaction that
    # changed nothing logs nothing. Blocking commands answer at once.
    # Each reply is encoded as its command runs and held to the client's
    # output limit (Redis's addReply checks it the same way): a client past
    # it is closed, and the rest of the transaction runs for what it changes
    # without building replies nobody will read.
    resp3 = client.resp == 3
    replies: list[bytes] = []
    size = 0
    room = client.output_room()
    # Runs of queued TWRITEs and TREADs go through the C lane (lane.py
    # run_queued): 100k of them took 1.1 s on the general path, every
    # other client waiting. Where the lane stops, the general path runs the
    # command; after a run of none the lane is left alone for a while
    # (doubling), so a transaction it cannot help costs no more.
    lane = lane_open(state, client, in_exec=True)
    lane_from = 0
    backoff = 1
    total = len(queued)
    i = 0
    denied, client.deny_blocking = client.deny_blocking, True
    try:
        with state.transaction_log():
            while i < total:
                cmd, cmd_argv, _ = queued[i]
                if client.output_dropped:
                    if not cmd.changes_nothing(cmd_argv):
                        call(state, client, cmd, cmd_argv)
                    i += 1
                    continue
                ran = 0
                if lane and i >= lane_from and cmd.in_lane:
                    end = min(i + EXEC_WINDOW, total)
                    after = bisect.bisect_left(outside_lane, i)  # where this run of them ends
                    if after < len(outside_lane):
                        end = min(end, outside_lane[after])
                    mark = None if room is None else room - size
                    requests = b"".join(map(_request, queued[i:end]))
                    ran, data = run_queued(state, client, requests, mark)
                    if ran:
                        backoff = 1
                    else:
                        lane_from = i + backoff
                        backoff = min(2 * backoff, EXEC_WINDOW)
                if ran:
                    i += ran
                else:
                    data = encode(call(state, client, cmd, cmd_argv), resp3)
                    i += 1
                replies.append(data)
                size += len(data)
                client.output_building = size
                if room is not None and size > room and not client.output_dropped:
                    client.output_overflow(0)  # what it holds is output_building
                    client.output_dropped = True
    finally:
        client.deny_blocking = denied
        client.output_building = 0
    if client.output_dropped:
        return NULL_ARRAY  # never sent
    header = array_header(total)
    return Parts([header, *replies], len(header) + size)


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
