"""What the server says about itself (docs/PROTOCOL.md section 7, "INFO"
and "Commands"): INFO and its sections as Redis names them, COMMAND
(COUNT, LIST, INFO, DOCS, GETKEYS), CLIENT LIST/INFO/ID/KILL/SETINFO,
MEMORY USAGE, OBJECT ENCODING, TYPE, TIME and LASTSAVE."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from conftest import (
    RawClient,
    ServerProcess,
    as_str,
    exchange,
    mbulk,
    parse_map,
    parse_reply,
    stream_info,
    tw,
    wait_for,
)
from helpers_dispatch import Client, recording_state, run

from rcp11.resp import OK, Error

# ---------------------------------------------------------------------- INFO


def test_info_sections(
    shared_server: ServerProcess, shared_client: redis.Redis, shared_client3: redis.Redis
) -> None:
    shared_client.execute_command("TWRITE", "s", "ENTRIES", "abc", "de")
    shared_client.set("k", "v", ex=100)
    info = shared_client.info()
    for field in (
        "redis_version",
        "tcp_port",
        "uptime_in_seconds",
        "connected_clients",
        "blocked_clients",
        "used_memory",
        "maxmemory",
        "loading",
        "total_commands_processed",
        "role",
        "connected_slaves",
        "used_cpu_sys",
    ):
        assert field in info, field
    assert info["role"] == "master" and info["connected_slaves"] == 0
    assert info["db0"] == {"keys": 2, "expires": 1, "avg_ttl": 0}
    streams = shared_client.info("streams")
    assert streams["streams"] == 1 and streams["stream_messages"] == 2
    assert streams["stream_payload_bytes"] == 5 and streams["stream_nodes"] == 1
    assert "stream_compressed_nodes" in streams
    assert shared_server.command("INFO", "nosuchsection") == b""
    everything = shared_client.info("everything")
    assert "cmdstat_twrite" in everything and "streams" in everything
    assert shared_client3.info("server")["redis_mode"] == "standalone"


def test_info_resp3_is_a_verbatim_string(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    try:
        conn.call("HELLO", "3")
        assert conn.call("INFO", "keyspace").startswith(b"=")
    finally:
        conn.close()


@pytest.mark.slow
def test_info_memory_peak_survives_a_delete_until_resetstat(server_factory: Any) -> None:
    srv = server_factory()
    client = srv.client()
    try:
        client.execute_command("TWRITE", "big", "ENTRIES", *["x" * 1000] * 1000)
        full = client.info("memory")
        assert full["used_memory_peak"] >= full["used_memory"] > 1_000_000
        client.delete("big")
        emptied = client.info("memory")
        # The stream's megabyte is freed (the interpreter's memory stays).
        assert emptied["used_memory"] < full["used_memory"] - 800_000
        assert emptied["used_memory_dataset"] == 0
        assert emptied["used_memory_peak"] >= full["used_memory"]
        client.config_resetstat()
        reset = client.info("memory")
        assert reset["used_memory_peak"] == reset["used_memory"]
    finally:
        client.close()


@pytest.mark.slow
def test_info_instantaneous_ops_per_sec_follows_the_load(server_factory: Any) -> None:
    srv = server_factory()
    client = srv.client()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            pipe = client.pipeline(transaction=False)
            for _ in range(200):
                pipe.ping()
            pipe.execute()
        stats = client.info("stats")
        assert stats["instantaneous_ops_per_sec"] > 500
        assert float(stats["instantaneous_input_kbps"]) > 0
        assert float(stats["instantaneous_output_kbps"]) > 0
        # Idle now: the rate falls as the samples of the load age out.
        wait_for(lambda: client.info("stats")["instantaneous_ops_per_sec"] < 100, timeout=10)

    finally:
        client.close()


def test_info_streams_section(stream_client: redis.Redis) -> None:
    tw(stream_client, "a", "x", "yy")
    tw(stream_client, "b", "zzz")
    info = stream_info(stream_client)
    assert info["streams"] == 2
    assert info["stream_messages"] == 3
    assert info["stream_payload_bytes"] == 6
    port = stream_client.connection_pool.connection_kwargs["port"]
    text = exchange(port, b"INFO\r\n", until=b"\r\n\r\n")
    for name in (
        b"# Server",
        b"# Clients",
        b"# Memory",
        b"# Persistence",
        b"# Stats",
        b"# Keyspace",
    ):
        assert name in text


def test_info_streams_follows_del_set_and_evictions(shared_client: redis.Redis) -> None:
    shared_client.config_set("stream-node-max-entries", 1000)
    tw(shared_client, "a", "x", "yy")
    tw(shared_client, "b", "zzz")
    shared_client.delete("b")
    info = shared_client.info("streams")
    assert (info["streams"], info["stream_messages"], info["stream_payload_bytes"]) == (1, 2, 3)
    shared_client.set("a", "now a string")
    info = shared_client.info("streams")
    assert (info["streams"], info["stream_messages"], info["stream_nodes"]) == (0, 0, 0)
    tw(shared_client, "u", *[b"0123456789"] * 2500)
    assert shared_client.info("streams")["stream_nodes"] == 3
    shared_client.execute_command("TEVICT", "u", 999)
    info = shared_client.info("streams")
    assert (info["stream_nodes"], info["stream_messages"]) == (2, 1500)
    assert info["stream_payload_bytes"] == 15000


REDIS_INFO_FIELDS = {
    "server": ["redis_version", "redis_mode", "process_id", "run_id", "tcp_port"]
    + ["uptime_in_seconds", "uptime_in_days", "executable", "config_file"],
    "clients": ["connected_clients", "blocked_clients", "maxclients"],
    "memory": ["used_memory", "used_memory_human", "used_memory_rss", "maxmemory"]
    + ["maxmemory_human", "maxmemory_policy"],
    "persistence": ["loading", "rdb_changes_since_last_save", "rdb_bgsave_in_progress"]
    + ["rdb_last_save_time", "rdb_last_bgsave_status", "aof_enabled", "aof_rewrite_in_progress"]
    + ["aof_last_bgrewrite_status", "aof_last_write_status"],
    "stats": ["total_connections_received", "total_commands_processed"]
    + ["instantaneous_ops_per_sec", "total_net_input_bytes", "total_net_output_bytes"]
    + ["rejected_connections", "expired_keys", "keyspace_hits", "keyspace_misses"],
}


@pytest.mark.parametrize("section", sorted(REDIS_INFO_FIELDS))
def test_info_has_redis_field_names(shared_client: redis.Redis, section: str) -> None:
    info = shared_client.info(section)
    missing = [name for name in REDIS_INFO_FIELDS[section] if name not in info]
    assert not missing


def test_info_memory_peak_fields(shared_client: redis.Redis) -> None:
    info = shared_client.info("memory")
    assert info["used_memory_peak"] >= info["used_memory"] > 0
    assert "used_memory_peak_human" in info


def test_info_keyspace_stats_and_resetstat(shared_client: redis.Redis) -> None:
    tw(shared_client, "s", "a")
    shared_client.set("k", "v", ex=100)
    shared_client.set("g", 0)
    assert shared_client.info("keyspace")["db0"]["keys"] == 3
    assert shared_client.info("keyspace")["db0"]["expires"] == 1
    shared_client.config_resetstat()
    shared_client.get("k")
    shared_client.get("nokey")
    stats = shared_client.info("stats")
    assert stats["keyspace_hits"] == 1 and stats["keyspace_misses"] == 1
    assert 3 <= stats["total_commands_processed"] <= 5
    port = shared_client.connection_pool.connection_kwargs["port"]
    text = exchange(port, b"INFO everything\r\n", until=b"\r\n\r\n")
    assert b"# Streams" in text and b"# Keyspace" in text
    assert "stream_messages" in shared_client.info()  # plain INFO shows the streams section too
    tw(shared_client, "s", "b")
    assert (
        shared_client.info("commandstats")["cmdstat_twrite"]["calls"] == 1
    )  # counted since RESETSTAT
    text = exchange(port, b"INFO STREAMS\r\n", until=b"\r\n\r\n")
    assert b"# Streams" in text and b"# Server" not in text


# ------------------------------------------------------------------- COMMAND


def test_command_introspection(shared_server: ServerProcess) -> None:
    count = shared_server.command("COMMAND", "COUNT")
    assert count == len(shared_server.command("COMMAND", "LIST")) > 40
    info = shared_server.command("COMMAND", "INFO", "tread", "get", "nosuch")
    # Not readonly: TREAD ... GROUP writes its group key (its key specs say so).
    assert info[0][:6] == [b"tread", -4, [b"blocking", b"movablekeys"], 1, 1, 1]
    assert info[1][:2] == [b"get", 2] and info[2] is None
    docs = parse_map(shared_server.command_bytes("COMMAND", "DOCS", "twrite"))
    twrite_docs = dict(zip(docs[b"twrite"][::2], docs[b"twrite"][1::2], strict=True))
    assert twrite_docs[b"group"] == b"stream" and b"arguments" in twrite_docs
    assert shared_server.command("COMMAND", "GETKEYS", "TREAD", "s", "0", "1", "GROUP", "g") == [
        b"s",
        b"g",
    ]
    assert len(shared_server.command("COMMAND")) == count


# The usage each server's COMMAND DOCS describes: what redis-cli (7.2+) and
# valkey-cli show as hints while a command is typed.
STREAM_USAGES = {
    "twrite": "key <entry | [BACKLOG backlog] ENTRIES entry [entry ...]>",
    "tread": "key offset count [BLOCK milliseconds] [GROUP groupkey | GROUPNEW newgroupkey]"
    " [WITHINFO] [NONULLS] [WITHTIMES] [PACKED] [LEASE lease] [CONSUMER consumer] [ACK start count]",
    "tack": "groupkey start count [start count ...]",
    "tevict": "key offset",
    "tconcat": "destination source [source ...]",
    "tseek": "key unix-time-ms",
}


def flat_map(flat: list[Any]) -> dict[str, Any]:
    """A RESP2 flat key/value array (COMMAND DOCS maps) as a dict."""
    return {as_str(k): v for k, v in zip(flat[::2], flat[1::2], strict=True)}


def docs_usage(arguments: list[Any]) -> str:
    """COMMAND DOCS arguments (RESP2 flat maps) as a usage line."""

    def one(flat: list[Any]) -> str:
        arg = flat_map(flat)
        kind, flags = as_str(arg["type"]), {as_str(f) for f in arg.get("flags", [])}
        if kind in ("oneof", "block"):
            parts = [one(sub) for sub in arg["arguments"]]
            text = " | ".join(parts) if kind == "oneof" else " ".join(parts)
            if kind == "oneof" and "optional" not in flags:
                return f"<{text}>"
            if "multiple" in flags:
                text = f"{text} [{text} ...]"
            if "token" in arg:
                text = f"{as_str(arg['token'])} {text}"
        elif kind == "pure-token":
            text = as_str(arg["token"])
        else:
            text = as_str(arg["name"])
            if "multiple" in flags:
                text = f"{text} [{text} ...]"
            if "token" in arg:
                text = f"{as_str(arg['token'])} {text}"
        return f"[{text}]" if "optional" in flags else text

    return " ".join(one(arg) for arg in arguments)


def test_command_docs_give_the_stream_commands_arguments(stream_server: ServerProcess) -> None:
    for name, usage in STREAM_USAGES.items():
        reply = stream_server.command("COMMAND", "DOCS", name)
        assert as_str(reply[0]) == name
        docs = flat_map(reply[1])
        assert docs_usage(docs["arguments"]) == usage, name
        assert docs["summary"], name
    # Key arguments point at their key specs (COMMAND INFO), as Redis's do.
    tread = flat_map(stream_server.command("COMMAND", "DOCS", "tread")[1])
    group = flat_map(tread["arguments"][4])
    keys = [flat_map(arg) for arg in group["arguments"]]
    assert [(k["token"], k["key_spec_index"]) for k in keys] == [(b"GROUP", 1), (b"GROUPNEW", 2)]


def test_command_introspection_knows_the_stream_commands(shared_client: redis.Redis) -> None:
    names = {as_str(n) for n in shared_client.command_list()}
    spec_names = (
        "twrite tread tevict ping echo quit reset hello auth select client command info config"
        " dbsize time flushdb flushall del unlink exists type keys scan rename get set incr incrby"
        " mget multi exec discard watch unwatch save bgsave lastsave bgrewriteaof shutdown memory"
        " object"
    ).split()
    assert set(spec_names) <= names
    assert shared_client.command_count() == len(names)
    info = shared_client.execute_command("COMMAND", "INFO", "twrite", "tread", "tevict")
    assert {name: entry["arity"] for name, entry in info.items()} == {
        "twrite": -3,
        "tread": -4,
        "tevict": 3,
    }
    for entry in info.values():
        assert (entry["first_key_pos"], entry["last_key_pos"], entry["step_count"]) == (1, 1, 1)
    assert "write" in info["twrite"]["flags"] and "write" in info["tevict"]["flags"]
    port = shared_client.connection_pool.connection_kwargs["port"]
    docs = exchange(
        port, mbulk("COMMAND", "DOCS", "tread") + mbulk("ECHO", "end"), until=b"end\r\n"
    )
    assert docs.startswith(b"*2\r\n$5\r\ntread\r\n") and b"summary" in docs


# -------------------------------------------------------------------- CLIENT


def test_client_list_info_id_kill(shared_server: ServerProcess, shared_client: redis.Redis) -> None:
    other = RawClient(shared_server.port)
    other.call("CLIENT", "SETNAME", "victim")
    victim_id = parse_reply(other.call("CLIENT", "ID"))
    line = shared_client.execute_command("CLIENT", "INFO").decode()
    for field in ("id=", "addr=", "laddr=", "fd=", "name=", "age=", "idle=", "flags=N"):
        assert field in line
    assert "cmd=client|info" in line and "resp=2" in line
    listing = shared_client.client_list()
    victim = next(c for c in listing if c["name"] == "victim")
    assert int(victim["id"]) == victim_id
    assert shared_client.client_kill_filter(_id=victim_id) == 1
    assert other.read_until_closed() == b""  # closed by the server
    other.close()
    assert all(c["name"] != "victim" for c in shared_client.client_list())
    assert shared_client.execute_command("CLIENT", "KILL", "ID", victim_id) == 0


def test_client_list_shows_the_last_command_whichever_path_ran_it(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    """CLIENT LIST's cmd= and qbuf= for a client whose TWRITEs and TREADs
    the C lane serves (its event loop keeps them in C), in the order the
    client sent its commands, whichever path ran each."""
    other = RawClient(shared_server.port)
    other.call("CLIENT", "SETNAME", "lister")

    def mine() -> dict[str, str]:
        return next(c for c in shared_client.client_list() if c["name"] == "lister")

    try:
        for command, shown in (
            (("TWRITE", "cl-last", "x"), "twrite"),
            (("GET", "nothing"), "get"),
            (("TREAD", "cl-last", "0", "1"), "tread"),
            (("PING",), "ping"),
            (("TWRITE", "cl-last", "y"), "twrite"),
        ):
            other.call(*command)
            assert mine()["cmd"] == shown, command
        other.send(b"*3\r\n$6\r\nTWRITE\r\n$7\r\ncl-last\r\n$100\r\nstart")
        wait_for(lambda: int(mine()["qbuf"]) > 0)
        assert int(mine()["idle"]) == 0
    finally:
        other.close()


def test_client_kill_by_address_old_form(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    other = RawClient(shared_server.port)
    other.call("CLIENT", "SETNAME", "old-form")
    addr = next(c["addr"] for c in shared_client.client_list() if c["name"] == "old-form")
    assert shared_client.execute_command("CLIENT", "KILL", addr) == b"OK"
    assert other.read_until_closed() == b""
    other.close()


def test_client_setinfo_as_redis_py_sends_it(shared_client: redis.Redis) -> None:
    # redis-py already sent CLIENT SETINFO on connect; the fields show up.
    me = shared_client.client_info()
    assert me["lib-name"] == "redis-py"
    assert shared_client.execute_command("CLIENT", "SETINFO", "LIB-VER", "9.9") == b"OK"
    assert shared_client.client_info()["lib-ver"] == "9.9"
    with pytest.raises(redis.ResponseError, match="Unrecognized option"):
        shared_client.execute_command("CLIENT", "SETINFO", "COLOR", "blue")


def test_client_list_info_and_kill_by_address(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    victim = shared_server.client()
    victim.client_setname("victim")
    me = as_str(shared_client.execute_command("CLIENT", "INFO"))
    assert f"id={shared_client.client_id()} " in me
    entry = next(cl for cl in shared_client.client_list() if cl["name"] == "victim")
    assert shared_client.execute_command("CLIENT", "KILL", entry["addr"]) in (b"OK", "OK", True)
    with pytest.raises(redis.ResponseError, match="No such client"):
        shared_client.execute_command("CLIENT", "KILL", entry["addr"])
    assert all(cl["name"] != "victim" for cl in shared_client.client_list())


# -------------------------------------------------------- keys and the clock


def test_type_memory_usage_object_encoding_of_a_stream(shared_client: redis.Redis) -> None:
    shared_client.execute_command("TWRITE", "s", "ENTRIES", *["x" * 1000] * 10)
    assert shared_client.type("s") == b"rcp11-log"
    assert shared_client.memory_usage("s") > 10_000
    assert shared_client.object("encoding", "s") == b"macronode"
    assert shared_client.dbsize() == 1


def test_time_and_lastsave(shared_client: redis.Redis) -> None:
    seconds, micros = shared_client.time()
    assert abs(seconds - time.time()) < 5 and 0 <= micros < 1_000_000
    assert abs(shared_client.lastsave().timestamp() - time.time()) < 24 * 3600


def test_memory_usage_grows_with_the_stream(shared_client: redis.Redis) -> None:
    tw(shared_client, "s", "a")
    small = shared_client.memory_usage("s")
    tw(shared_client, "s", *[b"y" * 100] * 200)
    assert shared_client.memory_usage("s") > small + 200 * 100 / 2
    assert shared_client.memory_usage("nokey") is None
    assert shared_client.object("encoding", "nokey") is None


# ------------------------------------------------ MEMORY MALLOC-STATS, PURGE


def _malloc_stats(text: str) -> dict[str, int]:
    """MEMORY MALLOC-STATS's name:value lines (the banner lines skipped)."""
    return {
        name: int(value)
        for name, _, value in (line.partition(":") for line in text.splitlines())
        if value.isdigit()
    }


