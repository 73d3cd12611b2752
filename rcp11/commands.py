"""The command table and the one dispatch every command goes through.

Handlers are synchronous and do no I/O: they read and change ServerState,
call state.propagate() for what they changed (in a form whose replay is
deterministic), and return a reply value (see rcp11.resp). A blocking handler
registers the client with state.blocking and returns BLOCKED; the server then
sends nothing until the blocking manager delivers the reply with
client.send() and calls client.on_unblocked().

execute() follows Redis's processCommand()/call(): look the command up,
check arity, authentication, MULTI queuing, refused writes (MISCONF) and
maxmemory (OOM), run the handler, then wake clients blocked on keys the
command changed.
"""

from __future__ import annotations

import hmac
import logging
import os
import platform
import re
import resource
import sys
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rcp11 import __version__, errors
from rcp11.blocking import (
    BlockRequest,
    group_default_start,
    group_position,
    lookup_stream,
    set_group_position,
    stream_reply,
)
from rcp11.errors import CommandError
from rcp11.resp import NULL_ARRAY, OK, PONG, QUEUED, Error, SimpleString, Verbatim
from rcp11.state import ClientState, ServerState

log = logging.getLogger("rcp11")

Handler = Callable[[ServerState, ClientState, list[bytes]], Any]

# The Redis version we behave like; tools read it from HELLO and INFO to
# decide which commands they may use.
REDIS_COMPAT_VERSION = "7.0.0"
MAX_OFFSET = 2**63 - 1


class _Blocked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


# Returned by execute() when the client now waits; the server sends nothing.
BLOCKED = _Blocked()


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

    def keys(self, argv: list[bytes]) -> list[bytes]:
        """The key arguments of argv, per first_key/last_key/step."""
        if not self.first_key:
            return []
        last = self.last_key if self.last_key >= 0 else len(argv) + self.last_key
        return argv[self.first_key : last + 1 : self.step]


COMMANDS: dict[str, Command] = {}


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
        COMMANDS[name] = Command(
            name, handler, arity, frozenset(flags.split()), *keys, summary, group
        )
        return handler

    return register


# --------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------

# Commands a client inside MULTI runs at once instead of queuing.
_NOT_QUEUED = frozenset({"exec", "discard", "multi", "watch", "quit", "reset"})

# The client whose EXEC is running: its blocking commands do not block.
_exec_client: ClientState | None = None


def execute(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """Run one command for client; returns its reply or BLOCKED."""
    name = argv[0].decode("utf-8", "replace").lower()
    cmd = COMMANDS.get(name)
    if cmd is None:
        return _reject(
            state,
            client,
            None,
            errors.unknown_command(argv[0].decode("utf-8", "replace"), argv[1:]),
        )
    if (cmd.arity > 0 and len(argv) != cmd.arity) or len(argv) < -cmd.arity:
        return _reject(state, client, cmd, errors.wrong_arity(name))
    if not state.loading:
        if not client.authenticated and "noauth" not in cmd.flags and _requirepass(state):
            return _reject(state, client, cmd, errors.NOAUTH)
        refusal = _write_refusal(state, cmd.flags)
        if refusal is not None:
            return _reject(state, client, cmd, refusal)
    if client.queued is not None and name not in _NOT_QUEUED:
        client.queued.append(argv)
        return QUEUED
    reply = _call(state, client, cmd, argv)
    blocking = state.blocking
    if blocking is not None:
        blocking.serve_ready()
    return reply


def _reject(state: ServerState, client: ClientState, cmd: Command | None, message: str) -> Error:
    # Like Redis's flagTransaction(): a command refused while queuing makes
    # the whole transaction fail at EXEC.
    if client.queued is not None:
        client.multi_error = True
    if cmd is not None:
        _command_stats(state, cmd.name)[2] += 1
    return Error(message)


def _requirepass(state: ServerState) -> bool:
    return bool(_config(state, "requirepass", ""))


def _write_refusal(state: ServerState, flags: Iterable[str]) -> str | None:
    """Why a command with these flags may not run now (MISCONF, OOM)."""
    if "write" in flags:
        refused = state.persistence.write_refused()
        if refused:
            return refused
    if "denyoom" in flags:
        limit = _config(state, "maxmemory", 0)
        if limit and state.keyspace.used_bytes > int(limit):
            return errors.OOM
    return None


def _config(state: ServerState, name: str, default: Any) -> Any:
    config = state.config
    if config is None:
        return default
    value = config.get(name)
    return default if value is None else value


def _command_stats(state: ServerState, name: str) -> list[int]:
    row = state.stats.commands.get(name)
    if row is None:
        row = state.stats.commands[name] = [0, 0, 0, 0]
    return row


def _call(state: ServerState, client: ClientState, cmd: Command, argv: list[bytes]) -> Any:
    client.last_command = cmd.name
    started = time.perf_counter_ns()
    try:
        reply = cmd.handler(state, client, argv)
    except CommandError as exc:
        reply = Error(exc.message)
    except Exception as exc:  # a bug must cost one reply, not the server
        log.exception("command %r failed", cmd.name)
        reply = Error(f"ERR internal error in '{cmd.name}': {type(exc).__name__}: {exc}")
    row = _command_stats(state, cmd.name)
    row[0] += 1
    row[1] += (time.perf_counter_ns() - started) // 1000
    state.stats.total_commands_processed += 1
    if type(reply) is Error:
        row[3] += 1
    elif "write" in cmd.flags:
        blocking = state.blocking
        if blocking is not None and blocking.active:
            for key in cmd.keys(argv):
                blocking.signal_key(key)
    return reply


def client_disconnected(state: ServerState, client: ClientState) -> None:
    """Forget a client that is gone: its blocked read, its WATCHed keys."""
    if state.blocking is not None:
        state.blocking.remove(client)
    _unwatch_all(state, client)
    client.queued = None


def expire_keys(state: ServerState, now_ms: float | None = None) -> int:
    """Active expiry for the server cron: delete keys whose TTL passed."""
    return state.keyspace.expire_due(now_ms)


# --------------------------------------------------------------------------
# Argument helpers
# --------------------------------------------------------------------------

# Redis's string2ll: optional '-', no '+', no leading zeros, no spaces.
_INTEGER_RE = re.compile(rb"0|-?[1-9][0-9]{0,18}")


def parse_int(arg: bytes, message: str = errors.NOT_INTEGER) -> int:
    if _INTEGER_RE.fullmatch(arg) is None:
        raise CommandError(message)
    value = int(arg)
    if not -(2**63) <= value <= MAX_OFFSET:
        raise CommandError(message)
    return value


def _text(arg: bytes) -> str:
    return arg.decode("utf-8", "replace")


def _get_string(state: ServerState, key: bytes) -> bytes | None:
    value = state.keyspace.get(key)
    if value is not None and not isinstance(value, bytes):
        raise CommandError(errors.WRONGTYPE)
    return value


def glob_to_regex(pattern: bytes) -> re.Pattern[bytes]:
    """Compile a Redis glob (KEYS, SCAN MATCH, CONFIG GET) into a regex with
    the semantics of Redis's stringmatchlen: * ? [abc] [^a-z] and \\x."""
    out: list[bytes] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i : i + 1]
        if c == b"*":
            out.append(b".*")
        elif c == b"?":
            out.append(b".")
        elif c == b"\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i : i + 1]))
        elif c == b"[":
            i += 1
            negate = i < n and pattern[i : i + 1] == b"^"
            if negate:
                i += 1
            members: list[bytes] = []
            # An unterminated class runs to the end of the pattern, as in Redis.
            while i < n and pattern[i : i + 1] != b"]":
                if pattern[i : i + 1] == b"\\" and i + 1 < n:
                    i += 1
                    members.append(b"\\x%02x" % pattern[i])
                elif (
                    i + 2 < n and pattern[i + 1 : i + 2] == b"-" and pattern[i + 2 : i + 3] != b"]"
                ):
                    low, high = sorted((pattern[i], pattern[i + 2]))
                    members.append(b"\\x%02x-\\x%02x" % (low, high))
                    i += 2
                else:
                    members.append(b"\\x%02x" % pattern[i])
                i += 1
            if members:
                out.append(b"[" + (b"^" if negate else b"") + b"".join(members) + b"]")
            else:
                # [] matches nothing and [^] matches any one byte.
                out.append(b"." if negate else b"(?!)")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile(b"".join(out), re.DOTALL)


