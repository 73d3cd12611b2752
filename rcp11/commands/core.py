"""Dispatch: the one check every command passes, and running it.

Handlers are synchronous and do no I/O: they read and change ServerState,
call state.propagate() for what they changed (in a form whose replay is
deterministic), and return a reply value (see rcp11.resp). A blocking
handler registers a BlockRequest with state.blocking and returns BLOCKED;
the server then sends nothing until the request is served (blocked.py)
and the reply delivered with client.send().

Every path that runs commands goes through here, in Redis's
processCommand()/call() order:

- check() is the one refusal function: arity, authentication, MULTI's
  no-multi commands, MISCONF and OOM (for EXEC: for what its queued commands
  do). execute() (a client's command) and a blocked request being served
  ask it; the C lane (lane.py) runs only what it would let run.
- execute() looks the command up (rename-command), checks it, queues it
  inside MULTI, runs it with call(), then serves blocked clients whose keys
  the command changed.
- call() runs a handler (also EXEC's queued commands and blocked requests):
  counts it, keeps memory and the AOF agreeing when a handler raises after a
  change, and feeds MONITOR clients.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from rcp11 import errors, retention
from rcp11.blocking import BlockRequest
from rcp11.commands.diagnostics import note_slow
from rcp11.commands.table import BY_SPELLING, RENAMED, Command, lookup, lookup_original
from rcp11.errors import CommandError
from rcp11.limits import ERROR_STATS_KINDS
from rcp11.logs import show_arg
from rcp11.resp import QUEUED, Error, SimpleString, encode_command
from rcp11.state import ClientState, ServerState
from rcp11.storage import MUTATIONS

log = logging.getLogger("rcp11")


class _Blocked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


# Returned by execute() when the client now waits; the server sends nothing.
BLOCKED = _Blocked()


class _Deferred:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFERRED"


# Returned by execute() when the command did not run: it meets readers a
# wake-up is still serving (serve_ready). The client waits like a blocked
# one and sends the same command again once they are all served.
DEFERRED = _Deferred()

Runner = Callable[[ServerState, ClientState, list[bytes]], Any]


def execute(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """Run one command for client; returns its reply or BLOCKED."""
    # The hot path of every request: attributes are read once into locals
    # and every check that is usually off is a single boolean test.
    cmd = BY_SPELLING.get(argv[0]) or lookup(argv[0])
    if RENAMED:
        if state.loading:
            cmd = lookup_original(argv[0])  # the AOF holds original names
        elif cmd is not None:
            argv[0] = cmd.name.encode()  # so it is logged (and queued) by its own name
    if cmd is None:
        shown = argv[0].decode("utf-8", "replace")
        return _reject(state, client, None, errors.unknown_command(shown, argv[1:]))
    refusal = check(state, client, cmd, argv)
    if refusal is not None:
        if cmd.runs_transaction and client.queued is not None:
            # As Redis's execCommandAbort(): a refused EXEC discards the
            # transaction and says why.
            end_transaction(state, client)
            refusal = errors.exec_abort_because(refusal)
        return _reject(state, client, cmd, refusal)
    if state.pause.mode and state.pause.holds(client, cmd, argv):
        # CLIENT PAUSE: the client waits (rcp11/pause.py), and this command
        # is sent again once the pause ends, as a deferred one is.
        return DEFERRED
    if client.queued is not None and not cmd.not_queued:
        # By its own name (argv[0] was renamed back above). A request the
        # lane may run is encoded now, while the client takes turns, not
        # when EXEC runs them all at once.
        if cmd.in_lane:
            client.queued.append((cmd, argv, encode_command(argv)))
        else:
            client.queued_outside_lane.append(len(client.queued))
            client.queued.append((cmd, argv, None))
        if not client.queued_write and cmd.writes_keys(argv):
            client.queued_write = True
        if cmd.denyoom:
            client.queued_denyoom = True
        return QUEUED
    if state.blocking.ready and _meets_waiters(state, cmd, argv):
        # Readers a write woke are still being served in slices
        # (serve_ready): a command that could see or change their keys
        # runs after all of them, as if they had been served at once. In
        # the server it waits for the slices (other clients go on); without
        # one (state.serve_seconds None) they are served now.
        if state.serve_seconds is not None:
            state.blocking.defer(client)
            return DEFERRED
        serve_ready(state, whole=True)
    reply = call(state, client, cmd, argv)
    if state.blocking.ready:
        serve_ready(state)
    return reply


def _meets_waiters(state: ServerState, cmd: Command, argv: list[bytes]) -> bool:
    """Whether running cmd before the readers left signalled could differ
    from running it after them: it names a key someone waits on or watches
    (a stream, a group key), or, naming no key, writes (FLUSHALL), runs a
    transaction or manages clients (CLIENT UNBLOCK)."""
    keys = cmd.keys(argv)
    if not keys:
        return cmd.write or cmd.runs_transaction or cmd.admin or cmd.container
    involves = state.blocking.involves
    return any(involves(key) for key in keys)


def check(
    state: ServerState,
    client: ClientState,
    cmd: Command,
    argv: list[bytes],
    writes: bool | None = None,
) -> str | None:
    """Why cmd may not run for client now (the error reply's text), or
    None. The one refusal function of every dispatch path; while the files
    load only the arity is checked. writes: whether this call writes, when
    the caller knows (a blocked request served), else read from argv."""
    arity = cmd.arity
    argc = len(argv)
    if argc != arity and (arity > 0 or argc < -arity):
        return errors.wrong_arity(cmd.name)
    if state.loading:
        return None
    if not client.authenticated and not cmd.noauth and requirepass_set(state):
        return errors.NOAUTH
    if client.queued is not None and cmd.no_multi:
        return errors.NOT_IN_TRANSACTION
    if cmd.runs_transaction:
        # What its queued commands do, noted as they were queued.
        queued = client.queued is not None
        write = queued and client.queued_write
        denyoom = queued and client.queued_denyoom
    else:
        if writes is None:
            writes = cmd.write or (cmd.writes_some_keys and cmd.writes_keys(argv))
        write = writes
        denyoom = cmd.denyoom
    if write or denyoom:
        return write_refusal(state, write, denyoom)
    return None


def write_refusal(state: ServerState, write: bool, denyoom: bool) -> str | None:
    """Why a command that writes / may grow memory may not run now
    (MISCONF, OOM)."""
    if write:
        refused = state.writes_refused or state.persistence.write_refused()
        if refused:
            return refused
    if denyoom and not state.pause.writes_paused:
        # (During CLIENT PAUSE nothing is evicted and a write waits: its
        # memory is looked at when it runs, as Redis's performEvictions()
        # lets it through while clients are paused.)
        limit = state.config.get("maxmemory")
        if limit and state.used_memory() > int(limit):
            if state.config.get("maxmemory-policy") == "streams-oldest":
                if retention.evict_for_memory(state, int(limit)):
                    return None
            return errors.OOM
    return None


def requirepass_set(state: ServerState) -> bool:
    return bool(state.config.get("requirepass"))


def _reject(state: ServerState, client: ClientState, cmd: Command | None, message: str) -> Error:
    # Like Redis's flagTransaction(): a command refused while queuing makes
    # the whole transaction fail at EXEC.
    if client.queued is not None:
        client.multi_error = True
    if cmd is not None:
        command_stats(state, cmd.name)[2] += 1
    count_error(state, message)
    return Error(message)


def command_stats(state: ServerState, name: str) -> list[int]:
    """The INFO commandstats row of a command: [calls, usec, rejected, failed]."""
    row = state.stats.commands.get(name)
    if row is None:
        row = state.stats.commands[name] = [0, 0, 0, 0]
    return row


def count_error(state: ServerState, message: str) -> None:
    """Count an error reply sent to a client: total_error_replies and INFO
    errorstats by the error's code (its first word, as Redis reads it)."""
    stats = state.stats
    stats.total_error_replies += 1
    space = message.find(" ", 0, 32)
    code = message[:space] if space > 0 else "ERR"
    kinds = stats.errors
    if code in kinds:
        kinds[code] += 1
    elif stats.errors_enabled:
        if len(kinds) >= ERROR_STATS_KINDS:
            # As Redis: a flood of made-up error codes must not grow the
            # table without end; CONFIG RESETSTAT turns it back on.
            log.warning(
                "Errorstats stopped adding new errors because the number of errors "
                "reached the limit; CONFIG RESETSTAT re-enables it. Current codes: %s",
                ", ".join(kinds),
            )
            kinds.clear()
            kinds["ERRORSTATS_DISABLED"] = 1
            stats.errors_enabled = False
        else:
            kinds[code] = 1


def call(
    state: ServerState,
    client: ClientState,
    cmd: Command,
    argv: list[bytes],
    run: Runner | None = None,
    first_call: bool = True,
) -> Any:
    """Run a command that passed check() (Redis's call()): cmd's handler, or
    `run` standing in for it (a blocked request being served). first_call:
    False when the command was counted (and shown to MONITOR) when it was
    first called, as for a blocked request served later."""
    name = cmd.name
    client.last_command = name
    if cmd.container and len(argv) > 1:
        sub = argv[1].lower()
        # Only a plausible subcommand name: CLIENT LIST lines must stay one line.
        if len(sub) < 20 and sub.replace(b"-", b"").isalnum():
            client.last_command = f"{name}|{sub.decode()}"
    keyspace = state.keyspace
    changes = keyspace.changes - keyspace.expiry_changes + MUTATIONS.ticks
    logged = state.dirty - keyspace.expiry_logged
    started = perf_counter_ns()
    try:
        reply = (cmd.handler if run is None else run)(state, client, argv)
    except Exception as exc:  # a bug must cost one reply, not the server
        if isinstance(exc, CommandError):
            problem = exc.message
        else:
            log.exception("command %r failed", name)
            problem = errors.internal_error(name, exc)
        if keyspace.changes - keyspace.expiry_changes + MUTATIONS.ticks != changes:
            handler_logged = state.dirty - keyspace.expiry_logged != logged
            problem = _keep_change(state, name, argv, handler_logged, problem)
        reply = Error(problem)
    stats = state.stats
    row = stats.commands.get(name) or command_stats(state, name)
    if first_call:
        usec = (perf_counter_ns() - started) // 1000
        row[0] += 1
        row[1] += usec
        stats.total_commands_processed += 1
        if usec >= state.slow_usec:
            note_slow(state, client, cmd, argv, usec)
    if type(reply) is Error:
        row[3] += 1
        count_error(state, reply.message)
    if first_call and state.monitors and not cmd.admin and not state.loading:
        feed_monitors(state, client, cmd, argv)
    return reply


def _keep_change(
    state: ServerState, name: str, argv: list[bytes], handler_logged: bool, problem: str
) -> str:
    """A handler raised after it had changed data: make memory and the AOF
    agree, and return the error reply that says what happened.

    Handlers propagate what they changed as their last step, so one that
    had propagated logged its change. Otherwise argv itself is logged:
    handlers are deterministic, so replaying it redoes the same change and
    raises the same error. It goes inside MULTI ... EXEC (alone, or in the
    EXEC being run), whose reply is a list even when a command in it fails,
    so the loader replays past it. If even that cannot be logged, memory
    holds a change the AOF lacks: every write is refused from now on
    (state.writes_refused) until a restart, so no acknowledged write can
    build on it.
    """
    if not handler_logged and not state.loading:
        try:
            with state.transaction_log():
                state.propagate(argv)
        except Exception:
            log.exception("could not log the change made by a failed %r", name)
            if state.writes_refused is None:
                log.warning(
                    "Command %r changed data and failed, and the change could not be "
                    "logged: refusing writes until restart.",
                    name,
                )
            state.writes_refused = errors.UNLOGGED_CHANGE
            return errors.failed_after_change(name, problem, logged=False)
    log.warning("Command %r raised after it changed data; the change is kept and logged.", name)
    return errors.failed_after_change(name, problem, logged=True)


def feed_monitors(state: ServerState, client: ClientState, cmd: Command, argv: list[bytes]) -> None:
    """Show a command to every MONITOR client, as redis-server's
    replicationFeedMonitors() writes it: time, db and client address, then
    each argument quoted (secrets replaced by "(redacted)")."""
    if cmd.redact is not None:
        argv = cmd.redact(argv)
    now = time.time()
    seconds = int(now)
    where = f"unix:{client.unix_path}" if client.unix_path else client.addr
    line = f"{seconds}.{int((now - seconds) * 1e6):06d} [{client.db} {where}] " + " ".join(
        show_arg(arg) for arg in argv
    )
    reply = SimpleString(line)
    for monitor in list(state.monitors):
        monitor.send(reply)


def serve_ready(state: ServerState, whole: bool = False) -> None:
    """Serve the clients blocked on keys the last command changed, in the
    order they blocked (across keys: BlockingManager.serve), each through
    check() and call() like any command: a served group read obeys
    MISCONF, is logged even if it raises half way, and wakes readers
    waiting on the group key it moved. A request with nothing to answer
    yet keeps its place. For at most state.serve_seconds unless whole: the
    rest stay signalled for the next call (the server's next iteration)."""
    budget = None if whole else state.serve_seconds
    deadline = None if budget is None else time.perf_counter() + budget
    served = state.blocking.serve(state, lambda request: _serve(state, request), deadline)
    # Resuming pipelines last: a resumed client may run commands that
    # block or wake others again, which must not happen mid-iteration.
    for client in served:
        client.on_unblocked()


def _serve(state: ServerState, request: BlockRequest) -> Any:
    client, argv = request.client, request.argv
    cmd = lookup_original(argv[0])
    if cmd is None:  # the command table never loses a row
        raise RuntimeError(f"blocked command {show_arg(argv[0])} has no row")
    refusal = check(state, client, cmd, argv, request.writes)
    if refusal is not None:
        count_error(state, refusal)
        return Error(refusal)
    return call(state, client, cmd, argv, lambda st, _c, _a: request.serve(st), first_call=False)


def unwatch_all(state: ServerState, client: ClientState) -> None:
    watchers = state.keyspace.watchers
    for key in client.watched:
        clients = watchers.get(key)
        if clients is not None:
            clients.discard(client)
            if not clients:
                del watchers[key]
    client.watched.clear()
    client.dirty_cas = False


def end_transaction(state: ServerState, client: ClientState) -> None:
    """Leave MULTI: drop the queue and the WATCHes (EXEC, DISCARD, a
    refused EXEC, RESET)."""
    client.queued = None
    client.queued_outside_lane = []
    client.multi_error = False
    unwatch_all(state, client)


def client_disconnected(state: ServerState, client: ClientState) -> None:
    """Forget a client that is gone: its blocked read, its WATCHed keys,
    its MULTI queue, its MONITOR."""
    state.blocking.remove(client)
    state.pause.drop(client)
    unwatch_all(state, client)
    client.queued = None
    stop_monitor(state, client)


def stop_monitor(state: ServerState, client: ClientState) -> None:
    """The client stops receiving MONITOR lines (RESET, disconnect)."""
    if client.monitor:
        client.monitor = False
        state.monitors.remove(client)


def expire_keys(state: ServerState, now: float | None = None) -> int:
    """Active expiry for the server cron: delete keys whose TTL passed."""
    return state.keyspace.expire_due(now)


__all__ = [
    "BLOCKED",
    "DEFERRED",
    "call",
    "check",
    "client_disconnected",
    "command_stats",
    "count_error",
    "end_transaction",
    "execute",
    "expire_keys",
    "feed_monitors",
    "requirepass_set",
    "serve_ready",
    "stop_monitor",
    "unwatch_all",
    "write_refusal",
]
