"""Server commands: DBSIZE TIME FLUSH* SAVE BGSAVE BGREWRITEAOF LASTSAVE SHUTDOWN
MEMORY OBJECT CONFIG. COMMAND is in introspection.py, INFO in info.py."""

from __future__ import annotations

import time
from typing import Any

from rcp11 import errors
from rcp11.commands.args import (
    INTEGER_RE,
    check_subcommand,
    parse_int,
    text,
)
from rcp11.commands.connection import REDACTED
from rcp11.commands.core import BLOCKED
from rcp11.commands.info import rss_bytes
from rcp11.commands.table import command
from rcp11.errors import CommandError
from rcp11.libc import libc_version, mallinfo, malloc_trim
from rcp11.limits import INT64_MAX, INT64_MIN
from rcp11.resp import OK, SimpleString, Verbatim
from rcp11.state import ClientState, ServerState
from rcp11.storage import Stream


@command("dbsize", 1, "readonly fast", summary="Number of keys", group="server")
def dbsize_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return len(state.keyspace)


@command("time", 1, "loading stale fast", summary="Server time", group="server")
def time_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    now_us = time.time_ns() // 1000
    return [b"%d" % (now_us // 1_000_000), b"%d" % (now_us % 1_000_000)]


def _flush(state: ServerState, argv: list[bytes], save: bool = False) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() not in (b"async", b"sync")):
        raise CommandError(errors.SYNTAX)
    state.keyspace.flush()
    state.propagate([b"FLUSHALL"])
    if save and not state.loading:
        state.persistence.flushall()
    blocking = state.blocking
    if blocking.active:
        # Waiting group readers must re-resolve their start against the now
        # empty keyspace before the next write, or a GROUPNEW reader would
        # resolve it after that write and skip the message that wakes it.
        for key in list(blocking.waiting):
            blocking.signal_key(key)
    return OK


@command("flushdb", -1, "write", summary="Delete every key", group="server")
def flushdb_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _flush(state, argv)


@command("flushall", -1, "write", summary="Delete every key", group="server")
def flushall_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return _flush(state, argv, save=True)


@command("save", 1, "admin noscript", summary="Write a snapshot now", group="server")
def save_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return SimpleString(state.persistence.save())


@command(
    "bgsave", -1, "admin noscript", summary="Write a snapshot in the background", group="server"
)
def bgsave_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() != b"schedule"):
        raise CommandError(errors.SYNTAX)
    return SimpleString(state.persistence.bgsave(len(argv) == 2))


@command(
    "bgrewriteaof", 1, "admin noscript", summary="Rewrite the append only file", group="server"
)
def bgrewriteaof_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return SimpleString(state.persistence.bgrewriteaof())


@command("lastsave", 1, "loading stale fast", summary="Time of the last snapshot", group="server")
def lastsave_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return state.persistence.lastsave()


@command(
    "shutdown",
    -1,
    "admin noscript loading stale no_multi",
    summary="Stop the server",
    group="server",
)
def shutdown_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    mode: str | None = None
    for arg in argv[1:]:
        option = arg.lower()
        if option in (b"save", b"nosave") and mode is None:
            mode = option.decode()
        elif option in (b"now", b"force"):
            pass  # nothing to wait for, nothing to force past
        elif option == b"abort" and len(argv) == 2:
            raise CommandError(errors.NO_SHUTDOWN_IN_PROGRESS)
        else:
            raise CommandError(errors.SYNTAX)
    if state.request_shutdown(mode) is False:
        raise CommandError(errors.SHUTDOWN_FAILED)
    # No reply: the connection closes as the server exits.
    return BLOCKED


