"""INFO: the server's state and statistics in Redis's sections and field
names (`# Server`, `used_memory:...`), plus rcp11's own `# Streams`.

INFO with no argument gives the default sections (errorstats among them,
as in redis-server 7); `all`/`everything` add commandstats.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from rcp11 import __version__
from rcp11.commands.args import REDIS_COMPAT_VERSION, config_value, text
from rcp11.commands.table import command
from rcp11.resp import Verbatim
from rcp11.state import ClientState, ServerState
from rcp11.storage import Stream


def rss_bytes() -> int:
    """The process's resident memory, as INFO's used_memory_rss."""
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


# The program that runs the server, absolute as redis-server shows it: taken
# when the server imports this, before it changes into `dir` (a path typed
# relative, `.venv/bin/rcp11-server`, would then name nothing).
EXECUTABLE = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else ""


def _info_server(state: ServerState) -> dict[str, Any]:
    now = time.time()
    uptime = int(now - state.start_time)
    hz = state.config.get("hz")
    return {
        "redis_version": REDIS_COMPAT_VERSION,
        "rcp11_version": __version__,
        "redis_mode": "standalone",
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "arch_bits": 64 if sys.maxsize > 2**32 else 32,
        # What runs the event loop (the server says: uvloop or asyncio).
        "multiplexing_api": state.multiplexing_api,
        "python_version": platform.python_version(),
        "process_id": os.getpid(),
        "run_id": state.run_id,
        "tcp_port": state.tcp_port,
        "tls_port": state.config.get("tls-port"),
        "server_time_usec": time.time_ns() // 1000,
        "uptime_in_seconds": uptime,
        "uptime_in_days": uptime // 86400,
        "hz": hz,
        "configured_hz": hz,
        "executable": EXECUTABLE,
        "config_file": state.config.path or "",
    }


def _info_clients(state: ServerState) -> dict[str, Any]:
    return {
        "connected_clients": len(state.clients),
        "cluster_connections": 0,
        "maxclients": config_value(state, "maxclients", 10000),
        # Clients CLIENT PAUSE holds count as blocked, as in redis-server 7.0
        # (not in the timeout table: they have no timeout of their own).
        "blocked_clients": state.blocking.blocked_clients + len(state.pause.held),
        "tracking_clients": 0,
        "clients_in_timeout_table": state.blocking.blocked_clients,
    }


def _info_memory(state: ServerState) -> dict[str, Any]:
    # used_memory: all the process allocated (Redis's meaning: its
    # allocator's total), the interpreter included, and what maxmemory is
    # held against (docs/PROTOCOL.md).
    used = state.allocated_memory()
    peak = state.used_memory_peak(used)
    rss = rss_bytes()
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
        "maxmemory_policy": config_value(state, "maxmemory-policy", "noeviction"),
        "mem_fragmentation_ratio": f"{rss / used:.2f}" if used else "0.00",
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
        "total_error_replies": stats.total_error_replies,
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
        if not isinstance(value, Stream):
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
        "retention_evicted_messages": state.stats.retention_evicted_messages,
        "retention_evicted_bytes": state.stats.retention_evicted_bytes,
        "retention_runs": state.stats.retention_runs,
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


def _info_errorstats(state: ServerState) -> dict[str, Any]:
    return {f"errorstat_{code}": f"count={count}" for code, count in state.stats.errors.items()}


_INFO_SECTIONS: dict[str, Callable[[ServerState], dict[str, Any]]] = {
    "server": _info_server,
    "clients": _info_clients,
    "memory": _info_memory,
    "persistence": _info_persistence,
    "stats": _info_stats,
    "replication": _info_replication,
    "cpu": _info_cpu,
    "commandstats": _info_commandstats,
    "errorstats": _info_errorstats,
    "keyspace": _info_keyspace,
    "streams": _info_streams,
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
