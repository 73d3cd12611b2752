"""Keyspace commands: DEL EXISTS TYPE KEYS SCAN RENAME and expiry."""

from __future__ import annotations

import weakref
from typing import Any

from rcp11 import errors
from rcp11.commands.args import now_ms, parse_int, text
from rcp11.commands.table import KeySpec, command
from rcp11.errors import CommandError
from rcp11.limits import INT64_MAX, INT64_MIN
from rcp11.resp import OK, SimpleString
from rcp11.state import ClientState, ServerState
from rcp11.storage.ackgroups import GROUP_TYPE, AckGroup
from rcp11.stringmatch import compile_glob


def _delete_keys(state: ServerState, argv: list[bytes]) -> int:
    deleted = state.keyspace.delete_many(argv[1:])
    if deleted:
        state.propagate(argv)
    return deleted


_DELETES = (KeySpec(("RM", "DELETE"), index=1, lastkey=-1),)
# RENAME reads and deletes the source, writes over the destination.
_RENAMES = (
    KeySpec(("RW", "ACCESS", "DELETE"), index=1),
    KeySpec(("OW", "INSERT"), index=2),
)


@command("del", -2, "write", (1, -1, 1), summary="Delete keys", key_specs=_DELETES)
def del_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _delete_keys(state, argv)


@command("unlink", -2, "write fast", (1, -1, 1), summary="Delete keys", key_specs=_DELETES)
def unlink_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _delete_keys(state, argv)


@command("exists", -2, "readonly fast", (1, -1, 1), summary="Count existing keys")
def exists_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return sum(key in state.keyspace for key in argv[1:])


# TYPE's answer for a stream: the name of the Redis module's data type, so
# that both servers answer alike (docs/PROTOCOL.md section 5).
STREAM_TYPE = "rcp11-log"


def _type_name(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, AckGroup):
        return GROUP_TYPE
    return "string" if isinstance(value, bytes) else STREAM_TYPE


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
    return compile_glob(argv[1]).filter(_live_keys(state))


# SCAN's cursor names a snapshot of the key names, taken when the scan
# started (SCAN 0: one copy of the keyspace's key list, no sort, so starting
# a scan over a million keys costs a few milliseconds), and a position in
# it: cursor = snapshot id * 2^32 + position. Every key present for the
# whole scan is returned exactly once; keys added meanwhile are not, keys
# deleted meanwhile are skipped. A bounded number of scans is kept; a cursor
# whose snapshot was dropped (too many scans at once, or a restart) starts
# over from a new snapshot, which may return keys again, as Redis's SCAN
# may. Kept: at most _SCANS_KEPT scans, holding at most _SCAN_KEYS_KEPT
# times the keyspace's keys between them (a snapshot is a list of
# references: 8 bytes per key).
_SCANS_KEPT = 16
_SCAN_KEYS_KEPT = 4
_POSITION_BITS = 32


class _Scans:
    __slots__ = ("snapshots", "next_id")

    def __init__(self) -> None:
        self.snapshots: dict[int, list[bytes]] = {}  # least recently used first
        self.next_id = 1

    def start(self, keyspace: Any) -> tuple[int, list[bytes]]:
        snapshots = self.snapshots
        keys = list(keyspace)
        budget = _SCAN_KEYS_KEPT * max(len(keys), 1024)
        held = sum(map(len, snapshots.values()))
        while snapshots and (len(snapshots) >= _SCANS_KEPT or held + len(keys) > budget):
            held -= len(snapshots.pop(next(iter(snapshots))))
        scan_id = self.next_id
        self.next_id = scan_id + 1 if scan_id < 2**30 else 1
        snapshots[scan_id] = keys
        return scan_id, keys


_scans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _scan_snapshot(state: ServerState, cursor: int) -> tuple[int, list[bytes], int]:
    """(snapshot id, its keys, position) for a cursor."""
    scans = _scans.get(state.keyspace)
    if scans is None:
        scans = _scans[state.keyspace] = _Scans()
    scan_id, position = cursor >> _POSITION_BITS, cursor & (2**_POSITION_BITS - 1)
    keys = scans.snapshots.pop(scan_id, None) if cursor else None
    if keys is None or position > len(keys):
        scan_id, keys = scans.start(state.keyspace)
        position = 0
    else:
        scans.snapshots[scan_id] = keys  # the most recently used now
    return scan_id, keys, position