def test_memory_malloc_stats_reports_the_allocator_and_the_core(
    shared_client: redis.Redis, shared_client3: redis.Redis
) -> None:
    tw(shared_client, "s", *[b"z" * 1000] * 2000)
    text = shared_client.execute_command("MEMORY", "MALLOC-STATS").decode()
    assert text.startswith("___ Begin glibc ") and text.endswith(
        "___ End glibc malloc statistics ___\n"
    )
    stats = _malloc_stats(text)
    assert set(stats) == {
        "arena_bytes",
        "in_use_bytes",
        "free_bytes",
        "releasable_bytes",
        "mmap_bytes",
        "mmap_chunks",
        "stream_memory_bytes",
    }
    # The core's accounting is INFO's, and holds the 2 MB just written.
    streams = shared_client.info("streams")["stream_memory_bytes"]
    assert stats["stream_memory_bytes"] == streams >= 2_000_000
    # glibc's own figures: what is in use holds the stream, the heap holds
    # what is in use and free.
    assert stats["in_use_bytes"] + stats["mmap_bytes"] >= 2_000_000
    assert stats["arena_bytes"] == stats["in_use_bytes"] + stats["free_bytes"]
    # RESP3: a verbatim string ("txt"), as redis-server answers it.
    reply = shared_client3.execute_command("MEMORY", "MALLOC-STATS")
    assert "stream_memory_bytes:" in (reply if isinstance(reply, str) else reply.decode())


