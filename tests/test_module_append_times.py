"""Append times inside the module are the primary's everywhere
(docs/MODULE.md, "Time"): a replica, an AOF replay (the incremental file, a
rewrite without the RDB preamble, a kill -9 with appendfsync always) and a
promoted replica answer TSEEK and age messages exactly as the primary did.

The primary runs with its clock an hour behind (the module's test-only
debug-clock-offset-ms argument): a server that recorded its own time instead
of the primary's would answer every TSEEK below differently."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, module_path, tr, tw, wait_for
from core_recipes import unpack_blobs
from test_module_persistence import state_of, wait_rewrite_done

from rcp11.resp import encode_command
from rcp11.storage import Stream

DATA = Path(__file__).resolve().parent / "data"
HOUR_MS = 3_600_000
NODE = {"rcp11.stream-node-max-entries": 10}
INTERNAL = "is internal: only a primary's replication stream and the AOF may send it"


def start_with_module_args(srv: RedisModuleServer, *args: str) -> RedisModuleServer:
    """Start srv with the module loaded with arguments (a config file line:
    the command line cannot pass a directive several words)."""
    conf = srv.dir / "module.conf"
    conf.write_text(f"loadmodule {module_path()} {' '.join(args)}\n")
    del srv.directives["loadmodule"]
    srv.conf = conf
    return srv.start()


def redis_ms(client: redis.Redis) -> int:
    """Redis's clock (TIME) in ms; the primary's module clock is HOUR_MS behind."""
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def write_spread(client: redis.Redis, keys: list[str], batches: int = 12) -> None:
    """Batches of messages at distinct milliseconds, some filling whole
    nodes and some not, with a BACKLOG cut and a TEVICT among them."""
    for batch in range(batches):
        now = redis_ms(client)
        for n, key in enumerate(keys):
            size = 1 + (batch * 7 + n * 3) % 13
            tw(client, key, *[b"%s-%d-%d" % (key.encode(), batch, i) for i in range(size)])
        # Many single writes in one pipeline: most share a millisecond with
        # the write before them, the form the module replicates verbatim.
        with client.pipeline(transaction=False) as pipe:
            for i in range(30):
                pipe.execute_command("TWRITE", keys[1], b"quick-%d-%d" % (batch, i))
            pipe.execute()
        if batch == 5:
            client.execute_command("TWRITE", keys[0], "BACKLOG", 40, "ENTRIES", "cut")
        if batch == 8:
            client.execute_command("TEVICT", keys[-1], 3)
        assert wait_for(lambda now=now: redis_ms(client) > now)  # the next batch's ms


def answers(client: redis.Redis, keys: list[str], start_ms: int, end_ms: int) -> list[Any]:
    """TSEEK of every key at every millisecond of [start_ms, end_ms]."""
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            for ms in range(start_ms, end_ms + 1):
                pipe.execute_command("TSEEK", key, ms)
        return pipe.execute()


@pytest.fixture
def primary_srv(module_factory: Any) -> RedisModuleServer:
    srv = module_factory(start=False, repl_diskless_sync_delay=0, **NODE)
    start_with_module_args(srv, "debug-clock-offset-ms", str(-HOUR_MS))
    return srv


def spread_on(client: redis.Redis, keys: list[str]) -> tuple[int, int]:
    """Write the spread; returns the span of primary times to probe. The
    primary's module clock is an hour behind its TIME."""
    start = redis_ms(client) - HOUR_MS - 1
    write_spread(client, keys)
    return start, redis_ms(client) - HOUR_MS + 1


KEYS = ["a", "b", "{c}x"]


def with_replica(
    primary_srv: RedisModuleServer, module_factory: Any
) -> tuple[redis.Redis, redis.Redis]:
    """Clients of the primary and of a new replica of it (on the live link)."""
    replica_srv = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}", **NODE)
    primary, replica = primary_srv.client(), replica_srv.client()
    assert wait_for(lambda: replica.info("replication")["master_link_status"] == "up")
    return primary, replica


def test_replica_answers_tseek_as_the_primary(
    primary_srv: RedisModuleServer, module_factory: Any
) -> None:
    primary, replica = with_replica(primary_srv, module_factory)
    start, end = spread_on(primary, KEYS)  # live: the replica runs every write
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    expected = answers(primary, KEYS, start, end)
    assert len(set(expected)) > 10  # the times are spread over the streams
    assert answers(replica, KEYS, start, end) == expected
    assert state_of(replica) == state_of(primary)
    primary.close()
    replica.close()


