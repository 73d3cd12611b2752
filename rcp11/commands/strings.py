"""String commands (group keys are strings): GET SET INCR MGET ..."""

from __future__ import annotations

from typing import Any

from rcp11 import errors
from rcp11.commands.args import get_string, now_ms, parse_int
from rcp11.commands.table import command
from rcp11.errors import CommandError
from rcp11.limits import INT64_MAX, INT64_MIN
from rcp11.resp import OK
from rcp11.state import ClientState, ServerState


@command("get", 2, "readonly fast", (1, 1, 1), summary="Get a string", group="string")
def get_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    value = get_string(state, argv[1])
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
            deadline = amount * unit + (0 if option in (b"EXAT", b"PXAT") else now_ms())
            if deadline > INT64_MAX:
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


def _set_with_ttl(state: ServerState, argv: list[bytes], unit_ms: int, name: str) -> Any:
    key, value = argv[1], argv[3]
    amount = parse_int(argv[2])
    if amount <= 0 or amount * unit_ms + now_ms() > INT64_MAX:
        raise CommandError(errors.INVALID_EXPIRE.format(name))
    deadline = amount * unit_ms + now_ms()
    state.keyspace.set(key, value)
    state.keyspace.set_expire(key, deadline)
    state.propagate([b"SET", key, value, b"PXAT", b"%d" % deadline])
    return OK


@command(
    "setex", 4, "write denyoom", (1, 1, 1), summary="Set a string with a TTL in s", group="string"
)
def setex_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _set_with_ttl(state, argv, 1000, "setex")


@command(
    "psetex", 4, "write denyoom", (1, 1, 1), summary="Set a string with a TTL in ms", group="string"
)
def psetex_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _set_with_ttl(state, argv, 1, "psetex")


@command(
    "getset",
    3,
    "write denyoom fast",
    (1, 1, 1),
    summary="Set a string, return the old",
    group="string",
)
def getset_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    old = get_string(state, argv[1])
    state.keyspace.set(argv[1], argv[2])
    state.propagate([b"SET", argv[1], argv[2]])
    return old


@command("getdel", 2, "write fast", (1, 1, 1), summary="Get a string and delete it", group="string")
def getdel_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    value = get_string(state, argv[1])
    if value is not None:
        state.keyspace.delete(argv[1])
        state.propagate([b"DEL", argv[1]])
    return value


def _incr(state: ServerState, argv: list[bytes], delta: int) -> int:
    key = argv[1]
    current = get_string(state, key)
    number = 0 if current is None else parse_int(current)
    result = number + delta
    if not INT64_MIN <= result <= INT64_MAX:
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
    if delta == INT64_MIN:
        raise CommandError(errors.DECREMENT_OVERFLOW)
    return _incr(state, argv, -delta)


@command("mget", -2, "readonly fast", (1, -1, 1), summary="Get several strings", group="string")
def mget_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    values = state.keyspace.get_many(argv[1:])
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
    value = (get_string(state, argv[1]) or b"") + argv[2]
    state.keyspace.set(argv[1], value, keep_ttl=True)
    state.propagate(argv)
    return len(value)


@command("strlen", 2, "readonly fast", (1, 1, 1), summary="Length of a string", group="string")
def strlen_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return len(get_string(state, argv[1]) or b"")