# --------------------------------------------------------------------------
# Connection
# --------------------------------------------------------------------------


@command("ping", -1, "fast stale", summary="Ping the server", group="connection")
def ping_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        raise CommandError(errors.wrong_arity("ping"))
    return PONG if len(argv) == 1 else argv[1]


@command("echo", 2, "fast", summary="Echo the given string", group="connection")
def echo_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return argv[1]


@command(
    "quit", -1, "noauth loading stale fast", summary="Close the connection", group="connection"
)
def quit_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    # The server closes the connection once this reply is written.
    client.closing = True
    return OK


@command(
    "reset", 1, "noauth loading stale fast", summary="Reset the connection", group="connection"
)
def reset_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    client.queued = None
    client.multi_error = False
    _unwatch_all(state, client)
    client.resp = 2
    client.name = b""
    client.db = 0
    client.authenticated = not _requirepass(state)
    return SimpleString("RESET")


def _authenticate(state: ServerState, client: ClientState, user: bytes, password: bytes) -> None:
    required = _config(state, "requirepass", "")
    if isinstance(required, str):
        required = required.encode()
    # The only user is "default"; without requirepass it takes any password.
    ok = user == b"default" and (not required or hmac.compare_digest(password, required))
    if not ok:
        raise CommandError(errors.WRONGPASS)
    client.authenticated = True


@command("auth", -2, "noauth loading stale fast", summary="Authenticate", group="connection")
def auth_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        raise CommandError(errors.SYNTAX)
    if len(argv) == 2:
        if not _requirepass(state):
            raise CommandError(errors.AUTH_NOT_CONFIGURED)
        _authenticate(state, client, b"default", argv[1])
    else:
        _authenticate(state, client, argv[1], argv[2])
    return OK


@command("hello", -1, "noauth loading stale fast", summary="Handshake", group="connection")
def hello_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    protover = client.resp
    if len(argv) > 1:
        try:
            protover = parse_int(argv[1])
        except CommandError:
            raise CommandError(errors.HELLO_PROTO) from None
        if protover not in (2, 3):
            raise CommandError(errors.NOPROTO)
    auth: tuple[bytes, bytes] | None = None
    name: bytes | None = None
    i = 2
    while i < len(argv):
        option = argv[i].lower()
        if option == b"auth" and i + 2 < len(argv):
            auth = (argv[i + 1], argv[i + 2])
            i += 3
        elif option == b"setname" and i + 1 < len(argv):
            name = argv[i + 1]
            i += 2
        else:
            raise CommandError(f"ERR Syntax error in HELLO option '{_text(argv[i])}'")
    if auth is not None:
        _authenticate(state, client, *auth)
    elif not client.authenticated and _requirepass(state):
        raise CommandError(errors.HELLO_NOAUTH)
    if name is not None:
        _check_client_name(name)
        client.name = name
    client.resp = protover
    return {
        "server": "redis",
        "version": REDIS_COMPAT_VERSION,
        "proto": protover,
        "id": client.id,
        "mode": "standalone",
        "role": "master",
        "modules": [],
    }


@command("select", 2, "loading stale fast", summary="Select the database", group="connection")
def select_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if parse_int(argv[1]) != 0:
        raise CommandError(errors.DB_INDEX)
    return OK


def _check_client_name(name: bytes) -> None:
    if any(b < 0x21 or b > 0x7E for b in name):
        raise CommandError(errors.CLIENT_NAME)


def _client_flags(client: ClientState) -> str:
    flags = ""
    if client.blocked is not None:
        flags += "b"
    if client.dirty_cas:
        flags += "d"
    if client.queued is not None:
        flags += "x"
    if client.closing:
        flags += "c"
    return flags or "N"


def _client_line(client: ClientState, now: float) -> str:
    fields = [
        ("id", client.id),
        ("addr", client.addr),
        ("laddr", client.laddr),
        ("fd", client.fd),
        ("name", _text(client.name)),
        ("age", int(now - client.created_at)),
        ("idle", int(now - client.last_interaction)),
        ("flags", _client_flags(client)),
        ("db", client.db),
        ("sub", 0),
        ("psub", 0),
        ("ssub", 0),
        ("multi", -1 if client.queued is None else len(client.queued)),
        ("qbuf", client.query_buffer_len),
        ("qbuf-free", 0),
        ("argv-mem", 0),
        ("multi-mem", 0),
        ("rbs", 0),
        ("rbp", 0),
        ("obl", 0),
        ("oll", 0),
        ("omem", client.output_buffer_len),
        ("tot-mem", client.query_buffer_len + client.output_buffer_len),
        ("events", "r"),
        ("cmd", client.last_command),
        ("user", "default"),
        ("redir", -1),
        ("resp", client.resp),
        ("lib-name", _text(client.lib_name)),
        ("lib-ver", _text(client.lib_ver)),
    ]
    return " ".join(f"{name}={value}" for name, value in fields)


def _all_clients(state: ServerState, me: ClientState) -> list[ClientState]:
    clients = list(state.clients.values())
    if me not in clients:  # e.g. a client the server has not registered
        clients.append(me)
    return clients


def _kill(state: ServerState, me: ClientState, target: ClientState) -> None:
    if target is me:
        me.closing = True  # after this reply, as Redis does
        return
    target.closing = True
    client_disconnected(state, target)
    target.close()


_CLIENT_HELP = [
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GETNAME",
    "    Return the name of the current connection.",
    "ID",
    "    Return the ID of the current connection.",
    "INFO",
    "    Return information about the current client connection.",
    "KILL <ip:port>",
    "    Kill connection made from <ip:port>.",
    "KILL <option> <value> [<option> <value> [...]]",
    "    Kill connections. Options are: ID <client-id>, ADDR <ip:port>,",
    "    LADDR <ip:port>, SKIPME (YES|NO), TYPE (NORMAL|MASTER|REPLICA|PUBSUB),",
    "    USER <username>, MAXAGE <seconds>.",
    "LIST [TYPE NORMAL|MASTER|REPLICA|PUBSUB] [ID <id> [<id> ...]]",
    "    Return information about client connections.",
    "NO-EVICT (ON|OFF)",
    "    Accepted for compatibility; clients are never evicted.",
    "NO-TOUCH (ON|OFF)",
    "    Accepted for compatibility.",
    "SETINFO <LIB-NAME|LIB-VER> <value>",
    "    Set client library name or version, shown by CLIENT LIST.",
    "SETNAME <name>",
    "    Assign the name <name> to the current connection.",
    "HELP",
    "    Print this help.",
]

# CLIENT subcommand -> arity (Redis style, the two words count).
_CLIENT_ARITY = {
    "id": 2,
    "getname": 2,
    "setname": 3,
    "info": 2,
    "list": -2,
    "kill": -3,
    "setinfo": 4,
    "no-evict": 3,
    "no-touch": 3,
    "help": 2,
}


def _check_subcommand(command_name: str, arity: dict[str, int], argv: list[bytes]) -> str:
    sub = _text(argv[1]).lower()
    expected = arity.get(sub)
    if expected is None:
        raise CommandError(errors.unknown_subcommand(_text(argv[1]), command_name))
    if (expected > 0 and len(argv) != expected) or len(argv) < -expected:
        raise CommandError(errors.wrong_arity(f"{command_name}|{sub}"))
    return sub