def _scan_done(state: ServerState, scan_id: int) -> None:
    scans = _scans.get(state.keyspace)
    if scans is not None:
        scans.snapshots.pop(scan_id, None)


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
            # As Redis: "*" alone matches every key, the empty one too.
            match = None if argv[i + 1] == b"*" else compile_glob(argv[i + 1]).match
        elif option == b"type":
            wanted_type = text(argv[i + 1]).lower()
        else:
            raise CommandError(errors.SYNTAX)
        i += 2
    scan_id, keys, begin = _scan_snapshot(state, cursor)
    end = min(begin + count, len(keys))
    if end < len(keys):
        next_cursor = (scan_id << _POSITION_BITS) | end
    else:
        next_cursor = 0
        _scan_done(state, scan_id)
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


@command("rename", 3, "write", (1, 2, 1), summary="Rename a key", key_specs=_RENAMES)
def rename_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    src, dst = argv[1], argv[2]
    if src not in state.keyspace:
        raise CommandError(errors.NO_SUCH_KEY)
    if src != dst:
        state.keyspace.rename(src, dst)
        state.propagate(argv)
    return OK


@command(
    "renamenx",
    3,
    "write fast",
    (1, 2, 1),
    summary="Rename a key unless the new name exists",
    key_specs=_RENAMES,
)
def renamenx_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    src, dst = argv[1], argv[2]
    if src not in state.keyspace:
        raise CommandError(errors.NO_SUCH_KEY)
    if dst in state.keyspace:
        return 0
    state.keyspace.rename(src, dst)
    state.propagate(argv)
    return 1


def _set_deadline(state: ServerState, key: bytes, when_ms: int) -> None:
    """Give key the deadline when_ms and log it in absolute form; a
    deadline already past deletes the key, as Redis does, except while the
    files load: a replayed deadline that has passed since it was logged
    only sets the TTL (as redis-server's checkAlreadyExpired), so the
    commands logged after it replay onto the key they ran on, and the key
    expires after loading."""
    if when_ms <= now_ms() and not state.loading:
        state.keyspace.delete(key)
        state.propagate([b"DEL", key])
    else:
        state.keyspace.set_expire(key, when_ms)
        state.keyspace.touch(key)  # a new TTL fails WATCHers' EXEC, as in Redis
        state.propagate([b"PEXPIREAT", key, b"%d" % when_ms])


def _expire_generic(
    state: ServerState, argv: list[bytes], unit_ms: int, absolute: bool, name: str
) -> int:
    key = argv[1]
    amount = parse_int(argv[2])
    when_ms = amount * unit_ms + (0 if absolute else now_ms())
    if not INT64_MIN <= when_ms <= INT64_MAX:
        raise CommandError(errors.INVALID_EXPIRE.format(name))
    flags = {arg.lower() for arg in argv[3:]}
    if not flags <= {b"nx", b"xx", b"gt", b"lt"} or len(flags) != len(argv) - 3:
        raise CommandError(errors.unsupported_option(text(argv[3])))
    if b"nx" in flags and len(flags) > 1 or {b"gt", b"lt"} <= flags:
        raise CommandError(errors.EXPIRE_FLAGS_INCOMPATIBLE)
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


def _ttl(state: ServerState, key: bytes, unit_ms: int, absolute: bool = False) -> int:
    """-2 without the key, -1 without an expiry, else the time left (or,
    absolute, the unix time it expires at) in unit_ms, rounded as Redis."""
    if key not in state.keyspace:
        return -2
    when = state.keyspace.expires.get(key)
    if when is None:
        return -1
    remaining = max(when if absolute else when - now_ms(), 0)
    return (remaining + unit_ms // 2) // unit_ms


@command("ttl", 2, "readonly fast", (1, 1, 1), summary="A key's time to live in seconds")
def ttl_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _ttl(state, argv[1], 1000)


@command("pttl", 2, "readonly fast", (1, 1, 1), summary="A key's time to live in ms")
def pttl_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _ttl(state, argv[1], 1)


@command("expiretime", 2, "readonly fast", (1, 1, 1), summary="When a key expires, unix seconds")
def expiretime_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _ttl(state, argv[1], 1000, absolute=True)


@command("pexpiretime", 2, "readonly fast", (1, 1, 1), summary="When a key expires, unix ms")
def pexpiretime_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _ttl(state, argv[1], 1, absolute=True)


@command("persist", 2, "write fast", (1, 1, 1), summary="Remove a key's expiry")
def persist_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    key = argv[1]
    if key not in state.keyspace or state.keyspace.expires.pop(key, None) is None:
        return 0
    state.keyspace.touch(key)
    state.propagate(argv)
    return 1
