"""The module's streams through Redis's persistence: RDB snapshots, DEBUG
RELOAD, AOF replay and rewrite, DUMP/RESTORE/MIGRATE, corrupt input, and
kill -9 with the AOF on."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, stream_info, tr, tw, wait_for
from helpers_module import populate, state_of, wait_rewrite_done

# ---------------------------------------------------------------- helpers


_CRC64_TABLE: list[int] = []


def crc64(data: bytes) -> int:
    """Redis's CRC-64 (Jones polynomial, reflected), which closes a DUMP
    payload."""
    if not _CRC64_TABLE:
        for n in range(256):
            crc = n
            for _ in range(8):
                crc = (crc >> 1) ^ (0x95AC9329AC4BC9B5 if crc & 1 else 0)
            _CRC64_TABLE.append(crc)
    crc = 0
    for byte in data:
        crc = _CRC64_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


def reseal(payload: bytes) -> bytes:
    """A DUMP payload whose body was edited, with a valid checksum again:
    only the module's own validation can refuse it then."""
    return payload + struct.pack("<Q", crc64(payload))


# ---------------------------------------------------------------- RDB


def test_crc64_matches_redis() -> None:
    assert crc64(b"123456789") == 0xE9C6D914C4B8D9CA


def test_debug_reload_and_restart_keep_every_stream_exactly(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(
        **{"rcp11.stream-compression": "zlib", "rcp11.stream-node-max-entries": 100}
    )
    client = srv.client()
    populate(client)
    before = state_of(client)
    compressed = stream_info(client)["stream_compressed_nodes"]
    assert compressed > 10
    assert client.execute_command("DEBUG", "RELOAD") == b"OK"
    assert state_of(client) == before
    assert stream_info(client)["stream_compressed_nodes"] == compressed
    client.save()
    client.close()
    srv.restart()
    client = srv.client()
    assert state_of(client) == before
    info = stream_info(client)
    assert info["stream_compressed_nodes"] == compressed and info["streams"] == 6
    # Offsets continue where they were, and groups where they stopped.
    assert tw(client, "plain", "next") == 2500
    assert tr(client, "plain", 0, 2, "GROUP", "plain:g") == [b"message 1242", b"message 1243"]
    client.close()


@pytest.mark.slow
def test_corrupt_rdb_file_is_refused_by_name_without_a_crash(module_factory: Any) -> None:
    # Uncompressed, so that the test can find a message in the file.
    srv: RedisModuleServer = module_factory(rdbcompression="no")
    client = srv.client()
    tw(client, "s", *[b"precious-payload-%04d" % n for n in range(100)])
    client.save()
    client.close()
    srv.stop()
    rdb = srv.dir / "dump.rdb"
    data = bytearray(rdb.read_bytes())
    at = data.index(b"precious-payload-0042")
    data[at] ^= 0x01
    rdb.write_bytes(bytes(data))
    with pytest.raises(RuntimeError):
        srv.start(timeout=10)
    assert srv.proc is not None and srv.proc.wait(10) == 1  # an exit, not a signal
    assert "rcp11: corrupt stream node 1 of 1" in srv.output()


# ---------------------------------------------------------------- AOF


def test_aof_rewrite_without_rdb_preamble_rebuilds_streams(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(
        appendonly="yes",
        aof_use_rdb_preamble="no",
        **{"rcp11.stream-node-max-entries": 300},
    )
    client = srv.client()
    populate(client)
    before = state_of(client)
    client.bgrewriteaof()
    wait_rewrite_done(client)
    base = next((srv.dir / "appendonlydir").glob("*.base.aof")).read_bytes()
    assert b"RCP11.NODE" in base and b"TEVICT" in base  # nodes as they are, then cuts
    client.close()
    srv.kill9()
    srv.start()
    client = srv.client()
    assert state_of(client) == before
    # After a crash a stream continues at its reservation mark: the
    # offsets between read as null, none is handed out twice.
    offset = tw(client, "emptied", "d")
    assert offset >= 3
    assert tr(client, "emptied", 3, offset - 2) == [None] * (offset - 3) + [b"d"]
    client.close()


def test_aof_logs_cuts_and_group_moves_as_absolute_commands(module_factory: Any) -> None:
    # always: the test reads the file right after the replies, and under
    # everysec Redis may hold an AOF write back (up to 2 s) while a slow
    # fsync runs, and still reply (flaky on a loaded machine).
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    tw(client, "s", *"abcdefgh")
    client.execute_command("TEVICT", "s", -3)
    client.execute_command("TWRITE", "s", "BACKLOG", 2, "ENTRIES", "i", "j")
    tr(client, "s", 0, 1, "GROUP", "g")
    before = state_of(client)
    incr = next((srv.dir / "appendonlydir").glob("*.incr.aof")).read_bytes()
    assert b"TEVICT\r\n$1\r\ns\r\n$1\r\n4\r\n" in incr  # -3 of 8 is "up to 4"
    assert b"TEVICT\r\n$1\r\ns\r\n$1\r\n7\r\n" in incr  # BACKLOG 2 of 10
    assert b"SET\r\n$1\r\ng\r\n$1\r\n9\r\n" in incr
    assert b"BACKLOG" not in incr and b"GROUP" not in incr
    client.close()
    srv.kill9()
    srv.start()
    client = srv.client()
    assert state_of(client) == before
    client.close()


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_kill9_with_aof_keeps_every_acknowledged_write(module_factory: Any, fsync: str) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync=fsync)
    client = srv.client()
    acked: dict[int, bytes] = {}
    for batch in range(20):
        pipe = client.pipeline(transaction=False)
        messages = [b"m-%d-%d" % (batch, n) for n in range(50)]
        for message in messages:
            pipe.execute_command("TWRITE", "s", message)
        for offset, message in zip(pipe.execute(), messages, strict=True):
            acked[offset] = message
    # With everysec Redis holds AOF writes back (and still replies) while
    # its background fsync of the AOF runs, for up to 2 s (docs/MODULE.md):
    # kill -9 then loses them. What this checks is that everything Redis
    # wrote to the AOF comes back, so kill once its buffer is written.
    wait_for(lambda: client.info("persistence")["aof_buffer_length"] == 0)
    client.close()
    srv.kill9()
    srv.start()
    client = srv.client()
    stored = tr(client, "s", 0, len(acked) + 10)
    assert {offset: stored[offset] for offset in acked} == acked
    # The next write lands past every acknowledged offset (at the
    # stream's reservation mark after a crash: a gap of nulls between).
    after = tw(client, "s", "after")
    assert after > max(acked)
    assert tr(client, "s", max(acked) + 1, after - max(acked)) == [None] * (
        after - max(acked) - 1
    ) + [b"after"]
    client.close()


# ---------------------------------------------------------------- DUMP / RESTORE / MIGRATE


def test_dump_restore_copy_and_migrate_round_trip(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(**{"rcp11.stream-compression": "zlib"})
    # Same configs on both sides: the module's timer conforms streams that
    # arrive to the server's configs (test_module_time.py).
    other: RedisModuleServer = module_factory(**{"rcp11.stream-compression": "zlib"})
    client, remote = srv.client(), other.client()
    populate(client)
    before = state_of(client)
    payload = client.dump("plain")
    client.restore("plain-copy", 0, payload)
    assert state_of(client)[b"plain-copy"] == before[b"plain"]
    client.delete("plain-copy")
    for key in list(before):
        client.migrate("127.0.0.1", other.port, key, 0, 5000, copy=True)
    assert state_of(remote) == before
    assert (
        stream_info(remote)["stream_compressed_nodes"]
        == (stream_info(client)["stream_compressed_nodes"])
    )
    client.close()
    remote.close()


@pytest.mark.parametrize("damage", ["payload byte", "header byte", "truncated", "node count"])
def test_corrupt_restore_payload_is_an_error_and_the_server_lives(
    module_factory: Any, damage: str
) -> None:
    srv: RedisModuleServer = module_factory(rdbcompression="no")
    client = srv.client()
    tw(client, "s", *[b"precious-payload-%04d" % n for n in range(100)])
    body = bytearray(client.dump("s")[:-8])
    if damage == "payload byte":
        body[body.index(b"precious-payload-0042")] ^= 0x20
    elif damage == "header byte":
        body[body.index(b"MNST") + 9] ^= 0x01  # inside the next offset
    elif damage == "truncated":
        del body[body.index(b"MNND") + 40 : -2]
    else:
        body[body.index(b"MNST") - 2] ^= 0x03  # the node count before the header
    with pytest.raises(redis.ResponseError, match="Bad data format"):
        client.restore("restored", 0, reseal(bytes(body)))
    assert client.exists("restored") == 0
    assert tr(client, "s", 99, 1) == [b"precious-payload-0099"]
    assert "rcp11" in srv.output() or damage == "truncated"
    client.close()


def test_stream_memory_is_given_back_after_reload(tmp_path: Path, module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory()
    client = srv.client()
    tw(client, "s", *[b"x" * 100] * 20_000)
    usage = client.memory_usage("s")
    client.execute_command("DEBUG", "RELOAD")
    assert abs(client.memory_usage("s") - usage) < usage * 0.05
    client.close()