def test_aof_replay_answers_tseek_as_before(primary_srv: RedisModuleServer) -> None:
    primary_srv.restart(appendonly="yes", aof_use_rdb_preamble="no")
    client = primary_srv.client()
    start, end = spread_on(client, KEYS)
    expected, state = answers(client, KEYS, start, end), state_of(client)
    assert client.execute_command("DEBUG", "LOADAOF") == b"OK"  # the incremental file
    assert answers(client, KEYS, start, end) == expected
    client.bgrewriteaof()  # a base file of commands, without the RDB preamble
    wait_rewrite_done(client)
    base = next((primary_srv.dir / "appendonlydir").glob("*.base.aof")).read_bytes()
    assert b"RCP11.NODE" in base and base.startswith(b"*")
    assert client.execute_command("DEBUG", "LOADAOF") == b"OK"
    assert answers(client, KEYS, start, end) == expected
    assert state_of(client) == state
    more_start = redis_ms(client) - HOUR_MS - 1
    write_spread(client, KEYS, batches=4)  # into the incremental file after the base
    end = redis_ms(client) - HOUR_MS + 1
    expected, state = answers(client, KEYS, start, end), state_of(client)
    assert more_start > start
    client.close()
    primary_srv.restart()
    client = primary_srv.client()
    assert answers(client, KEYS, start, end) == expected
    assert state_of(client) == state
    client.close()


def test_kill9_with_appendfsync_always_keeps_append_times(
    primary_srv: RedisModuleServer,
) -> None:
    primary_srv.restart(appendonly="yes", appendfsync="always", aof_use_rdb_preamble="no")
    client = primary_srv.client()
    start, end = spread_on(client, KEYS)
    expected = answers(client, KEYS, start, end)
    client.close()
    primary_srv.kill9()
    primary_srv.start()
    client = primary_srv.client()
    assert answers(client, KEYS, start, end) == expected
    client.close()


