"""SLOWLOG, LATENCY and ROLE, in redis-server 7's reply shapes, and
note_slow(): what the dispatch (core.call, the C lane) does with a command
that ran at least state.slow_usec microseconds (rcp11/diagnostics.py keeps
the slow log and the latency events)."""

from __future__ import annotations

from typing import Any

from rcp11 import errors
from rcp11.commands.args import check_subcommand, config_value, parse_int, text
from rcp11.commands.table import Command, command
from rcp11.errors import CommandError
from rcp11.resp import OK, SimpleString, Verbatim
from rcp11.state import ClientState, ServerState


def note_slow(
    state: ServerState, client: ClientState, cmd: Command | None, argv: list[bytes], usec: int
) -> None:
    """A command ran usec microseconds, at least state.slow_usec: into the
    slow log and the latency monitor, as their thresholds say."""
    slower_than = int(config_value(state, "slowlog-log-slower-than", 10000))
    if 0 <= slower_than <= usec and (cmd is None or "skip_slowlog" not in cmd.flags):
        shown = argv if cmd is None or cmd.redact is None else cmd.redact(argv)
        where = f"unix:{client.unix_path}" if client.unix_path else client.addr
        max_len = int(config_value(state, "slowlog-max-len", 128))
        state.slowlog.add(shown, usec, where, client.name, max_len)
    threshold_ms = int(config_value(state, "latency-monitor-threshold", 0))
    ms = usec // 1000
    if threshold_ms and ms >= threshold_ms:
        fast = cmd is not None and "fast" in cmd.flags
        state.latency.add("fast-command" if fast else "command", ms)


# ---------------------------------------------------------------------- SLOWLOG

_SLOWLOG_HELP = [
    "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET [<count>]",
    "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
    "    Entries are made of:",
    "    id, timestamp, time in microseconds, arguments array, client IP and port,",
    "    client name",
    "LEN",
    "    Return the length of the slowlog.",
    "RESET",
    "    Reset the slowlog.",
    "HELP",
    "    Prints this help.",
]


@command("slowlog", -2, "", summary="The slow log", group="server")
def slowlog_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = check_subcommand("slowlog", {"get": -2, "len": 2, "reset": 2, "help": 2}, argv)
    if sub == "get":
        if len(argv) > 3:
            raise CommandError(errors.subcommand_syntax(text(argv[1]), "slowlog"))
        count = 10
        if len(argv) == 3:
            count = parse_int(argv[2], errors.SLOWLOG_COUNT)
            if count < -1:
                raise CommandError(errors.SLOWLOG_COUNT)
        return state.slowlog.get(count)
    if sub == "len":
        return len(state.slowlog.entries)
    if sub == "reset":
        state.slowlog.reset()
        return OK
    return [SimpleString(line) for line in _SLOWLOG_HELP]


# ---------------------------------------------------------------------- LATENCY

_LATENCY_HELP = [
    "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DOCTOR",
    "    Return a human readable latency analysis report.",
    "HISTORY <event>",
    "    Return time-latency samples for the <event> class.",
    "LATEST",
    "    Return the latest latency samples for all events.",
    "RESET [<event> ...]",
    "    Reset latency data of one or more <event> classes.",
    "    (default: reset all data for all event classes)",
    "HELP",
    "    Prints this help.",
]


def _doctor(state: ServerState) -> str:
    """LATENCY DOCTOR's report: plain lines, one paragraph per event."""
    threshold = int(config_value(state, "latency-monitor-threshold", 0))
    if not threshold:
        return (
            "Latency monitoring is off: no event is recorded. Turn it on with "
            "CONFIG SET latency-monitor-threshold <milliseconds> (commands that run at "
            "least that long are recorded as 'command' or 'fast-command').\n"
        )
    events = state.latency.events
    if not events:
        return (
            f"No latency spike of {threshold} ms or more was observed since the server "
            "started (or since LATENCY RESET).\n"
        )
    lines = [f"Latency spikes of {threshold} ms or more, by event:", ""]
    for name, event in events.items():
        values = [ms for _, ms in event.samples]
        first = event.samples[0][0]
        spikes = f"{len(values)} latency spike" + ("" if len(values) == 1 else "s")
        lines.append(
            f"{name}: {spikes} (average {sum(values) // len(values)} ms, "
            f"highest {event.max_ms} ms, latest {event.latest[1]} ms) in the last "
            f"{max(event.latest[0] - first, 0)} s of samples."
        )
    lines += [
        "",
        "'command' is a command that ran slowly: SLOWLOG GET shows which ones and their "
        "arguments. 'fast-command' is one of the commands that usually take constant time "
        "(GET, TREAD of a few messages...): the machine itself may be slow (swapping, "
        "CPU starved), or the server was busy with the command's whole batch.",
    ]
    return "\n".join(lines) + "\n"


@command("latency", -2, "", summary="The latency monitor", group="server")
def latency_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = check_subcommand(
        "latency", {"latest": 2, "history": 3, "reset": -2, "doctor": 2, "help": 2}, argv
    )
    if sub == "latest":
        return state.latency.latest()
    if sub == "history":
        return state.latency.history(text(argv[2]))
    if sub == "reset":
        return state.latency.reset([text(name) for name in argv[2:]])
    if sub == "doctor":
        return Verbatim("txt", _doctor(state))
    return [SimpleString(line) for line in _LATENCY_HELP]


# ---------------------------------------------------------------------- ROLE


@command("role", 1, "noscript loading stale fast", summary="The replication role", group="server")
def role_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """A primary with no replicas at replication offset 0 (rcp11-server
    does not replicate; the Redis module build has Redis's own ROLE)."""
    return [b"master", 0, []]
