"""Connection commands: PING ECHO QUIT RESET MONITOR AUTH HELLO SELECT CLIENT."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

from rcp11 import errors, pause
from rcp11.commands.args import (
    REDIS_COMPAT_VERSION,
    check_subcommand,
    config_value,
    on_off,
    parse_int,
    text,
)
from rcp11.commands.core import (
    client_disconnected,
    count_error,
    requirepass_set,
    stop_monitor,
    unwatch_all,
)
from rcp11.commands.table import command
from rcp11.errors import CommandError
from rcp11.resp import OK, PONG, SimpleString, Verbatim
from rcp11.state import ClientState, ServerState


@command("ping", -1, "fast stale", summary="Ping the server", group="connection")
def ping_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        raise CommandError(errors.wrong_arity("ping"))
    return PONG if len(argv) == 1 else argv[1]


@command("echo", 2, "fast", summary="Echo the given string", group="connection")
def echo_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return argv[1]


@command(
    "quit", -1, "no_auth loading stale fast", summary="Close the connection", group="connection"
)
def quit_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    # The server closes the connection once this reply is written.
    client.closing = True
    return OK


@command(
    "reset", 1, "no_auth loading stale fast", summary="Reset the connection", group="connection"
)
def reset_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    client.queued = None
    client.multi_error = False
    unwatch_all(state, client)
    client.resp = 2
    client.name = b""
    client.db = 0
    client.authenticated = not requirepass_set(state)
    stop_monitor(state, client)
    return SimpleString("RESET")


# What MONITOR shows instead of a secret (Redis's shared.redacted).
REDACTED = b"(redacted)"


@command(
    "monitor",
    1,
    "admin noscript loading stale",
    summary="Listen for all requests received by the server in real time",
    group="server",
)
def monitor_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """From now on the client is sent every command the server runs, as
    commands.core.feed_monitors() writes it (MONITOR itself and other admin
    commands are not shown, as in Redis). RESET or closing ends it."""
    if client.deny_blocking:
        # Inside EXEC: a client that expects one reply per command.
        raise CommandError(errors.MONITOR_DENY_BLOCKING)
    if not client.monitor:
        client.monitor = True
        state.monitors.append(client)
    return OK


def _authenticate(state: ServerState, client: ClientState, user: bytes, password: bytes) -> None:
    required = config_value(state, "requirepass", "")
    if isinstance(required, str):
        required = required.encode("utf-8", "surrogateescape")
    # Constant time, as Redis compares SHA-256 hashes of passwords: digests
    # of equal length, so neither the bytes nor the length of the password
    # shows in how long a wrong guess takes.
    matches = hmac.compare_digest(_digest(password), _digest(required))
    # The only user is "default"; without requirepass it takes any password.
    if user != b"default" or not (matches or not required):
        raise CommandError(errors.WRONGPASS)
    client.authenticated = True


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def _redact_all(argv: list[bytes]) -> list[bytes]:
    """AUTH as MONITOR shows it: every argument is a secret."""
    return argv[:1] + [REDACTED] * (len(argv) - 1)


def _redact_hello_auth(argv: list[bytes]) -> list[bytes]:
    """HELLO as MONITOR shows it: the user and password after AUTH hidden."""
    shown = list(argv)
    for i in range(2, len(shown) - 2):
        if shown[i].lower() == b"auth":
            shown[i + 1] = shown[i + 2] = REDACTED
            break
    return shown


@command(
    "auth",
    -2,
    "no_auth loading stale fast",
    summary="Authenticate",
    group="connection",
    redact=_redact_all,
)
def auth_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        raise CommandError(errors.SYNTAX)
    if len(argv) == 2:
        if not requirepass_set(state):
            raise CommandError(errors.AUTH_NOT_CONFIGURED)
        _authenticate(state, client, b"default", argv[1])
    else:
        _authenticate(state, client, argv[1], argv[2])
    return OK


@command(
    "hello",
    -1,
    "no_auth loading stale fast",
    summary="Handshake",
    group="connection",
    redact=_redact_hello_auth,
)
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
            raise CommandError(errors.hello_option(text(argv[i])))
    if auth is not None:
        _authenticate(state, client, *auth)
    elif not client.authenticated and requirepass_set(state):
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
    flags = "O" if client.monitor else ""
    if client.blocked is not None:
        flags += "b"
    if client.dirty_cas:
        flags += "d"
    if client.queued is not None:
        flags += "x"
    if client.closing:
        flags += "c"
    return flags or "N"


def client_line(client: ClientState, now: float) -> str:
    client.refresh()
    fields = [
        ("id", client.id),
        ("addr", client.addr),
        ("laddr", client.laddr),
        ("fd", client.fd),
        ("name", text(client.name)),
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
        ("lib-name", text(client.lib_name)),
        ("lib-ver", text(client.lib_ver)),
    ]
    return " ".join(f"{name}={value}" for name, value in fields)


def _all_clients(state: ServerState, me: ClientState) -> list[ClientState]:
    # A client being closed (killed, over a limit) is gone for CLIENT LIST
    # and KILL at once, as Redis frees it at once: its connection may take
    # another loop iteration or two to report the close.
    clients = [c for c in state.clients.values() if not c.closing or c is me]
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
    "PAUSE <timeout> [WRITE|ALL]",
    "    Suspend all, or just write, clients for <timeout> milliseconds.",
    "SETINFO <LIB-NAME|LIB-VER> <value>",
    "    Set client library name or version, shown by CLIENT LIST.",
    "SETNAME <name>",
    "    Assign the name <name> to the current connection.",
    "UNBLOCK <clientid> [TIMEOUT|ERROR]",
    "    Unblock the specified blocked client.",
    "UNPAUSE",
    "    Stop the current client pause, resuming traffic.",
    "HELP",
    "    Prints this help.",
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
    "unblock": -3,
    "pause": -3,
    "unpause": 2,
    "help": 2,
}


@command("client", -2, "loading stale", summary="Manage client connections", group="connection")
def client_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = check_subcommand("client", _CLIENT_ARITY, argv)
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
        return Verbatim("txt", client_line(client, now) + "\n")
    if sub == "list":
        return Verbatim("txt", _client_list(state, client, argv[2:], now))
    if sub == "kill":
        return _client_kill(state, client, argv[2:])
    if sub == "setinfo":
        what = argv[2].lower()
        if what not in (b"lib-name", b"lib-ver"):
            raise CommandError(errors.unrecognized_option(text(argv[2])))
        if any(b < 0x21 or b > 0x7E for b in argv[3]):
            raise CommandError(errors.setinfo_bad_chars(text(what)))
        if what == b"lib-name":
            client.lib_name = argv[3]
        else:
            client.lib_ver = argv[3]
        return OK
    if sub in ("no-evict", "no-touch"):
        on_off(argv[2])
        return OK
    if sub == "unblock":
        return _client_unblock(state, argv)
    if sub == "pause":
        return _client_pause(state, argv)
    if sub == "unpause":
        state.pause.end()
        return OK
    return _CLIENT_HELP


_PAUSE_MODES = {b"write": pause.WRITE, b"all": pause.ALL}


def _client_pause(state: ServerState, argv: list[bytes]) -> Any:
    """CLIENT PAUSE ms [WRITE|ALL]: answered at once; from the next command
    on, what the pause covers waits (rcp11/pause.py)."""
    if len(argv) > 4:
        raise CommandError(errors.subcommand_syntax(text(argv[1]), "client"))
    # Redis's texts for a timeout in milliseconds (TREAD BLOCK's too).
    ms = parse_int(argv[2], errors.TREAD_TIMEOUT)
    if ms < 0:
        raise CommandError(errors.NEGATIVE_TIMEOUT)
    mode = pause.ALL
    if len(argv) == 4:
        mode = _PAUSE_MODES.get(argv[3].lower(), pause.OFF)
        if mode == pause.OFF:
            raise CommandError(errors.PAUSE_MODE)
    state.pause.start(ms, mode)
    return OK


def _client_unblock(state: ServerState, argv: list[bytes]) -> int:
    """CLIENT UNBLOCK id [TIMEOUT|ERROR]: 1 if that client was blocked."""
    if len(argv) > 4:
        raise CommandError(errors.SYNTAX)
    target_id = parse_int(argv[2])
    reason = argv[3].lower() if len(argv) == 4 else b"timeout"
    if reason not in (b"timeout", b"error"):
        raise CommandError(errors.UNBLOCK_REASON)
    target = state.clients.get(target_id)
    if target is None or not state.blocking.unblock(target, error=reason == b"error"):
        return 0
    if reason == b"error":
        count_error(state, errors.UNBLOCKED)
    return 1


def _client_list(state: ServerState, me: ClientState, args: list[bytes], now: float) -> str:
    clients = _all_clients(state, me)
    if args:
        option = args[0].lower()
        if option == b"type" and len(args) == 2:
            kind = args[1].lower()
            if kind not in (b"normal", b"master", b"replica", b"slave", b"pubsub"):
                raise CommandError(errors.unknown_client_type(text(args[1])))
            if kind != b"normal":
                clients = []
        elif option == b"id" and len(args) >= 2:
            wanted = set()
            for arg in args[1:]:
                try:
                    wanted.add(parse_int(arg))
                except CommandError:
                    raise CommandError(errors.INVALID_CLIENT_ID) from None
            clients = [c for c in clients if c.id in wanted]
        else:
            raise CommandError(errors.SYNTAX)
    return "".join(client_line(c, now) + "\n" for c in clients)


def _client_kill(state: ServerState, me: ClientState, args: list[bytes]) -> Any:
    clients = _all_clients(state, me)
    if len(args) == 1:  # the old form: CLIENT KILL ip:port, answers OK
        addr = text(args[0])
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
                raise CommandError(errors.CLIENT_ID_POSITIVE)
            tests.append(lambda c, wanted_id=wanted_id: c.id == wanted_id)
        elif option == b"addr":
            addr = text(value)
            tests.append(lambda c, addr=addr: c.addr == addr)
        elif option == b"laddr":
            laddr = text(value)
            tests.append(lambda c, laddr=laddr: c.laddr == laddr)
        elif option == b"type":
            kind = value.lower()
            if kind not in (b"normal", b"master", b"replica", b"slave", b"pubsub"):
                raise CommandError(errors.unknown_client_type(text(value)))
            tests.append(lambda c, normal=kind == b"normal": normal)
        elif option == b"user":
            if value != b"default":
                raise CommandError(errors.no_such_user(text(value)))
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
