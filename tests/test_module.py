"""The rcp11 Redis module inside redis-server: what only the module does.

The stream commands' semantics are tested against both servers in
test_streams.py and test_acceptance.py; this file covers loading, memory
accounting through Redis's allocator, maxmemory, INFO, module configs, key
specs and keyspace details. Persistence, replication and Cluster have their
own test_module_*.py files.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import (
    RedisModuleServer,
    free_port,
    in_thread,
    module_path,
    module_server_program,
    stream_info,
    tr,
    tw,
    wait_blocked,
    wait_for,
)


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


# ---------------------------------------------------------------- loading


def test_module_path_prints_the_built_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rcp11", "module-path"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.is_file() and path.suffix == ".so"
    helped = subprocess.run(
        [sys.executable, "-m", "rcp11", "module-path", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert helped.returncode == 0 and "--loadmodule" in helped.stdout


def test_redis_lists_the_module_and_its_type(msrv_client: redis.Redis) -> None:
    names = [m.get(b"name", m.get("name")) for m in msrv_client.module_list()]
    assert names in ([b"rcp11"], ["rcp11"])
    tw(msrv_client, "s", "x")
    assert msrv_client.type("s") == b"rcp11-log"


@pytest.mark.module
def test_module_refuses_arguments(tmp_path: Path) -> None:
    host = module_server_program()
    done = subprocess.run(
        [host, "--port", str(free_port()), "--loadmodule", module_path(), "surprise"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "rcp11 takes no module arguments" in done.stdout


# ---------------------------------------------------------------- memory


def test_used_memory_and_memory_usage_see_the_streams(msrv_client: redis.Redis) -> None:
    before = used_memory(msrv_client)
    payload = b"x" * 1000
    for n in range(20):
        tw(msrv_client, f"s{n}", *[payload] * 1000)  # 20 MB of payload
    grown = used_memory(msrv_client) - before
    assert grown > 20_000_000
    usage = msrv_client.memory_usage("s0")
    assert 1_000_000 < usage < 1_200_000
    msrv_client.execute_command("FLUSHALL", "SYNC")  # valkey's FLUSHALL is ASYNC by default
    assert used_memory(msrv_client) - before < 2_000_000


def test_nodes_end_where_their_blob_fills_an_allocator_size_class(msrv_client: redis.Redis) -> None:
    # 1000 messages of 100 bytes would ask jemalloc for 100,000 bytes and get
    # its next class, 114,688. The module caps a node at the class below,
    # 98,304 bytes: 983 such messages, and the blob wastes nothing.
    for _ in range(100):
        tw(msrv_client, "s", *[b"m" * 100] * 100)
    info = stream_info(msrv_client)
    assert info["stream_nodes"] == 11  # 10 x 983 messages, and 170 in the active node
    assert tr(msrv_client, "s", 9829, 2) == [b"m" * 100] * 2
    # Small messages: 1000 of them take far less than a class step's
    # rounding would matter for; nodes end at stream-node-max-entries.
    tw(msrv_client, "small", *[b"x"] * 3000)
    assert stream_info(msrv_client)["stream_nodes"] == 11 + 3


def test_maxmemory_refuses_writes_with_oom_and_still_reads(msrv_client: redis.Redis) -> None:
    tw(msrv_client, "s", "kept")
    msrv_client.config_set("maxmemory", used_memory(msrv_client) + 1_000_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for _ in range(100):
            tw(msrv_client, "s", *[b"y" * 10_000] * 10)
    assert tr(msrv_client, "s", 0, 1) == [b"kept"]
    assert msrv_client.execute_command("TEVICT", "s", 0) == 1  # eviction frees, so it is allowed
    msrv_client.config_set("maxmemory", 0)
    assert tw(msrv_client, "s", "again") > 0


# ---------------------------------------------------------------- INFO and configs


def test_info_section_totals_follow_every_change(msrv_client: redis.Redis) -> None:
    tw(msrv_client, "a", "x", "yy")
    tw(msrv_client, "b", "zzz")
    info = stream_info(msrv_client)
    assert (info["streams"], info["stream_messages"], info["stream_payload_bytes"]) == (2, 3, 6)
    msrv_client.execute_command("TEVICT", "a", 0)
    assert stream_info(msrv_client)["stream_messages"] == 2
    msrv_client.delete("b")
    info = stream_info(msrv_client)
    assert (info["streams"], info["stream_messages"], info["stream_payload_bytes"]) == (1, 1, 2)
    # A big stream freed on Redis's lazy-free thread is subtracted too.
    tw(msrv_client, "big", *[b"z" * 100] * 100_000)
    msrv_client.execute_command("CONFIG", "SET", "rcp11.stream-node-max-entries", 100)
    tw(msrv_client, "many-nodes", *[b"q"] * 10_000)
    msrv_client.unlink("big", "many-nodes")
    msrv_client.flushall("ASYNC")
    wait_for(lambda: stream_info(msrv_client)["streams"] == 0)
    info = stream_info(msrv_client)
    assert (info["streams"], info["stream_messages"], info["stream_nodes"]) == (0, 0, 0)
    assert info["stream_memory_bytes"] == 0
    msrv_client.execute_command("CONFIG", "SET", "rcp11.stream-node-max-entries", 1000)


def test_configs_reach_new_and_existing_streams(msrv_client: redis.Redis) -> None:
    assert msrv_client.config_get("rcp11.*") == {
        "rcp11.stream-node-max-entries": "1000",
        "rcp11.stream-compression": "no",
        "rcp11.stream-compression-level": "6",
        "rcp11.stream-compression-depth": "0",
        "rcp11.stream-retention-ms": "0",
        "rcp11.stream-retention-bytes": "0",
        "rcp11.reservation-timeout-ms": "1000",
        "rcp11.reservation-min-replicas": "0",
        "rcp11.reservation-on-timeout": "refuse",
        "rcp11.reservation-in-multi": "write",
        "rcp11.read-committed": "no",
        "rcp11.offsets-file": "rcp11-offsets.dat",
    }
    tw(msrv_client, "old", *[b"line %d of a log that compresses" % n for n in range(3000)])
    assert stream_info(msrv_client)["stream_compressed_nodes"] == 0
    msrv_client.config_set("rcp11.stream-node-max-entries", 100)
    msrv_client.config_set("rcp11.stream-compression", "zlib")
    tw(msrv_client, "old", *[b"line %d of a log that compresses" % n for n in range(1000)])
    info = stream_info(msrv_client)
    assert info["stream_compressed_nodes"] >= 9
    assert info["stream_node_max_entries"] == 100 and info["stream_compression"] == "zlib"
    assert tr(msrv_client, "old", 3500, 2) == [b"line 500 of a log that compresses"] * 1 + [
        b"line 501 of a log that compresses"
    ]
    with pytest.raises(redis.ResponseError, match="between 1 and 1000000"):
        msrv_client.config_set("rcp11.stream-node-max-entries", 0)
    with pytest.raises(redis.ResponseError):
        msrv_client.config_set("rcp11.stream-compression", "lz4")
    msrv_client.config_set("rcp11.stream-node-max-entries", 1000)
    msrv_client.config_set("rcp11.stream-compression", "no")


def test_configs_from_the_command_line(module_factory: Any) -> None:
    srv = module_factory(
        **{"rcp11.stream-compression": "zlib", "rcp11.stream-node-max-entries": "10"}
    )
    client = srv.client()
    tw(client, "s", *[b"repetitive repetitive repetitive %d" % n for n in range(100)])
    info = stream_info(client)
    assert info["stream_nodes"] == 10 and info["stream_compressed_nodes"] > 0
    client.close()


# ---------------------------------------------------------------- keys and commands


def test_command_getkeys_names_the_group_key(msrv_client: redis.Redis) -> None:
    def keys(*argv: Any) -> list[str]:
        return [
            k.decode() if isinstance(k, bytes) else k for k in msrv_client.command_getkeys(*argv)
        ]

    assert keys("TWRITE", "s", "x") == ["s"]
    assert keys("TREAD", "s", 0, 1) == ["s"]
    assert keys("TREAD", "s", 0, 1, "BLOCK", 0, "GROUP", "g") == ["s", "g"]
    assert keys("TREAD", "s", 0, 1, "GROUPNEW", "g", "WITHINFO") == ["s", "g"]
    assert keys("TEVICT", "s", 5) == ["s"]
    assert keys("TCONCAT", "d", "a", "b") == ["d", "a", "b"]
    flags = msrv_client.command()["tread"]["flags"]
    assert {"movablekeys", "blocking", "readonly"} <= {str(f) for f in flags}


def test_every_module_command_documents_its_arguments(msrv: RedisModuleServer) -> None:
    # COMMAND DOCS is where redis-cli and valkey-cli take their hints from:
    # the internal commands too, which operators meet in MONITOR and AOFs.
    names = msrv.command("COMMAND", "LIST", "FILTERBY", "MODULE", "rcp11")
    names = sorted(n.decode() for n in names)
    assert "rcp11.reserve" in names and "rcp11.groupmove" in names
    reply = msrv.command("COMMAND", "DOCS", *names)  # as the server sends it
    docs = dict(zip(reply[::2], reply[1::2], strict=True))
    for name in names:
        doc = dict(zip(docs[name.encode()][::2], docs[name.encode()][1::2], strict=True))
        assert doc[b"summary"] and doc[b"complexity"], name
        # A container (TGROUP) has subcommands instead, and TGROUP HELP
        # takes no argument, as Redis's own (XINFO, XINFO HELP).
        assert doc.get(b"arguments") or doc.get(b"subcommands") or name == "tgroup|help", name


def test_group_read_on_a_key_with_a_ttl_keeps_readers_going(msrv_client: redis.Redis) -> None:
    tw(msrv_client, "s", "a", "b")
    msrv_client.set("g", 1, px=60_000)
    assert tr(msrv_client, "s", 0, 5, "GROUP", "g") == [b"b"]
    assert msrv_client.get("g") == b"2" and msrv_client.ttl("g") == -1  # written as SET writes it


def test_rename_copy_and_object_of_a_stream(msrv_client: redis.Redis) -> None:
    tw(msrv_client, "s", "a", "b", "c")
    msrv_client.execute_command("TEVICT", "s", 0)
    assert msrv_client.copy("s", "t") is True
    assert msrv_client.rename("s", "u") is True
    for key in ("t", "u"):
        assert tr(msrv_client, key, 0, 5, "WITHINFO") == [[1, 2, 0, 3], None, b"b", b"c"]
    tw(msrv_client, "t", "d")
    assert tr(msrv_client, "u", 3, 5) == []  # a copy, not a shared value
    assert stream_info(msrv_client)["streams"] == 2


def test_blocked_reader_of_a_renamed_away_key_waits_for_the_new_one(
    msrv_client: redis.Redis,
) -> None:
    reader = msrv_client.connection_pool.connection_kwargs["port"]
    client = redis.Redis(port=reader)
    tw(msrv_client, "s", "a")
    try:
        thread, box = in_thread(lambda: tr(client, "s", 1, 5, "BLOCK", 5000))
        wait_blocked(msrv_client, 1)
        msrv_client.rename("s", "elsewhere")
        tw(msrv_client, "s", "x", "y")  # a new stream: offset 1 is "y"
        thread.join(10)
        assert box.get("reply") == [b"y"]
    finally:
        client.close()


def test_keyspace_notifications_for_module_commands(msrv_client: redis.Redis) -> None:
    msrv_client.config_set("notify-keyspace-events", "KEA")
    pubsub = msrv_client.pubsub()
    pubsub.psubscribe("__keyevent@0__:*")
    pubsub.get_message(timeout=5)
    tw(msrv_client, "s", "a", "b")
    msrv_client.execute_command("TEVICT", "s", 0)
    tr(msrv_client, "s", 0, 1, "GROUP", "g")
    events = []
    while len(events) < 3:
        message = pubsub.get_message(timeout=5)
        assert message is not None, events
        if message["type"] == "pmessage":
            events.append((message["channel"].split(b":")[-1], message["data"]))
    assert events == [(b"twrite", b"s"), (b"tevict", b"s"), (b"set", b"g")]
    pubsub.close()
    msrv_client.config_set("notify-keyspace-events", "")


# ---------------------------------------------------------------- DEBUG DIGEST

GAP_END = 2**40  # RCP11.SKIPTO's next offset: a gap of about 10^12 nulls


def digests(client: redis.Redis, key: str) -> tuple[bytes, bytes]:
    return (
        client.execute_command("DEBUG", "DIGEST"),
        client.execute_command("DEBUG", "DIGEST-VALUE", key)[0],
    )


def write_with_gaps(client: redis.Redis, gap_end: int = GAP_END) -> None:
    """Messages, a gap, messages (a stream rebuilt by an AOF rewrite, or
    one whose tail was evicted), then a gap at the end."""
    tw(client, "s", *[b"m%d" % n for n in range(25)])
    client.execute_command("RCP11.SKIPTO", "s", 1000)
    tw(client, "s", *[b"n%d" % n for n in range(25)])
    client.execute_command("TEVICT", "s", 3)
    client.execute_command("RCP11.SKIPTO", "s", gap_end)


def test_debug_digest_counts_a_gap_instead_of_walking_it(module_factory: Any) -> None:
    srv = module_factory()
    client = srv.client(socket_timeout=20)  # walking 2^40 nulls took hours
    tw(client, "k", "a")
    client.execute_command("RCP11.SKIPTO", "k", GAP_END)
    whole, value = digests(client, "k")
    assert whole != b"0" * 40 and len(value) == 40
    assert client.ping()


def test_equal_streams_digest_equal_whatever_their_nodes(module_factory: Any) -> None:
    # The digest covers append times: the large-node server gets the
    # writes as a replica, at the primary's times, into its own nodes.
    small_srv = module_factory(repl_diskless_sync_delay=0, **{"rcp11.stream-node-max-entries": 4})
    small = small_srv.client(socket_timeout=20)
    large = module_factory(
        replicaof=f"127.0.0.1 {small_srv.port}", **{"rcp11.stream-node-max-entries": 1000}
    ).client(socket_timeout=20)
    wait_for(lambda: large.info("replication")["master_link_status"] == "up")
    write_with_gaps(small)
    assert small.execute_command("WAIT", 1, 10_000) == 1
    large.execute_command("REPLICAOF", "NO", "ONE")
    assert stream_info(small)["stream_nodes"] > stream_info(large)["stream_nodes"]
    assert digests(small, "s") == digests(large, "s")
    # One offset more in the gap, or a message where a null was, differs.
    small.execute_command("RCP11.SKIPTO", "s", GAP_END + 1)
    assert digests(small, "s") != digests(large, "s")
    large.execute_command("RCP11.SKIPTO", "s", GAP_END + 1)
    assert digests(small, "s") == digests(large, "s")
    # A null offset between two messages is not a message "-1" there.
    tw(small, "message", "x", "-1", "y")
    tw(small, "null", "x")
    small.execute_command("RCP11.SKIPTO", "null", 2)
    tw(small, "null", "y")
    assert digests(small, "message")[1] != digests(small, "null")[1]


def test_a_replica_digests_as_its_primary_with_gaps(module_factory: Any) -> None:
    primary_srv = module_factory(repl_diskless_sync_delay=0, **{"rcp11.stream-node-max-entries": 7})
    primary = primary_srv.client(socket_timeout=20)
    write_with_gaps(primary)
    replica = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}").client(socket_timeout=20)
    wait_for(lambda: replica.info("replication")["master_link_status"] == "up")
    tw(primary, "s", "after the gap")  # live commands after the full sync
    primary.execute_command("RCP11.SKIPTO", "live", GAP_END)
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    assert digests(replica, "s") == digests(primary, "s")
