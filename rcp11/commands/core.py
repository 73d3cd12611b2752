"""The command table and the one dispatch every command goes through.

Handlers are synchronous and do no I/O: they read and change ServerState,
call state.propagate() for what they changed (in a form whose replay is
deterministic), and return a reply value (see rcp11.resp). A blocking handler
registers the client with state.blocking and returns BLOCKED; the server then
sends nothing until the blocking manager delivers the reply with
client.send() and calls client.on_unblocked().

execute() follows Redis's processCommand()/call(): look the command up,
check arity, authentication, refused writes (MISCONF) and maxmemory (OOM),
queue inside MULTI, run the handler, then wake clients blocked on keys the
command changed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

from rcp11 import errors
from rcp11.errors import CommandError
from rcp11.limits import INT64_MAX, INT64_MIN
from rcp11.resp import QUEUED, Error
from rcp11.state import ClientState, ServerState
from rcp11.storage import MUTATIONS

log = logging.getLogger("rcp11")

Handler = Callable[[ServerState, ClientState, list[bytes]], Any]

# The Redis version we behave like; tools read it from HELLO and INFO to
# decide which commands they may use.
REDIS_COMPAT_VERSION = "7.0.0"


class _Blocked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


# Returned by execute() when the client now waits; the server sends nothing.
BLOCKED = _Blocked()


# Commands with subcommands (CLIENT LIST shows "cmd=client|list").
_CONTAINERS = frozenset({"client", "config", "command", "memory", "object"})

# Commands a client inside MULTI runs at once instead of queuing.
_NOT_QUEUED = frozenset({"exec", "discard", "multi", "watch", "quit", "reset"})


@dataclass(frozen=True)
class Command:
    name: str
    handler: Handler
    arity: int  # > 0: exactly; < 0: at least -arity. The name counts.
    flags: frozenset[str]
    first_key: int = 0
    last_key: int = 0  # negative: counted from the end (-1 = last argument)
    step: int = 0
    summary: str = ""
    group: str = "generic"
    # Derived from flags once, so dispatch tests booleans, not set members.
    write: bool = field(init=False)
    denyoom: bool = field(init=False)
    noauth: bool = field(init=False)
    no_multi: bool = field(init=False)
    # CLIENT LIST names it "name|subcommand".
    container: bool = field(init=False)
    # Runs at once inside MULTI instead of being queued.
    not_queued: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "write", "write" in self.flags)
        object.__setattr__(self, "denyoom", "denyoom" in self.flags)
        object.__setattr__(self, "noauth", "no_auth" in self.flags)
        object.__setattr__(self, "no_multi", "no_multi" in self.flags)
        object.__setattr__(self, "container", self.name in _CONTAINERS)
        object.__setattr__(self, "not_queued", self.name in _NOT_QUEUED)

    def keys(self, argv: list[bytes]) -> list[bytes]:
        """The key arguments of argv, per first_key/last_key/step."""
        if not self.first_key:
            return []
        last = self.last_key if self.last_key >= 0 else len(argv) + self.last_key
        return argv[self.first_key : last + 1 : self.step]


COMMANDS: dict[str, Command] = {}
# The rows by the names clients may call them (rename-command changes these,
# never COMMANDS): lower-case name -> row, and the name's bytes as clients
# usually send them (upper or lower case), so dispatch needs no decode for
# the common spellings.
_CLIENT_NAMES: dict[str, Command] = {}
_BY_BYTES: dict[bytes, Command] = {}
# rename-command's effect, new name (or "") by original name; empty when
# nothing was renamed, which is all dispatch tests on its hot path.
_RENAMED: dict[str, str] = {}


def command(
    name: str,
    arity: int,
    flags: str = "",
    keys: tuple[int, int, int] = (0, 0, 0),
    summary: str = "",
    group: str = "generic",
) -> Callable[[Handler], Handler]:
    """Register the decorated handler as command `name`."""

    def register(handler: Handler) -> Handler:
        row = Command(name, handler, arity, frozenset(flags.split()), *keys, summary, group)
        COMMANDS[name] = _CLIENT_NAMES[name] = row
        _BY_BYTES[name.encode()] = _BY_BYTES[name.upper().encode()] = row
        return handler

    return register


# --------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------


class _Transaction:
    """Which client's EXEC is running: its blocking commands do not block."""

    client: ClientState | None = None


transaction = _Transaction()