def _on_off(arg: bytes) -> bool:
    value = arg.lower()
    if value not in (b"on", b"off"):
        raise CommandError(errors.SYNTAX)
    return value == b"on"


@command("client", -2, "loading stale", summary="Manage client connections", group="connection")
def client_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = _check_subcommand("client", _CLIENT_ARITY, argv)
    now = time.time()
    if sub == "id":
        return client.id
    if sub == "getname":
        return client.name or None
    if sub == "setname":
        _check_client_name(argv[2])
        client.name = argv[2]
        return OK
    if sub == "info":
        return Verbatim("txt", _client_line(client, now) + "\n")
    if sub == "list":
        return Verbatim("txt", _client_list(state, client, argv[2:], now))
    if sub == "kill":
        return _client_kill(state, client, argv[2:])
    if sub == "setinfo":
        what = argv[2].lower()
        if what not in (b"lib-name", b"lib-ver"):
            raise CommandError(f"ERR Unrecognized option '{_text(argv[2])}'")
        if any(b < 0x21 or b > 0x7E for b in argv[3]):
            raise CommandError(
                f"ERR {_text(what)} cannot contain spaces, newlines or special characters."
            )
        if what == b"lib-name":
            client.lib_name = argv[3]
        else:
            client.lib_ver = argv[3]
        return OK
    if sub in ("no-evict", "no-touch"):
        _on_off(argv[2])
        return OK
    return _CLIENT_HELP


def _client_list(state: ServerState, me: ClientState, args: list[bytes], now: float) -> str:
    clients = _all_clients(state, me)
    if args:
        option = args[0].lower()
        if option == b"type" and len(args) == 2:
            kind = args[1].lower()
            if kind not in (b"normal", b"master", b"replica", b"slave", b"pubsub"):
                raise CommandError(f"ERR Unknown client type '{_text(args[1])}'")
            if kind != b"normal":
                clients = []
        elif option == b"id" and len(args) >= 2:
            wanted = set()
            for arg in args[1:]:
                try:
                    wanted.add(parse_int(arg))
                except CommandError:
                    raise CommandError("ERR Invalid client ID") from None
            clients = [c for c in clients if c.id in wanted]
        else:
            raise CommandError(errors.SYNTAX)
    return "".join(_client_line(c, now) + "\n" for c in clients)


def _client_kill(state: ServerState, me: ClientState, args: list[bytes]) -> Any:
    clients = _all_clients(state, me)
    if len(args) == 1:  # the old form: CLIENT KILL ip:port, answers OK
        addr = _text(args[0])
        for target in clients:
            if target.addr == addr:
                _kill(state, me, target)
                return OK
        raise CommandError(errors.NO_SUCH_CLIENT)
    if len(args) % 2:
        raise CommandError(errors.SYNTAX)
    tests: list[Callable[[ClientState], bool]] = []
    skip_me = True
    now = time.time()
    for i in range(0, len(args), 2):
        option, value = args[i].lower(), args[i + 1]
        if option == b"id":
            try:
                wanted_id = parse_int(value)
            except CommandError:
                wanted_id = 0
            if wanted_id <= 0:
                raise CommandError("ERR client-id should be greater than 0")
            tests.append(lambda c, wanted_id=wanted_id: c.id == wanted_id)
        elif option == b"addr":
            addr = _text(value)
            tests.append(lambda c, addr=addr: c.addr == addr)
        elif option == b"laddr":
            laddr = _text(value)
            tests.append(lambda c, laddr=laddr: c.laddr == laddr)
        elif option == b"type":
            kind = value.lower()
            if kind not in (b"normal", b"master", b"replica", b"slave", b"pubsub"):
                raise CommandError(f"ERR Unknown client type '{_text(value)}'")
            tests.append(lambda c, normal=kind == b"normal": normal)
        elif option == b"user":
            if value != b"default":
                raise CommandError(f"ERR No such user '{_text(value)}'")
        elif option == b"maxage":
            max_age = parse_int(value)
            tests.append(lambda c, max_age=max_age: now - c.created_at >= max_age)
        elif option == b"skipme":
            lowered = value.lower()
            if lowered not in (b"yes", b"no"):
                raise CommandError(errors.SYNTAX)
            skip_me = lowered == b"yes"
        else:
            raise CommandError(errors.SYNTAX)
    killed = 0
    for target in clients:
        if (skip_me and target is me) or not all(test(target) for test in tests):
            continue
        _kill(state, me, target)
        killed += 1
    return killed


# --------------------------------------------------------------------------
# Transactions
# --------------------------------------------------------------------------


@command(
    "multi", 1, "noscript loading stale fast", summary="Start a transaction", group="transactions"
)
def multi_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is not None:
        raise CommandError(errors.NESTED_MULTI)
    client.queued = []
    client.multi_error = False
    return OK


def _end_transaction(state: ServerState, client: ClientState) -> None:
    client.queued = None
    client.multi_error = False
    _unwatch_all(state, client)


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
    _end_transaction(state, client)
    return OK


@command("exec", 1, "noscript loading stale", summary="Run a transaction", group="transactions")
def exec_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    global _exec_client
    queued = client.queued
    if queued is None:
        raise CommandError(errors.EXEC_WITHOUT_MULTI)
    if client.multi_error:
        _end_transaction(state, client)
        raise CommandError(errors.EXEC_ABORT)
    if client.dirty_cas:
        _end_transaction(state, client)
        return NULL_ARRAY
    commands = [COMMANDS[argv[0].decode("utf-8", "replace").lower()] for argv in queued]
    if not state.loading:
        flags = frozenset().union(*(cmd.flags for cmd in commands))
        refusal = _write_refusal(state, flags)
        if refusal is not None:
            _end_transaction(state, client)
            raise CommandError(errors.exec_abort_because(refusal))
    _end_transaction(state, client)

    # Everything the transaction propagates goes to the log between MULTI
    # and EXEC, so a replay applies it all or nothing; a transaction that
    # changed nothing logs nothing.
    original_propagate = state.propagate
    wrapped = False

    def propagate_in_transaction(cmd_argv: list[bytes]) -> None:
        nonlocal wrapped
        if not wrapped:
            wrapped = True
            original_propagate([b"MULTI"])
        original_propagate(cmd_argv)

    state.propagate = propagate_in_transaction  # type: ignore[method-assign]
    previous_exec_client, _exec_client = _exec_client, client
    replies = []
    try:
        for cmd, cmd_argv in zip(commands, queued, strict=True):
            replies.append(_call(state, client, cmd, cmd_argv))
    finally:
        _exec_client = previous_exec_client
        del state.propagate
        if wrapped:
            original_propagate([b"EXEC"])
    return replies


@command("watch", -2, "noscript loading stale fast", summary="Watch keys", group="transactions")
def watch_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is not None:
        raise CommandError(errors.WATCH_IN_MULTI)
    for key in argv[1:]:
        state.keyspace.watchers.setdefault(key, set()).add(client)
        client.watched.add(key)
    return OK


def _unwatch_all(state: ServerState, client: ClientState) -> None:
    watchers = state.keyspace.watchers
    for key in client.watched:
        clients = watchers.get(key)
        if clients is not None:
            clients.discard(client)
            if not clients:
                del watchers[key]
    client.watched.clear()
    client.dirty_cas = False


@command(
    "unwatch", 1, "noscript loading stale fast", summary="Forget watched keys", group="transactions"
)
def unwatch_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    _unwatch_all(state, client)
    return OK


# --------------------------------------------------------------------------
# Streams (SPEC.md sections 2-4)
# --------------------------------------------------------------------------