def test_promoted_replica_ages_messages_by_the_primarys_times(
    primary_srv: RedisModuleServer, module_factory: Any
) -> None:
    primary, replica = with_replica(primary_srv, module_factory)
    # Two full nodes written on the primary, an hour ago by its clock.
    tw(primary, "s", *[b"old %d" % n for n in range(20)])
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    primary.close()
    primary_srv.kill9()
    replica.replicaof("NO", "ONE")  # the failover
    # The promoted replica continues at the stream's reservation mark.
    start = tw(replica, "s", *[b"new %d" % n for n in range(5)])
    assert start >= 20
    # Half an hour of retention: the primary's messages are past it, the
    # ones written since the promotion are not.
    replica.config_set("rcp11.stream-retention-ms", HOUR_MS // 2)
    assert wait_for(lambda: replica.execute_command("TREAD", "s", 0, 0, "WITHINFO")[0][0] == start)
    assert tr(replica, "s", start - 1, 6) == [None] + [b"new %d" % n for n in range(5)]
    replica.close()


def test_clients_cannot_set_append_times(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory()
    client = srv.client()
    for command in (
        ("RCP11.TWRITEAT", "s", 0, "m"),
        ("RCP11.NODE", "s", b"MNND not a node"),
    ):
        with pytest.raises(redis.ResponseError, match=f"{command[0]} {INTERNAL}"):
            client.execute_command(*command)
        with client.pipeline(transaction=True) as pipe:  # nor inside MULTI
            pipe.execute_command(*command)
            with pytest.raises(redis.ResponseError, match=INTERNAL):
                pipe.execute()
        with pytest.raises(redis.ResponseError, match=INTERNAL):  # nor from a script
            client.eval("return redis.call(unpack(ARGV))", 0, *[str(arg) for arg in command])
    assert client.exists("s") == 0  # nothing written
    client.close()


def test_a_plain_twrite_in_an_old_aof_still_loads(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes", aof_use_rdb_preamble="no")
    client = srv.client()
    tw(client, "s", "first")
    client.close()
    srv.kill9()
    incr = next((srv.dir / "appendonlydir").glob("*.incr.aof"))
    with incr.open("ab") as out:  # what a server before RCP11.TWRITEAT logged
        out.write(b"*5\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$7\r\nENTRIES\r\n$1\r\nx\r\n$1\r\ny\r\n")
    srv.start()
    client = srv.client()
    assert tr(client, "s", 0, 4) == [b"first", b"x", b"y"]
    assert client.execute_command("TSEEK", "s", 0) == 0
    client.close()


def test_module_arguments_other_than_the_test_clock_are_refused(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(start=False)
    with pytest.raises(RuntimeError, match="exited"):
        start_with_module_args(srv, "unknown", "1")
    assert "takes no module arguments" in (srv.dir / "server.log").read_text()


def test_rewritten_aof_keeps_the_clock_of_an_emptied_stream(
    primary_srv: RedisModuleServer,
) -> None:
    primary_srv.restart(appendonly="yes", aof_use_rdb_preamble="no")
    client = primary_srv.client()
    before = redis_ms(client) - HOUR_MS - 1
    tw(client, "e", "a", "b", "c")
    client.execute_command("TEVICT", "e", 2)  # every message gone: only the clock is left
    client.bgrewriteaof()
    wait_rewrite_done(client)
    client.close()
    # Restarted with the module's clock another hour back: a stream's times
    # never go back, so a new message is appended at the stream's clock,
    # which the rewritten AOF must have kept though no message holds it.
    assert primary_srv.conf is not None
    primary_srv.conf.write_text(
        f"loadmodule {module_path()} debug-clock-offset-ms {-2 * HOUR_MS}\n"
    )
    primary_srv.restart()
    client = primary_srv.client()
    assert tw(client, "e", "new") == 3
    assert client.execute_command("TSEEK", "e", before) == 3
    client.close()


# -- files of the format before per-message times ---------------------------

# tests/data/module-v3/dump.rdb: written by the module of format 3 (every
# 64th time of a node kept) holding the core recipes "timed" (first 30
# offsets evicted) and "zlib_nodes" (first 20), of tests/data/macronode-v3.
V3_STREAMS = {b"timed": 29, b"zlib_nodes": 19}


def expected_v3(name: bytes) -> Stream:
    """What the core loads of the recipe's format-3 dump (its reading of
    those times is tests/test_core_time.py's)."""
    return Stream.load(unpack_blobs((DATA / "macronode-v3" / f"{name.decode()}.bin").read_bytes()))


def assert_v3_streams(client: redis.Redis) -> None:
    for key in V3_STREAMS:
        expected = expected_v3(key)
        start, n = expected.first_offset, expected.next_offset - expected.first_offset
        reply = tr(client, key, start, n, "WITHTIMES")
        assert reply[0::2] == expected.read(start, n)
        assert reply[1::2] == expected.read_times(start, n)
        times = expected.read_times(start, n)
        assert client.execute_command("TSEEK", key, times[-1]) <= start + n - 1


def test_an_rdb_from_before_per_message_times_loads(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(start=False)
    shutil.copy(DATA / "module-v3" / "dump.rdb", srv.dir / "dump.rdb")
    srv.start()
    client = srv.client()
    assert_v3_streams(client)
    # Saved again (format 4) and loaded: the same times.
    client.save()
    client.execute_command("DEBUG", "RELOAD")
    assert_v3_streams(client)
    # New messages get their own time, exact.
    before = redis_ms(client)
    tw(client, "timed", "new")
    assert before <= tr(client, "timed", 450, 1, "WITHTIMES")[1] <= redis_ms(client)
    client.close()


def test_an_aof_rewritten_before_per_message_times_loads(module_factory: Any) -> None:
    """A rewritten AOF of format 3 holds RCP11.NODE commands with format-3
    node blobs (docs/MODULE.md): they load as an RDB would."""
    srv: RedisModuleServer = module_factory(appendonly="yes", aof_use_rdb_preamble="no")
    srv.kill9()
    incr = next((srv.dir / "appendonlydir").glob("*.incr.aof"))
    with incr.open("ab") as out:
        for key, evict in V3_STREAMS.items():
            _, *nodes = unpack_blobs((DATA / "macronode-v3" / f"{key.decode()}.bin").read_bytes())
            for blob in nodes:
                out.write(encode_command([b"RCP11.NODE", key, blob]))
            out.write(encode_command([b"TEVICT", key, b"%d" % evict]))
    srv.start()
    client = srv.client()
    assert_v3_streams(client)
    client.close()