def lookup(name: bytes) -> Command | None:
    """The command a client calls by this name (after rename-command)."""
    cmd = _BY_BYTES.get(name)
    if cmd is None:
        cmd = _CLIENT_NAMES.get(name.decode("utf-8", "replace").lower())
    return cmd


def lookup_original(name: bytes) -> Command | None:
    """The command by its own name, whatever rename-command did: what the
    AOF holds (dispatch logs original names) and EXEC runs."""
    return COMMANDS.get(name.decode("utf-8", "replace").lower())


def rename_command(old: str, new: str) -> None:
    """rename-command old new, as redis.conf applies it: `old` stops
    answering, `new` ("" for none) calls that command. Raises ValueError
    with Redis's text."""
    cmd = _CLIENT_NAMES.get(old.lower())
    if cmd is None:
        raise ValueError("No such command in rename-command")
    if new and new.lower() in _CLIENT_NAMES:
        raise ValueError("Target command name already exists")
    del _CLIENT_NAMES[old.lower()]
    for spelling in [b for b, row in _BY_BYTES.items() if row is cmd]:
        del _BY_BYTES[spelling]
    if new:
        _CLIENT_NAMES[new.lower()] = cmd
        for spelling in {new, new.lower(), new.upper()}:
            _BY_BYTES[spelling.encode("utf-8", "surrogateescape")] = cmd
    _RENAMED[cmd.name] = new
    _refresh_run_spellings()


# Spellings of TWRITE a pipelined run is recognised by (streams.execute_run;
# the server tests it before calling). Only names that reach TWRITE, and only
# ones that are TWRITE's own: a run logs its commands as they were sent.
RUN_COMMANDS: set[bytes] = {b"TWRITE", b"twrite"}


def _refresh_run_spellings() -> None:
    twrite = COMMANDS.get("twrite")
    keep = {s for s in (b"TWRITE", b"twrite") if twrite is not None and _BY_BYTES.get(s) is twrite}
    RUN_COMMANDS.intersection_update(keep)