@command("memory", -2, "readonly", summary="Memory introspection", group="server")
def memory_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = check_subcommand(
        "memory",
        {"usage": -3, "stats": 2, "doctor": 2, "help": 2, "malloc-stats": 2, "purge": 2},
        argv,
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
        dataset = state.keyspace.used_bytes
        allocated = state.allocated_memory()  # INFO's used_memory
        return {
            "peak.allocated": state.used_memory_peak(allocated),
            "total.allocated": allocated,
            "keys.count": keys,
            "keys.bytes-per-key": dataset // keys if keys else 0,
            "dataset.bytes": dataset,
            "rss.bytes": rss_bytes(),
        }
    if sub == "doctor":
        return Verbatim("txt", "Hi Sam, I can't find any memory issue in your instance.")
    if sub == "malloc-stats":
        return Verbatim("txt", _malloc_stats(state))
    if sub == "purge":
        # redis-server purges jemalloc's dirty pages; glibc's equivalent is
        # malloc_trim(0). OK either way, as redis-server built without jemalloc.
        malloc_trim()
        return OK
    return [
        "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "DOCTOR",
        "    Return memory problems reports.",
        "MALLOC-STATS",
        "    Return internal statistics report from the memory allocator.",
        "PURGE",
        "    Attempt to purge dirty pages for reclamation by the allocator.",
        "STATS",
        "    Return information about the memory usage of the server.",
        "USAGE <key> [SAMPLES <count>]",
        "    Return memory in bytes used by <key> and its value.",
        "HELP",
        "    Prints this help.",
    ]


# MEMORY MALLOC-STATS's lines: (name shown, mallinfo2 field), all in bytes.
_MALLINFO_LINES = (
    ("arena_bytes", "arena"),  # taken from the system with brk, all arenas
    ("in_use_bytes", "uordblks"),
    ("free_bytes", "fordblks"),
    ("releasable_bytes", "keepcost"),  # what MEMORY PURGE can give back at once
    ("mmap_bytes", "hblkhd"),  # large blocks mapped one by one
)


def _malloc_stats(state: ServerState) -> str:
    """glibc's statistics (redis-server prints jemalloc's) beside the storage
    core's own accounting; one "name:value" line each, as INFO writes them."""
    info = mallinfo()
    if info is None:
        return "Stats not supported for the current allocator"
    streams = sum(v.memory_bytes for v in state.keyspace.data.values() if isinstance(v, Stream))
    lines = [f"___ Begin glibc {libc_version()} malloc statistics ___"]
    lines += [f"{name}:{info[field]}" for name, field in _MALLINFO_LINES]
    lines += [f"mmap_chunks:{info['hblks']}", f"stream_memory_bytes:{streams}"]
    lines.append("___ End glibc malloc statistics ___")
    return "\n".join(lines) + "\n"


def _string_encoding(value: bytes) -> str:
    if len(value) <= 20 and INTEGER_RE.fullmatch(value) and INT64_MIN <= int(value) <= INT64_MAX:
        return "int"
    return "embstr" if len(value) <= 44 else "raw"


@command("object", -2, "readonly", summary="Object introspection")
def object_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = check_subcommand(
        "object", {"encoding": 3, "refcount": 3, "idletime": 3, "freq": 3, "help": 2}, argv
    )
    if sub == "help":
        return [
            "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "ENCODING <key>",
            "    Return the kind of internal representation used in order to store the value",
            "    associated with a <key>: 'macronode' for streams, 'ranges' for",
            "    acknowledged groups, 'int', 'embstr' or 'raw' for strings.",
            "REFCOUNT <key>",
            "    Return the number of references of the value associated with the specified",
            "    <key>.",
            "HELP",
            "    Prints this help.",
        ]
    value = state.keyspace.get(argv[2])
    if value is None:
        return None
    if sub == "encoding":
        if isinstance(value, bytes):
            return _string_encoding(value)
        return "macronode" if isinstance(value, Stream) else "ranges"
    if sub == "refcount":
        return 1
    if sub == "idletime":
        return 0
    raise CommandError(errors.NO_LFU)


# ---- CONFIG


def _redact_config_secrets(argv: list[bytes]) -> list[bytes]:
    """CONFIG SET as the slow log shows it: the value given to a password
    directive hidden (also Redis's masterauth and tls-client-key-file-pass,
    which rcp11 refuses, since the refused call is logged too)."""
    from rcp11.config import SENSITIVE

    if len(argv) < 4 or argv[1].lower() != b"set":
        return argv
    shown = list(argv)
    for i in range(2, len(shown) - 1, 2):
        if text(shown[i]).lower() in SENSITIVE:
            shown[i + 1] = REDACTED
    return shown


@command(
    "config",
    -2,
    "admin loading stale",
    summary="Read and change the configuration",
    group="server",
    redact=_redact_config_secrets,
)
def config_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    from rcp11.config import ConfigError

    sub = check_subcommand(
        "config", {"get": -3, "set": -4, "rewrite": 2, "resetstat": 2, "help": 2}, argv
    )
    config = state.config
    try:
        if sub == "get":
            found = config.config_get(*(text(pattern) for pattern in argv[2:]))
            return {name: _config_text(value) for name, value in found.items()}
        if sub == "set":
            if len(argv) % 2:
                raise CommandError(errors.config_set_unknown(text(argv[-1])))
            config.set_many(
                [(text(argv[i]), text(argv[i + 1])) for i in range(2, len(argv), 2)],
                protected_ok=config.protected_allowed(client.local),
            )
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
        "    Prints this help.",
    ]


def _config_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return " ".join(_config_text(v) for v in value)
    if isinstance(value, bytes):
        return text(value)
    return str(value)


def _reset_stats(state: ServerState) -> None:
    state.stats = type(state.stats)()
