"""Server commands: DBSIZE TIME FLUSH* SAVE ... SHUTDOWN MEMORY OBJECT CONFIG
COMMAND INFO."""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from rcp11 import __version__, errors
from rcp11.commands.core import (
    BLOCKED,
    COMMANDS,
    INTEGER_RE,
    REDIS_COMPAT_VERSION,
    Command,
    check_subcommand,
    command,
    config_value,
    parse_int,
    text,
)
from rcp11.errors import CommandError
from rcp11.limits import INT64_MAX, INT64_MIN
from rcp11.resp import OK, SimpleString, Verbatim
from rcp11.state import ClientState, ServerState
from rcp11.stringmatch import compile_glob


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
        flushall = getattr(state.persistence, "flushall", None)
        if flushall is not None:
            flushall()
    blocking = state.blocking
    if blocking is not None and blocking.active:
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
    result = _persistence_call(state, "bgsave", len(argv) == 2)
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
            raise CommandError("ERR No shutdown in progress.")
        else:
            raise CommandError(errors.SYNTAX)
    if state.request_shutdown(mode) is False:
        raise CommandError("ERR Errors trying to SHUTDOWN. Check logs.")
    # No reply: the connection closes as the server exits.
    return BLOCKED


@command("memory", -2, "readonly", summary="Memory introspection", group="server")
def memory_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    sub = check_subcommand(
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
                raise CommandError(
                    f"ERR Unknown option or number of arguments for CONFIG SET - '{text(argv[-1])}'"
                )
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
        "    Print this help.",
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
    sub = check_subcommand(
        "command",
        {"count": 2, "info": -2, "docs": -2, "list": -2, "getkeys": -4, "help": 2},
        argv,
    )
    names = [text(arg).lower() for arg in argv[2:]]
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
            match = compile_glob(argv[4], nocase=True).match
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
        "tls_port": state.config.get("tls-port") if state.config is not None else 0,
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
        "maxclients": config_value(state, "maxclients", 10000),
        "blocked_clients": state.stats.blocked_clients,
        "tracking_clients": 0,
        "clients_in_timeout_table": state.stats.blocked_clients,
    }


def _info_memory(state: ServerState) -> dict[str, Any]:
    used = state.used_memory()
    peak = state.used_memory_peak()
    rss = _rss_bytes()
    maxmemory = int(config_value(state, "maxmemory", 0))
    return {
        "used_memory": used,
        "used_memory_human": _human(used),
        "used_memory_rss": rss,
        "used_memory_rss_human": _human(rss),
        "used_memory_peak": peak,
        "used_memory_peak_human": _human(peak),
        "used_memory_peak_perc": f"{100 * used / peak:.2f}%" if peak else "100.00%",
        "used_memory_dataset": state.keyspace.used_bytes,
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
        "instantaneous_ops_per_sec": round(stats.rates.rate("ops")),
        "total_net_input_bytes": stats.total_net_input_bytes,
        "total_net_output_bytes": stats.total_net_output_bytes,
        "instantaneous_input_kbps": f"{stats.rates.rate('input') / 1024:.2f}",
        "instantaneous_output_kbps": f"{stats.rates.rate('output') / 1024:.2f}",
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
        "stream_node_max_entries": config_value(state, "stream-node-max-entries", 1000),
        "stream_compression": config_value(state, "stream-compression", "no"),
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
    report = info_text(state, [text(arg).lower() for arg in argv[1:]])
    return Verbatim("txt", report)