@command(
    "twrite",
    -3,
    "write denyoom fast",
    (1, 1, 1),
    summary="Append entries to a stream; returns the offset of the first",
    group="stream",
)
def twrite_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    backlog: int | None = None
    if len(argv) == 3:
        entries = argv[2:]  # the simple form: one entry, whatever its bytes
    else:
        i = 2
        while True:
            if i >= len(argv):
                raise CommandError(errors.syntax_error("ENTRIES is missing"))
            option = argv[i].upper()
            if option == b"ENTRIES":
                i += 1
                break
            if option == b"BACKLOG":
                if backlog is not None:
                    raise CommandError(errors.syntax_error("BACKLOG given more than once"))
                if i + 1 >= len(argv):
                    raise CommandError(errors.syntax_error("BACKLOG needs a count"))
                backlog = parse_int(argv[i + 1], "ERR BACKLOG count must be an integer >= 0")
                if backlog < 0:
                    raise CommandError("ERR BACKLOG count must be an integer >= 0")
                i += 2
                continue
            raise CommandError(
                errors.syntax_error(
                    f"unknown option '{_text(argv[i])}' (expected BACKLOG or ENTRIES)"
                )
            )
        entries = argv[i:]
        if not entries:
            raise CommandError(errors.syntax_error("no entry after ENTRIES"))
    stream = lookup_stream(state, key)
    created = stream is None
    if stream is None:
        stream = state.new_stream()
    next_offset = stream.next_offset
    if next_offset + len(entries) - 1 > MAX_OFFSET:
        raise CommandError(errors.OFFSET_OVERFLOW)
    state.persistence.before_stream_write(key, next_offset + len(entries))
    first = _append(stream, entries)
    evicted = stream.evict_keep(backlog) if backlog is not None else 0
    if created:
        state.keyspace.set(key, stream)
    else:
        state.keyspace.touch(key)
    state.stats.total_messages_written += len(entries)
    state.stats.total_messages_evicted += evicted
    state.propagate(argv)
    return first


def _append(stream: Any, entries: list[bytes]) -> int:
    from rcp11.storage import OffsetOverflowError

    try:
        return stream.append(entries)
    except OffsetOverflowError:
        raise CommandError(errors.OFFSET_OVERFLOW) from None


_TREAD_OFFSET = "ERR offset is not an integer or out of range"
_TREAD_COUNT = "ERR count is not an integer or out of range"
_TREAD_TIMEOUT = "ERR timeout is not an integer or out of range"


@command(
    "tread",
    -4,
    "readonly blocking",
    (1, 1, 1),
    summary="Read a stream from an offset, or as a member of a group",
    group="stream",
)
def tread_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], _TREAD_OFFSET)
    count = parse_int(argv[3], _TREAD_COUNT)
    if count < 0:
        raise CommandError(errors.NEGATIVE_COUNT)
    block_ms: int | None = None
    group: bytes | None = None
    group_new = False
    withinfo = False
    seen: set[bytes] = set()
    i = 4
    while i < len(argv):
        option = argv[i].upper()
        if option in seen:
            raise CommandError(errors.syntax_error(f"{_text(option)} given more than once"))
        seen.add(option)
        if option == b"WITHINFO":
            withinfo = True
            i += 1
            continue
        if option not in (b"BLOCK", b"GROUP", b"GROUPNEW"):
            raise CommandError(errors.syntax_error(f"unknown option '{_text(argv[i])}'"))
        if i + 1 >= len(argv):
            raise CommandError(errors.syntax_error(f"{_text(option)} needs a value"))
        value = argv[i + 1]
        i += 2
        if option == b"BLOCK":
            block_ms = parse_int(value, _TREAD_TIMEOUT)
            if block_ms < 0:
                raise CommandError(errors.NEGATIVE_TIMEOUT)
        else:
            if group is not None:
                raise CommandError(errors.GROUP_AND_GROUPNEW)
            group = value
            group_new = option == b"GROUPNEW"

    stream = lookup_stream(state, key)
    next_offset = stream.next_offset if stream is not None else 0
    may_block = block_ms is not None and client is not _exec_client and not state.loading
    resp3 = client.resp == 3
    if group is None:
        start = offset if offset >= 0 else max(next_offset + offset, 0)
        if start >= next_offset and may_block:
            return _block(
                state, client, BlockRequest(client, key, start, count, withinfo), block_ms
            )
        reply, n = stream_reply(stream, start, count, withinfo, resp3)
    else:
        if group == key:
            raise CommandError(errors.GROUP_IS_KEY)
        # A group read writes its group key, so it obeys write refusals.
        refused = state.persistence.write_refused() if not state.loading else None
        if refused:
            raise CommandError(refused)
        position = group_position(state, group)
        start = position if position is not None else group_default_start(stream, group_new)
        if start >= next_offset and may_block:
            if position is None:
                # Created now, so a GROUPNEW reader gets what is written next.
                set_group_position(state, group, start)
            request = BlockRequest(client, key, start, count, withinfo, group, group_new)
            return _block(state, client, request, block_ms)
        reply, n = stream_reply(stream, start, count, withinfo, resp3)
        if start + n != position:
            set_group_position(state, group, start + n)
    state.stats.total_messages_read += n
    return reply


def _block(state: ServerState, client: ClientState, request: BlockRequest, block_ms: Any) -> Any:
    if state.blocking is None:
        raise CommandError("ERR blocking is not available")
    if block_ms:
        request.deadline = time.monotonic() + block_ms / 1000
    state.blocking.block(client, request)
    return BLOCKED


@command(
    "tevict",
    3,
    "write fast",
    (1, 1, 1),
    summary="Evict the oldest messages of a stream",
    group="stream",
)
def tevict_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    offset = parse_int(argv[2], _TREAD_OFFSET)
    stream = lookup_stream(state, key)
    if stream is None:
        return 0
    evicted = stream.evict_upto(offset) if offset >= 0 else stream.evict_keep(-offset)
    if evicted:
        state.keyspace.touch(key)
        state.stats.total_messages_evicted += evicted
        state.propagate(argv)
    return evicted


# --------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------


def _delete_keys(state: ServerState, argv: list[bytes]) -> int:
    deleted = sum(state.keyspace.delete(key) for key in argv[1:] if key in state.keyspace)
    if deleted:
        state.propagate(argv)
    return deleted


@command("del", -2, "write", (1, -1, 1), summary="Delete keys")
def del_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _delete_keys(state, argv)


@command("unlink", -2, "write fast", (1, -1, 1), summary="Delete keys")
def unlink_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _delete_keys(state, argv)


@command("exists", -2, "readonly fast", (1, -1, 1), summary="Count existing keys")
def exists_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return sum(key in state.keyspace for key in argv[1:])


def _type_name(value: Any) -> str:
    if value is None:
        return "none"
    return "string" if isinstance(value, bytes) else "stream"


@command("type", 2, "readonly fast", (1, 1, 1), summary="The type of a key")
def type_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return SimpleString(_type_name(state.keyspace.get(argv[1])))


def _live_keys(state: ServerState) -> list[bytes]:
    keyspace = state.keyspace
    keys = list(keyspace)
    if keyspace.expires:
        keys = [key for key in keys if key in keyspace]  # drops expired keys
    return keys


@command("keys", 2, "readonly", summary="Keys matching a pattern")
def keys_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if argv[1] == b"*":
        return _live_keys(state)
    match = glob_to_regex(argv[1]).fullmatch
    return [key for key in _live_keys(state) if match(key)]


# SCAN walks keys in the order of their (per-process) hash; the cursor is
# the hash to continue from. A snapshot sorted by hash is taken when a scan
# starts, so every call is a bisect. Keys present for the whole scan are
# returned; keys added meanwhile may or may not be, as in Redis.
_scan_snapshots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HASH_MASK = 2**63 - 1


def _scan_snapshot(state: ServerState, restart: bool) -> tuple[list[int], list[bytes]]:
    snapshot = _scan_snapshots.get(state.keyspace)
    if snapshot is None or restart:
        pairs = sorted((hash(key) & _HASH_MASK, key) for key in state.keyspace)
        snapshot = ([h for h, _ in pairs], [k for _, k in pairs])
        _scan_snapshots[state.keyspace] = snapshot
    return snapshot


