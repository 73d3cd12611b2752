"""The command layer's one entry point for a connection's requests.

    index, out_bytes, stop = run_pipeline(state, client, commands, index, out, out_bytes, mark)

The server's Connection parses a read into commands and hands them here;
it knows no command name and formats no reply. run_pipeline() runs them in
order, appends each reply's RESP bytes to `out`, and returns where it
stopped and why (Stop), so the connection can apply its own policies
between commands (output limits, backpressure, taking turns) and call again
from `index`.

Each command goes through core.execute() (core.check() is the one
refusal function). The C lane (lane.py, src/lane.c) sits in front of this:
it runs the TWRITEs and TREADs (a BLOCK one when it answers at once) at
the start of a read straight from the read buffer, and the connection
hands the rest, parsed, to this function.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from rcp11 import errors
from rcp11.commands.core import BLOCKED, DEFERRED, count_error, execute
from rcp11.limits import COMMANDS_BETWEEN_CLOCKS, LANE_RUN_REPLY_BYTES
from rcp11.logs import show_arg
from rcp11.resp import Error, Parts, encode, encode_raw_error
from rcp11.state import ClientState, ServerState

log = logging.getLogger("rcp11")


class Stop(enum.Enum):
    """Why run_pipeline() returned."""

    DONE = "done"  # every command ran
    # The replies appended passed `mark`: look at the client's output
    # limits, then call again (or hold the rest).
    OUTPUT = "output"
    # COMMANDS_BETWEEN_CLOCKS commands ran, or LANE_RUN_REPLY_BYTES of
    # replies were built (or a run of many): read the clock, then call again (or let other clients have their turn).
    CLOCK = "clock"
    # The last command ran left the client waiting (a blocked read) or sent
    # no reply (SHUTDOWN), or the command at index waits for a wake-up to
    # end (DEFERRED): the rest waits until the client is resumed.
    BLOCKED = "blocked"
    # The client is closing (QUIT, CLIENT KILL): nothing more runs.
    CLOSING = "closing"


def run_pipeline(
    state: ServerState,
    client: ClientState,
    commands: list[list[bytes]],
    index: int,
    out: list[bytes],
    out_bytes: int,
    mark: int,
) -> tuple[int, int, Stop]:
    """Run commands[index:] for client, appending each reply's bytes to out
    (out_bytes: how many bytes out holds so far). Before each command,
    returns once out_bytes passed mark, or to read the clock after
    COMMANDS_BETWEEN_CLOCKS commands or LANE_RUN_REPLY_BYTES of replies
    (60 GETs of 1 MB under a high output limit were one 60 MB stretch).
    Returns (the index of the first command not run, out_bytes
    now, why it stopped)."""
    total = len(commands)
    countdown = COMMANDS_BETWEEN_CLOCKS
    clock_at = out_bytes + LANE_RUN_REPLY_BYTES
    while index < total:
        if out_bytes > mark:
            return index, out_bytes, Stop.OUTPUT
        countdown -= 1
        if not countdown or out_bytes > clock_at:
            return index, out_bytes, Stop.CLOCK
        argv = commands[index]
        try:
            reply = execute(state, client, argv)
        except Exception as exc:  # a bug in dispatch must not kill the server
            log.exception("Error running %s", show_arg(argv[0]))
            reply = Error(errors.internal_error_running(exc))
            count_error(state, reply.message)
        if reply is DEFERRED:  # not run: sent again once the wake-up is over
            return index, out_bytes, Stop.BLOCKED
        index += 1
        if reply is BLOCKED:
            return index, out_bytes, Stop.BLOCKED
        if type(reply) is Parts:
            out.extend(reply.parts)
            out_bytes += reply.size
        else:
            data = encode(reply, client.resp == 3)
            out.append(data)
            out_bytes += len(data)
        if client.closing:
            return index, out_bytes, Stop.CLOSING
    return index, out_bytes, Stop.DONE


def protocol_error_reply(state: ServerState, message: str) -> bytes:
    """The reply to bytes that are not a request (the connection then
    closes), counted as an error reply."""
    count_error(state, "ERR")
    return encode_raw_error(errors.err(message))


def late_reply(client: ClientState, reply: Any) -> bytes:
    """A reply produced outside the client's pipeline (a blocked read
    served, a MONITOR line), encoded for the client's protocol."""
    return encode(reply, client.resp == 3)


__all__ = ["Stop", "late_reply", "protocol_error_reply", "run_pipeline"]