def execute(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """Run one command for client; returns its reply or BLOCKED."""
    # The hot path of every request: attributes are read once into locals
    # and every check that is usually off is a single boolean test.
    cmd = _BY_BYTES.get(argv[0]) or lookup(argv[0])
    if _RENAMED:
        if state.loading:
            cmd = lookup_original(argv[0])  # the AOF holds original names
        elif cmd is not None:
            argv[0] = cmd.name.encode()  # so it is logged (and queued) by its own name
    if cmd is None:
        shown = argv[0].decode("utf-8", "replace")
        return _reject(state, client, None, errors.unknown_command(shown, argv[1:]))
    arity = cmd.arity
    argc = len(argv)
    if argc != arity and (arity > 0 or argc < -arity):
        return _reject(state, client, cmd, errors.wrong_arity(cmd.name))
    if not state.loading:
        if not client.authenticated and not cmd.noauth and requirepass_set(state):
            return _reject(state, client, cmd, errors.NOAUTH)
        if cmd.write or cmd.denyoom:
            refusal = write_refusal(state, cmd.write, cmd.denyoom)
            if refusal is not None:
                return _reject(state, client, cmd, refusal)
    if client.queued is not None and not cmd.not_queued:
        if cmd.no_multi:
            return _reject(state, client, cmd, "ERR Command not allowed inside a transaction")
        client.queued.append(argv)
        return QUEUED
    reply = call(state, client, cmd, argv)
    blocking = state.blocking
    if blocking is not None and blocking.ready:
        blocking.serve_ready()
    return reply


def _reject(state: ServerState, client: ClientState, cmd: Command | None, message: str) -> Error:
    # Like Redis's flagTransaction(): a command refused while queuing makes
    # the whole transaction fail at EXEC.
    if client.queued is not None:
        client.multi_error = True
    if cmd is not None:
        command_stats(state, cmd.name)[2] += 1
    return Error(message)


def requirepass_set(state: ServerState) -> bool:
    return bool(config_value(state, "requirepass", ""))


def write_refusal(state: ServerState, write: bool, denyoom: bool) -> str | None:
    """Why a command that writes / may grow memory may not run now
    (MISCONF, OOM)."""
    if write:
        refused = state.writes_refused or state.persistence.write_refused()
        if refused:
            return refused
    if denyoom:
        limit = config_value(state, "maxmemory", 0)
        if limit and state.used_memory() > int(limit):
            return errors.OOM
    return None


def config_value(state: ServerState, name: str, default: Any) -> Any:
    config = state.config
    if config is None:
        return default
    value = config.get(name)
    return default if value is None else value


def command_stats(state: ServerState, name: str) -> list[int]:
    """The INFO commandstats row of a command: [calls, usec, rejected, failed]."""
    row = state.stats.commands.get(name)
    if row is None:
        row = state.stats.commands[name] = [0, 0, 0, 0]
    return row


def call(state: ServerState, client: ClientState, cmd: Command, argv: list[bytes]) -> Any:
    """Run a command that passed the checks (Redis's call())."""
    name = cmd.name
    client.last_command = name
    if cmd.container and len(argv) > 1:
        sub = argv[1].lower()
        # Only a plausible subcommand name: CLIENT LIST lines must stay one line.
        if len(sub) < 20 and sub.replace(b"-", b"").isalnum():
            client.last_command = f"{name}|{sub.decode()}"
    keyspace = state.keyspace
    changes = keyspace.changes + MUTATIONS.ticks
    logged = state.dirty
    started = perf_counter_ns()
    try:
        reply = cmd.handler(state, client, argv)
    except Exception as exc:  # a bug must cost one reply, not the server
        if isinstance(exc, CommandError):
            problem = exc.message
        else:
            log.exception("command %r failed", name)
            problem = errors.internal_error(name, exc)
        if keyspace.changes + MUTATIONS.ticks != changes:
            problem = _keep_change(state, name, argv, state.dirty != logged, problem)
        reply = Error(problem)
    stats = state.stats
    row = stats.commands.get(name) or command_stats(state, name)
    row[0] += 1
    row[1] += (perf_counter_ns() - started) // 1000
    stats.total_commands_processed += 1
    if type(reply) is Error:
        row[3] += 1
    elif cmd.write:
        blocking = state.blocking
        if blocking is not None and blocking.waiting:
            for key in cmd.keys(argv):
                blocking.signal_key(key)
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
            if transaction.client is None:
                state.propagate([b"MULTI"])
                state.propagate(argv)
                state.propagate([b"EXEC"])
            else:
                state.propagate(argv)  # the running EXEC already wraps it
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


def client_disconnected(state: ServerState, client: ClientState) -> None:
    """Forget a client that is gone: its blocked read, its WATCHed keys."""
    if state.blocking is not None:
        state.blocking.remove(client)
    unwatch_all(state, client)
    client.queued = None


def expire_keys(state: ServerState, now: float | None = None) -> int:
    """Active expiry for the server cron: delete keys whose TTL passed."""
    return state.keyspace.expire_due(now)


# --------------------------------------------------------------------------
# Argument helpers
# --------------------------------------------------------------------------

# Redis's string2ll: optional '-', no '+', no leading zeros, no spaces.
INTEGER_RE = re.compile(rb"0|-?[1-9][0-9]{0,18}")


def parse_int(arg: bytes, message: str = errors.NOT_INTEGER) -> int:
    # Fast path for the usual short non-negative number (18 digits cannot
    # overflow); everything else goes through the exact check.
    if 0 < len(arg) < 19 and arg.isdigit() and (arg[0] != 48 or len(arg) == 1):
        return int(arg)
    if INTEGER_RE.fullmatch(arg) is None:
        raise CommandError(message)
    value = int(arg)
    if not INT64_MIN <= value <= INT64_MAX:
        raise CommandError(message)
    return value


def text(arg: bytes) -> str:
    return arg.decode("utf-8", "replace")


def get_string(state: ServerState, key: bytes) -> bytes | None:
    value = state.keyspace.get(key)
    if value is not None and not isinstance(value, bytes):
        raise CommandError(errors.WRONGTYPE)
    return value


def now_ms() -> int:
    return int(time.time() * 1000)


def check_subcommand(command_name: str, arity: dict[str, int], argv: list[bytes]) -> str:
    """The lower-case subcommand of argv, checked against its arity."""
    sub = text(argv[1]).lower()
    expected = arity.get(sub)
    if expected is None:
        raise CommandError(errors.unknown_subcommand(text(argv[1]), command_name))
    if (expected > 0 and len(argv) != expected) or len(argv) < -expected:
        raise CommandError(errors.wrong_arity(f"{command_name}|{sub}"))
    return sub


def on_off(arg: bytes) -> bool:
    value = arg.lower()
    if value not in (b"on", b"off"):
        raise CommandError(errors.SYNTAX)
    return value == b"on"