@command("scan", -2, "readonly", summary="Iterate over keys")
def scan_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    try:
        cursor = parse_int(argv[1])
    except CommandError:
        raise CommandError(errors.INVALID_CURSOR) from None
    if cursor < 0:
        raise CommandError(errors.INVALID_CURSOR)
    count = 10
    match = None
    wanted_type = None
    i = 2
    while i < len(argv):
        option = argv[i].lower()
        if i + 1 >= len(argv):
            raise CommandError(errors.SYNTAX)
        if option == b"count":
            count = parse_int(argv[i + 1])
            if count < 1:
                raise CommandError(errors.SYNTAX)
        elif option == b"match":
            match = glob_to_regex(argv[i + 1]).fullmatch
        elif option == b"type":
            wanted_type = _text(argv[i + 1]).lower()
        else:
            raise CommandError(errors.SYNTAX)
        i += 2
    hashes, keys = _scan_snapshot(state, restart=cursor == 0)
    begin = bisect_left(hashes, cursor)
    end = min(begin + count, len(hashes))
    # Keys sharing a hash are returned together so the cursor can skip past.
    while end < len(hashes) and end > begin and hashes[end] == hashes[end - 1]:
        end += 1
    next_cursor = hashes[end] if end < len(hashes) else 0
    if next_cursor == 0:
        _scan_snapshots.pop(state.keyspace, None)
    found = []
    for key in keys[begin:end]:
        value = state.keyspace.get(key)
        if value is None:
            continue
        if match is not None and not match(key):
            continue
        if wanted_type is not None and _type_name(value) != wanted_type:
            continue
        found.append(key)
    return [b"%d" % next_cursor, found]


@command("rename", 3, "write", (1, 2, 1), summary="Rename a key")
def rename_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    src, dst = argv[1], argv[2]
    if src not in state.keyspace:
        raise CommandError(errors.NO_SUCH_KEY)
    if src != dst:
        state.keyspace.rename(src, dst)
        state.propagate(argv)
    return OK


@command("renamenx", 3, "write fast", (1, 2, 1), summary="Rename a key unless the new name exists")
def renamenx_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    src, dst = argv[1], argv[2]
    if src not in state.keyspace:
        raise CommandError(errors.NO_SUCH_KEY)
    if dst in state.keyspace:
        return 0
    state.keyspace.rename(src, dst)
    state.propagate(argv)
    return 1


def _now_ms() -> int:
    return int(time.time() * 1000)


def _set_deadline(state: ServerState, key: bytes, when_ms: int) -> None:
    """Give key the deadline when_ms and log it in absolute form; a
    deadline already past deletes the key, as Redis does."""
    if when_ms <= _now_ms():
        state.keyspace.delete(key)
        state.propagate([b"DEL", key])
    else:
        state.keyspace.set_expire(key, when_ms)
        state.propagate([b"PEXPIREAT", key, b"%d" % when_ms])


def _expire_generic(
    state: ServerState, argv: list[bytes], unit_ms: int, absolute: bool, name: str
) -> int:
    key = argv[1]
    amount = parse_int(argv[2])
    when_ms = amount * unit_ms + (0 if absolute else _now_ms())
    if not -(2**63) <= when_ms <= MAX_OFFSET:
        raise CommandError(errors.INVALID_EXPIRE.format(name))
    flags = {arg.lower() for arg in argv[3:]}
    if not flags <= {b"nx", b"xx", b"gt", b"lt"} or len(flags) != len(argv) - 3:
        raise CommandError(f"ERR Unsupported option {_text(argv[3])}")
    if b"nx" in flags and len(flags) > 1 or {b"gt", b"lt"} <= flags:
        raise CommandError("ERR NX and XX, GT or LT options at the same time are not compatible")
    if key not in state.keyspace:
        return 0
    current = state.keyspace.expires.get(key)
    if b"nx" in flags and current is not None:
        return 0
    if b"xx" in flags and current is None:
        return 0
    # A key without a TTL counts as an infinite TTL for GT and LT.
    if b"gt" in flags and (current is None or when_ms <= current):
        return 0
    if b"lt" in flags and current is not None and when_ms >= current:
        return 0
    _set_deadline(state, key, when_ms)
    return 1


@command("expire", -3, "write fast", (1, 1, 1), summary="Set a key's time to live in seconds")
def expire_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _expire_generic(state, argv, 1000, False, "expire")


@command("pexpire", -3, "write fast", (1, 1, 1), summary="Set a key's time to live in ms")
def pexpire_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _expire_generic(state, argv, 1, False, "pexpire")


@command("expireat", -3, "write fast", (1, 1, 1), summary="Expire a key at a unix time")
def expireat_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _expire_generic(state, argv, 1000, True, "expireat")


@command("pexpireat", -3, "write fast", (1, 1, 1), summary="Expire a key at a unix time in ms")
def pexpireat_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _expire_generic(state, argv, 1, True, "pexpireat")