def test_memory_malloc_stats_and_purge_answer_as_redis(
    shared_server: ServerProcess, redis_reference: ServerProcess
) -> None:
    for server in (shared_server, redis_reference):
        assert server.command_bytes("MEMORY", "MALLOC-STATS").startswith(b"$")
        assert server.command_bytes("MEMORY", "PURGE") == b"+OK\r\n"
        for sub in ("PURGE", "MALLOC-STATS"):
            assert server.command_bytes("MEMORY", sub, "x") == (
                f"-ERR wrong number of arguments for 'memory|{sub.lower()}' command\r\n".encode()
            )
    help_lines = shared_server.command("MEMORY", "HELP")
    assert b"MALLOC-STATS" in help_lines and b"PURGE" in help_lines


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_memory_purge_gives_freed_memory_back(server_factory: Any) -> None:
    # Less is freed than the cron's own trim waits for (TRIM_AFTER_FREED,
    # 16 MB), and glibc keeps up to 64 MB free before trimming by itself
    # (limits.MALLOC_TRIM_THRESHOLD): what is freed stays until PURGE. Where
    # it lies in the heap (at the top or between live chunks) depends on
    # the allocation order; malloc_trim(0) gives back both, so RSS is what
    # is asserted.
    server = server_factory()
    client = server.client()
    pid = server.proc.pid
    # Strings of 2000 bytes live on the heap (below glibc's mmap threshold).
    client.mset({f"k{i}": b"v" * 2000 for i in range(6000)})
    client.flushall()
    before = _rss_bytes(pid)
    stats = _malloc_stats(client.execute_command("MEMORY", "MALLOC-STATS").decode())
    assert stats["free_bytes"] > 8_000_000  # freed, still held by the process
    assert client.execute_command("MEMORY", "PURGE") == b"OK"
    assert _rss_bytes(pid) < before - 6_000_000


def test_a_killed_client_is_gone_at_once_though_its_connection_closes_later() -> None:
    """CLIENT KILL answers, lists and kills again as if the victim were
    freed at once (Redis frees it inside the command), even while its
    connection has not reported the close yet."""
    state = recording_state()
    me, victim = Client(), Client()
    victim.addr = "127.0.0.1:50001"
    victim.close = lambda: None  # type: ignore[method-assign]  # the close comes later
    for client in (me, victim):
        state.clients[client.id] = client
    assert run(state, me, "CLIENT", "KILL", victim.addr) == OK
    assert victim.id in state.clients  # its connection has not gone yet
    assert run(state, me, "CLIENT", "KILL", victim.addr) == Error("ERR No such client")
    assert run(state, me, "CLIENT", "KILL", "ADDR", victim.addr) == 0
    assert victim.addr not in str(run(state, me, "CLIENT", "LIST"))