def _ttl(state: ServerState, key: bytes, unit_ms: int) -> int:
    if key not in state.keyspace:
        return -2
    when = state.keyspace.expires.get(key)
    if when is None:
        return -1
    remaining = max(when - _now_ms(), 0)
    return (remaining + unit_ms // 2) // unit_ms


@command("ttl", 2, "readonly fast", (1, 1, 1), summary="A key's time to live in seconds")
def ttl_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _ttl(state, argv[1], 1000)


@command("pttl", 2, "readonly fast", (1, 1, 1), summary="A key's time to live in ms")
def pttl_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _ttl(state, argv[1], 1)


@command("persist", 2, "write fast", (1, 1, 1), summary="Remove a key's expiry")
def persist_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    if key not in state.keyspace or state.keyspace.expires.pop(key, None) is None:
        return 0
    state.keyspace.touch(key)
    state.propagate(argv)
    return 1


# --------------------------------------------------------------------------
# Strings
# --------------------------------------------------------------------------


@command("get", 2, "readonly fast", (1, 1, 1), summary="Get a string", group="string")
def get_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    value = _get_string(state, argv[1])
    if value is None:
        state.stats.keyspace_misses += 1
    else:
        state.stats.keyspace_hits += 1
    return value


def _parse_set_options(args: list[bytes]) -> tuple[str | None, bool, bool, int | None]:
    """SET's options: (condition NX/XX, GET, KEEPTTL, absolute deadline ms)."""
    condition: str | None = None
    get = keep_ttl = False
    deadline: int | None = None
    expire_seen = False
    i = 0
    while i < len(args):
        option = args[i].upper()
        if option in (b"NX", b"XX") and condition is None:
            condition = option.decode()
        elif option == b"GET" and not get:
            get = True
        elif option == b"KEEPTTL" and not keep_ttl and not expire_seen:
            keep_ttl = True
        elif option in (b"EX", b"PX", b"EXAT", b"PXAT") and not expire_seen and not keep_ttl:
            if i + 1 >= len(args):
                raise CommandError(errors.SYNTAX)
            expire_seen = True
            amount = parse_int(args[i + 1])
            if amount <= 0:
                raise CommandError(errors.INVALID_EXPIRE.format("set"))
            unit = 1000 if option in (b"EX", b"EXAT") else 1
            deadline = amount * unit + (0 if option in (b"EXAT", b"PXAT") else _now_ms())
            if deadline > MAX_OFFSET:
                raise CommandError(errors.INVALID_EXPIRE.format("set"))
            i += 1
        else:
            raise CommandError(errors.SYNTAX)
        i += 1
    return condition, get, keep_ttl, deadline


@command("set", -3, "write denyoom", (1, 1, 1), summary="Set a string", group="string")
def set_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key, value = argv[1], argv[2]
    condition, get, keep_ttl, deadline = _parse_set_options(argv[3:])
    old = state.keyspace.get(key)
    if get and old is not None and not isinstance(old, bytes):
        raise CommandError(errors.WRONGTYPE)
    if (condition == "NX" and old is not None) or (condition == "XX" and old is None):
        return old if get else None
    state.keyspace.set(key, value, keep_ttl=keep_ttl)
    logged = [b"SET", key, value]
    if deadline is not None:
        state.keyspace.set_expire(key, deadline)
        logged += [b"PXAT", b"%d" % deadline]
    elif keep_ttl:
        logged.append(b"KEEPTTL")
    state.propagate(logged)
    return old if get else OK


@command(
    "setnx", 3, "write denyoom fast", (1, 1, 1), summary="Set a missing string", group="string"
)
def setnx_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if argv[1] in state.keyspace:
        return 0
    state.keyspace.set(argv[1], argv[2])
    state.propagate([b"SET", argv[1], argv[2]])
    return 1


@command("getdel", 2, "write fast", (1, 1, 1), summary="Get a string and delete it", group="string")
def getdel_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    value = _get_string(state, argv[1])
    if value is not None:
        state.keyspace.delete(argv[1])
        state.propagate([b"DEL", argv[1]])
    return value


def _incr(state: ServerState, argv: list[bytes], delta: int) -> int:
    key = argv[1]
    current = _get_string(state, key)
    number = 0 if current is None else parse_int(current)
    result = number + delta
    if not -(2**63) <= result <= MAX_OFFSET:
        raise CommandError(errors.INCR_OVERFLOW)
    state.keyspace.set(key, b"%d" % result, keep_ttl=True)
    state.propagate(argv)
    return result


@command("incr", 2, "write denyoom fast", (1, 1, 1), summary="Increment an integer", group="string")
def incr_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _incr(state, argv, 1)


@command("decr", 2, "write denyoom fast", (1, 1, 1), summary="Decrement an integer", group="string")
def decr_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _incr(state, argv, -1)


@command("incrby", 3, "write denyoom fast", (1, 1, 1), summary="Add to an integer", group="string")
def incrby_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _incr(state, argv, parse_int(argv[2]))


@command(
    "decrby", 3, "write denyoom fast", (1, 1, 1), summary="Subtract from an integer", group="string"
)
def decrby_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    delta = parse_int(argv[2])
    if delta == -(2**63):
        raise CommandError("ERR decrement would overflow")
    return _incr(state, argv, -delta)


@command("mget", -2, "readonly fast", (1, -1, 1), summary="Get several strings", group="string")
def mget_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    values = [state.keyspace.get(key) for key in argv[1:]]
    return [value if isinstance(value, bytes) else None for value in values]


@command("mset", -3, "write denyoom", (1, -1, 2), summary="Set several strings", group="string")
def mset_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) % 2 == 0:
        raise CommandError(errors.wrong_arity("mset"))
    for i in range(1, len(argv), 2):
        state.keyspace.set(argv[i], argv[i + 1])
    state.propagate(argv)
    return OK


@command(
    "msetnx", -3, "write denyoom", (1, -1, 2), summary="Set strings if none exists", group="string"
)
def msetnx_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) % 2 == 0:
        raise CommandError(errors.wrong_arity("msetnx"))
    if any(argv[i] in state.keyspace for i in range(1, len(argv), 2)):
        return 0
    for i in range(1, len(argv), 2):
        state.keyspace.set(argv[i], argv[i + 1])
    state.propagate(argv)
    return 1


@command("append", 3, "write denyoom fast", (1, 1, 1), summary="Append to a string", group="string")
def append_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    value = (_get_string(state, argv[1]) or b"") + argv[2]
    state.keyspace.set(argv[1], value, keep_ttl=True)
    state.propagate(argv)
    return len(value)


@command("strlen", 2, "readonly fast", (1, 1, 1), summary="Length of a string", group="string")
def strlen_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return len(_get_string(state, argv[1]) or b"")


# --------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------


@command("dbsize", 1, "readonly fast", summary="Number of keys", group="server")
def dbsize_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return len(state.keyspace)


@command("time", 1, "loading stale fast", summary="Server time", group="server")
def time_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    now_us = time.time_ns() // 1000
    return [b"%d" % (now_us // 1_000_000), b"%d" % (now_us % 1_000_000)]


def _flush(state: ServerState, argv: list[bytes]) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() not in (b"async", b"sync")):
        raise CommandError(errors.SYNTAX)
    state.keyspace.flush()
    state.propagate([b"FLUSHALL"])
    return OK


@command("flushdb", -1, "write", summary="Delete every key", group="server")
def flushdb_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _flush(state, argv)


@command("flushall", -1, "write", summary="Delete every key", group="server")
def flushall_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _flush(state, argv)


def _persistence_call(state: ServerState, method: str, *args: Any) -> Any:
    action = getattr(state.persistence, method, None)
    if action is None:
        raise CommandError(errors.NO_PERSISTENCE)
    return action(*args)


@command("save", 1, "admin noscript", summary="Write a snapshot now", group="server")
def save_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    result = _persistence_call(state, "save")
    return SimpleString(result) if isinstance(result, str) else OK


@command(
    "bgsave", -1, "admin noscript", summary="Write a snapshot in the background", group="server"
)
def bgsave_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() != b"schedule"):
        raise CommandError(errors.SYNTAX)
    result = _persistence_call(state, "bgsave")
    return SimpleString(result if isinstance(result, str) else "Background saving started")


@command(
    "bgrewriteaof", 1, "admin noscript", summary="Rewrite the append only file", group="server"
)
def bgrewriteaof_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    result = _persistence_call(state, "bgrewriteaof")
    return SimpleString(
        result if isinstance(result, str) else "Background append only file rewriting started"
    )


@command("lastsave", 1, "loading stale fast", summary="Time of the last snapshot", group="server")
def lastsave_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    lastsave = getattr(state.persistence, "lastsave", None)
    if lastsave is None:
        raise CommandError(errors.NO_PERSISTENCE)
    return int(lastsave() if callable(lastsave) else lastsave)


@command("shutdown", -1, "admin noscript loading stale", summary="Stop the server", group="server")
def shutdown_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    mode: str | None = None
    for arg in argv[1:]:
        option = arg.lower()
        if option in (b"save", b"nosave") and mode is None:
            mode = option.decode()
        elif option in (b"now", b"force"):
            pass  # nothing to wait for, nothing to force past
        elif option == b"abort" and len(argv) == 2:
            raise CommandError("ERR No shutdown in progress.")
        else:
            raise CommandError(errors.SYNTAX)
    if state.request_shutdown(mode) is False:
        raise CommandError("ERR Errors trying to SHUTDOWN. Check logs.")
    # No reply: the connection closes as the server exits.
    return BLOCKED


@command("memory", -2, "readonly", summary="Memory introspection", group="server")
def memory_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = _check_subcommand(
        "memory", {"usage": -3, "stats": 2, "doctor": 2, "help": 2, "malloc-stats": 2}, argv
    )
    if sub == "usage":
        if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3].lower() != b"samples"):
            raise CommandError(errors.SYNTAX)
        if len(argv) == 5:
            parse_int(argv[4])
        key = argv[2]
        value = state.keyspace.get(key)
        if value is None:
            return None
        return state.keyspace._charge(key, value)
    if sub == "stats":
        keys = len(state.keyspace)
        used = state.keyspace.used_bytes
        return {
            "peak.allocated": used,
            "total.allocated": used,
            "keys.count": keys,
            "keys.bytes-per-key": used // keys if keys else 0,
            "dataset.bytes": used,
            "rss.bytes": _rss_bytes(),
        }
    if sub == "doctor":
        return Verbatim("txt", "Hi Sam, I can't find any memory issue in your instance.")
    if sub == "malloc-stats":
        return Verbatim("txt", "Stats not supported for the current allocator")
    return [
        "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "USAGE <key> [SAMPLES <count>]",
        "    Return memory in bytes used by <key> and its value.",
        "STATS",
        "    Return information about the memory usage of the server.",
        "DOCTOR",
        "    Return memory problems reports.",
        "HELP",
        "    Print this help.",
    ]


def _string_encoding(value: bytes) -> str:
    if len(value) <= 20 and _INTEGER_RE.fullmatch(value) and -(2**63) <= int(value) <= MAX_OFFSET:
        return "int"
    return "embstr" if len(value) <= 44 else "raw"


@command("object", -2, "readonly", summary="Object introspection")
def object_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = _check_subcommand(
        "object", {"encoding": 3, "refcount": 3, "idletime": 3, "freq": 3, "help": 2}, argv
    )
    if sub == "help":
        return [
            "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "ENCODING <key>",
            "    Return the kind of internal representation used in order to store the value",
            "    associated with a <key>: 'macronode' for streams, 'int', 'embstr' or 'raw'",
            "    for strings.",
            "REFCOUNT <key>",
            "    Return the number of references of the value associated with the specified",
            "    <key>.",
            "HELP",
            "    Print this help.",
        ]
    value = state.keyspace.get(argv[2])
    if value is None:
        return None
    if sub == "encoding":
        return _string_encoding(value) if isinstance(value, bytes) else "macronode"
    if sub == "refcount":
        return 1
    if sub == "idletime":
        return 0
    raise CommandError("ERR An LFU maxmemory policy is not selected, access frequency not tracked.")


# ---- CONFIG


@command(
    "config", -2, "admin loading stale", summary="Read and change the configuration", group="server"
)
def config_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    from rcp11.config import ConfigError

    sub = _check_subcommand(
        "config", {"get": -3, "set": -4, "rewrite": 2, "resetstat": 2, "help": 2}, argv
    )
    config = state.config
    try:
        if sub == "get":
            found = config.config_get(*(_text(pattern) for pattern in argv[2:]))
            return {name: _config_text(value) for name, value in found.items()}
        if sub == "set":
            if len(argv) % 2:
                raise CommandError(
                    "ERR Unknown option or number of arguments for CONFIG SET - "
                    f"'{_text(argv[-1])}'"
                )
            config.set_many([(_text(argv[i]), _text(argv[i + 1])) for i in range(2, len(argv), 2)])
            return OK
        if sub == "rewrite":
            config.rewrite()
            return OK
    except ConfigError as exc:
        raise CommandError(exc.message) from None
    if sub == "resetstat":
        _reset_stats(state)
        return OK
    return [
        "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GET <pattern>",
        "    Return parameters matching the glob-like <pattern> and their values.",
        "SET <directive> <value>",
        "    Set the configuration <directive> to <value>.",
        "RESETSTAT",
        "    Reset statistics reported by the INFO command.",
        "REWRITE",
        "    Rewrite the configuration file.",
        "HELP",
        "    Print this help.",
    ]


def _config_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return " ".join(_config_text(v) for v in value)
    if isinstance(value, bytes):
        return _text(value)
    return str(value)


def _reset_stats(state: ServerState) -> None:
    stats = state.stats
    blocked = stats.blocked_clients
    state.stats = type(stats)()
    state.stats.blocked_clients = blocked


# ---- COMMAND

_ACL_CATEGORY = {
    "connection": "@connection",
    "transactions": "@transaction",
    "stream": "@stream",
    "string": "@string",
    "server": "@admin",
    "generic": "@keyspace",
}

# Arguments of the stream commands for COMMAND DOCS, which redis-cli turns
# into the hints it shows while typing.
_STREAM_DOC_ARGUMENTS: dict[str, list[dict[str, Any]]] = {
    "twrite": [
        {"name": "key", "type": "key", "key_spec_index": 0},
        {
            "name": "backlog",
            "type": "integer",
            "token": "BACKLOG",
            "flags": [SimpleString("optional")],
        },
        {"name": "entries", "type": "pure-token", "token": "ENTRIES"},
        {"name": "entry", "type": "string", "flags": [SimpleString("multiple")]},
    ],
    "tread": [
        {"name": "key", "type": "key", "key_spec_index": 0},
        {"name": "offset", "type": "integer"},
        {"name": "count", "type": "integer"},
        {
            "name": "milliseconds",
            "type": "integer",
            "token": "BLOCK",
            "flags": [SimpleString("optional")],
        },
        {
            "name": "group",
            "type": "oneof",
            "flags": [SimpleString("optional")],
            "arguments": [
                {"name": "groupkey", "type": "key", "token": "GROUP", "key_spec_index": 1},
                {"name": "newgroupkey", "type": "key", "token": "GROUPNEW", "key_spec_index": 1},
            ],
        },
        {
            "name": "withinfo",
            "type": "pure-token",
            "token": "WITHINFO",
            "flags": [SimpleString("optional")],
        },
    ],
    "tevict": [
        {"name": "key", "type": "key", "key_spec_index": 0},
        {"name": "offset", "type": "integer"},
    ],
}


def _command_info(cmd: Command) -> list[Any]:
    flags = [SimpleString(flag) for flag in sorted(cmd.flags)]
    categories = [SimpleString(_ACL_CATEGORY.get(cmd.group, "@keyspace"))]
    if "write" in cmd.flags:
        categories.append(SimpleString("@write"))
    elif "readonly" in cmd.flags:
        categories.append(SimpleString("@read"))
    return [
        cmd.name,
        cmd.arity,
        flags,
        cmd.first_key,
        cmd.last_key,
        cmd.step,
        categories,
        [],
        [],
        [],
    ]


def _command_docs(cmd: Command) -> dict[str, Any]:
    docs: dict[str, Any] = {
        "summary": cmd.summary or cmd.name.upper(),
        "since": "1.0.0" if cmd.group != "stream" else __version__,
        "group": cmd.group,
    }
    arguments = _STREAM_DOC_ARGUMENTS.get(cmd.name)
    if arguments is not None:
        docs["arguments"] = arguments
    return docs


@command("command", -1, "loading stale", summary="Describe the commands", group="server")
def command_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) == 1:
        return [_command_info(cmd) for cmd in COMMANDS.values()]
    sub = _check_subcommand(
        "command",
        {"count": 2, "info": -2, "docs": -2, "list": -2, "getkeys": -4, "help": 2},
        argv,
    )
    names = [_text(arg).lower() for arg in argv[2:]]
    if sub == "count":
        return len(COMMANDS)
    if sub == "info":
        if not names:
            return [_command_info(cmd) for cmd in COMMANDS.values()]
        return [_command_info(COMMANDS[n]) if n in COMMANDS else None for n in names]
    if sub == "docs":
        wanted = names or list(COMMANDS)
        return {n: _command_docs(COMMANDS[n]) for n in wanted if n in COMMANDS}
    if sub == "list":
        if not names:
            return list(COMMANDS)
        if len(names) != 3 or names[0] != "filterby":
            raise CommandError(errors.SYNTAX)
        kind, value = names[1], names[2]
        if kind == "pattern":
            match = glob_to_regex(argv[4].lower()).fullmatch
            return [n for n in COMMANDS if match(n.encode())]
        if kind == "aclcat":
            category = "@" + value.lstrip("@")
            return [n for n, c in COMMANDS.items() if category in map(str, _command_info(c)[6])]
        if kind == "module":
            return []
        raise CommandError(errors.SYNTAX)
    if sub == "getkeys":
        target = COMMANDS.get(names[0])
        if target is None:
            raise CommandError("ERR Invalid command specified")
        target_argv = argv[2:]
        if (target.arity > 0 and len(target_argv) != target.arity) or len(
            target_argv
        ) < -target.arity:
            raise CommandError("ERR Invalid number of arguments specified for command")
        keys = target.keys(target_argv)
        if target.name == "tread":
            keys += _tread_group_keys(target_argv)
        if not keys:
            raise CommandError("ERR The command has no key arguments")
        return keys
    return [
        "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "(no subcommand)",
        "    Return details about all commands.",
        "COUNT",
        "    Return the total number of commands in this server.",
        "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
        "    Return a list of all commands in this server.",
        "INFO [<command-name> ...]",
        "    Return details about multiple commands.",
        "DOCS [<command-name> ...]",
        "    Return documentation details about multiple commands.",
        "GETKEYS <full-command>",
        "    Return the keys from a full command.",
        "HELP",
        "    Print this help.",
    ]


def _tread_group_keys(argv: list[bytes]) -> list[bytes]:
    return [
        argv[i + 1] for i in range(4, len(argv) - 1) if argv[i].upper() in (b"GROUP", b"GROUPNEW")
    ]


# ---- INFO


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _human(size: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            return f"{size:.2f}{unit}" if unit != "B" else f"{int(size)}B"
        size /= 1024
    return f"{size:.2f}P"


def _info_server(state: ServerState) -> dict[str, Any]:
    now = time.time()
    uptime = int(now - state.start_time)
    config_file = getattr(state.config, "path", None) or getattr(state.config, "filename", "")
    return {
        "redis_version": REDIS_COMPAT_VERSION,
        "rcp11_version": __version__,
        "redis_mode": "standalone",
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "arch_bits": 64 if sys.maxsize > 2**32 else 32,
        "multiplexing_api": "asyncio",
        "python_version": platform.python_version(),
        "process_id": os.getpid(),
        "run_id": state.run_id,
        "tcp_port": state.tcp_port,
        "server_time_usec": time.time_ns() // 1000,
        "uptime_in_seconds": uptime,
        "uptime_in_days": uptime // 86400,
        "hz": 10,
        "configured_hz": 10,
        "executable": sys.argv[0] if sys.argv else "",
        "config_file": config_file or "",
    }


def _info_clients(state: ServerState) -> dict[str, Any]:
    return {
        "connected_clients": len(state.clients),
        "cluster_connections": 0,
        "maxclients": _config(state, "maxclients", 10000),
        "blocked_clients": state.stats.blocked_clients,
        "tracking_clients": 0,
        "clients_in_timeout_table": state.stats.blocked_clients,
    }


def _info_memory(state: ServerState) -> dict[str, Any]:
    used = state.keyspace.used_bytes
    rss = _rss_bytes()
    maxmemory = int(_config(state, "maxmemory", 0))
    return {
        "used_memory": used,
        "used_memory_human": _human(used),
        "used_memory_rss": rss,
        "used_memory_rss_human": _human(rss),
        "used_memory_dataset": used,
        "maxmemory": maxmemory,
        "maxmemory_human": _human(maxmemory),
        "maxmemory_policy": "noeviction",
        "mem_allocator": "libc",
    }


def _info_persistence(state: ServerState) -> dict[str, Any]:
    fields: dict[str, Any] = {"loading": int(state.loading)}
    fields.update(state.persistence.info())
    fields.setdefault("rdb_changes_since_last_save", state.dirty)
    return fields


def _info_stats(state: ServerState) -> dict[str, Any]:
    stats = state.stats
    return {
        "total_connections_received": stats.total_connections_received,
        "total_commands_processed": stats.total_commands_processed,
        "instantaneous_ops_per_sec": 0,
        "total_net_input_bytes": stats.total_net_input_bytes,
        "total_net_output_bytes": stats.total_net_output_bytes,
        "rejected_connections": stats.rejected_connections,
        "expired_keys": stats.expired_keys,
        "evicted_keys": stats.evicted_keys,
        "keyspace_hits": stats.keyspace_hits,
        "keyspace_misses": stats.keyspace_misses,
        "pubsub_channels": 0,
        "pubsub_patterns": 0,
        "total_error_replies": sum(row[3] + row[2] for row in stats.commands.values()),
        "total_messages_written": stats.total_messages_written,
        "total_messages_read": stats.total_messages_read,
        "total_messages_evicted": stats.total_messages_evicted,
    }


def _info_replication(state: ServerState) -> dict[str, Any]:
    return {
        "role": "master",
        "connected_slaves": 0,
        "master_failover_state": "no-failover",
        "master_replid": state.run_id[:40].ljust(40, "0"),
        "master_repl_offset": 0,
        "repl_backlog_active": 0,
    }


def _info_cpu(state: ServerState) -> dict[str, Any]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "used_cpu_sys": f"{me.ru_stime:.6f}",
        "used_cpu_user": f"{me.ru_utime:.6f}",
        "used_cpu_sys_children": f"{children.ru_stime:.6f}",
        "used_cpu_user_children": f"{children.ru_utime:.6f}",
    }


def _info_keyspace(state: ServerState) -> dict[str, Any]:
    keys = len(state.keyspace)
    if not keys:
        return {}
    return {"db0": f"keys={keys},expires={len(state.keyspace.expires)},avg_ttl=0"}


def _info_streams(state: ServerState) -> dict[str, Any]:
    streams = messages = nodes = compressed = payload = memory = 0
    for value in state.keyspace.data.values():
        if isinstance(value, bytes):
            continue
        streams += 1
        messages += value.length
        nodes += value.num_nodes
        compressed += value.num_compressed_nodes
        payload += value.payload_bytes
        memory += value.memory_bytes
    return {
        "streams": streams,
        "stream_messages": messages,
        "stream_nodes": nodes,
        "stream_compressed_nodes": compressed,
        "stream_payload_bytes": payload,
        "stream_memory_bytes": memory,
        "stream_node_max_entries": _config(state, "stream-node-max-entries", 1000),
        "stream_compression": _config(state, "stream-compression", "no"),
    }


def _info_commandstats(state: ServerState) -> dict[str, Any]:
    fields = {}
    for name, (calls, usec, rejected, failed) in sorted(state.stats.commands.items()):
        per_call = usec / calls if calls else 0.0
        fields[f"cmdstat_{name}"] = (
            f"calls={calls},usec={usec},usec_per_call={per_call:.2f},"
            f"rejected_calls={rejected},failed_calls={failed}"
        )
    return fields


_INFO_SECTIONS: dict[str, Callable[[ServerState], dict[str, Any]]] = {
    "server": _info_server,
    "clients": _info_clients,
    "memory": _info_memory,
    "persistence": _info_persistence,
    "stats": _info_stats,
    "replication": _info_replication,
    "cpu": _info_cpu,
    "keyspace": _info_keyspace,
    "streams": _info_streams,
    "commandstats": _info_commandstats,
}
_INFO_DEFAULT = [name for name in _INFO_SECTIONS if name != "commandstats"]


def info_text(state: ServerState, sections: list[str]) -> str:
    """INFO's text for the named sections ([] = default)."""
    wanted: list[str] = []
    for section in sections or ["default"]:
        if section == "default":
            wanted += _INFO_DEFAULT
        elif section in ("all", "everything"):
            wanted += list(_INFO_SECTIONS)
        elif section in _INFO_SECTIONS:
            wanted.append(section)
    parts = []
    for section in dict.fromkeys(wanted):
        fields = _INFO_SECTIONS[section](state)
        title = "CPU" if section == "cpu" else section.capitalize()
        lines = [f"# {title}"] + [f"{k}:{v}" for k, v in fields.items()]
        parts.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(parts)


@command("info", -1, "loading stale", summary="Server information and statistics", group="server")
def info_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    text = info_text(state, [_text(arg).lower() for arg in argv[1:]])
    return Verbatim("txt", text)


__all__ = [
    "BLOCKED",
    "COMMANDS",
    "Command",
    "client_disconnected",
    "execute",
    "expire_keys",
    "glob_to_regex",
    "info_text",
    "parse_int",
]
