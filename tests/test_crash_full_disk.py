"""Disk faults: a full disk (ENOSPC on a tiny tmpfs). Writes that cannot be logged are refused with -MISCONF (or their
connection is closed), never acknowledged; writes resume once the disk
works again, and nothing acknowledged is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from conftest import fill, read_all, wait_for


def try_write(client: redis.Redis, key: str, payload: bytes) -> int | str:
    """The offset on success, else 'misconf' or 'closed'."""
    try:
        return client.execute_command("TWRITE", key, payload)
    except redis.exceptions.ResponseError as exc:
        assert str(exc).startswith("MISCONF"), exc
        return "misconf"
    except redis.exceptions.ConnectionError:
        return "closed"


def write_until_refused(client: redis.Redis, acked: dict[int, bytes], key: str) -> list[str]:
    refusals: list[str] = []
    for index in range(20000):  # the AOF keeps some room preallocated
        payload = b"while-full-%d-" % index + b"x" * 200
        result = try_write(client, key, payload)
        if isinstance(result, int):
            acked[result] = payload  # it fit into space the AOF still had
        else:
            refusals.append(result)
            if len(refusals) >= 5:
                break
    return refusals


def wait_until_writable(client: redis.Redis, acked: dict[int, bytes], key: str) -> None:
    """Until a write is accepted again (the disk recovered)."""

    def writable() -> bool:
        result = try_write(client, key, b"recovered")
        if isinstance(result, int):
            acked[result] = b"recovered"
            return True
        return False

    wait_for(writable, timeout=15)


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_full_disk_refuses_then_recovers_with_aof(
    small_fs: Path, server_factory, fsync: str
) -> None:
    srv = server_factory(
        dir=small_fs, logfile=small_fs.parent / "server.log", appendonly="yes", appendfsync=fsync
    )
    client = srv.client(socket_timeout=10)
    acked: dict[int, bytes] = {}
    for index in range(100):
        payload = b"before-%d" % index
        acked[client.execute_command("TWRITE", "s", payload)] = payload
    filler = fill(small_fs)
    refusals = write_until_refused(client, acked, "s")
    assert refusals, "a full disk must refuse writes"
    client = srv.client(socket_timeout=10)
    assert try_write(client, "s", b"still-full") in ("misconf", "closed")
    assert client.info("persistence")["aof_last_write_status"] == "err"
    # Reads keep working while writes are refused.
    assert client.execute_command("TREAD", "s", 0, 1) == [b"before-0"]
    filler.unlink()
    wait_until_writable(client, acked, "s")
    assert client.info("persistence")["aof_last_write_status"] == "ok"
    # Full again, and this time the server dies before the disk recovers:
    # whatever it acknowledged must be in the AOF already.
    filler = fill(small_fs)
    assert write_until_refused(client, acked, "s")
    srv.kill9()
    filler.unlink()
    srv.start()
    messages = read_all(srv.client(), "s")
    for offset, payload in acked.items():
        assert messages[offset] == payload


@pytest.mark.slow
def test_full_disk_refuses_offset_reservations_without_aof(small_fs: Path, server_factory) -> None:
    """No AOF, no save rules: the offsets file alone must still be written
    before a new stream can hand out offsets."""
    srv = server_factory(dir=small_fs, logfile=small_fs.parent / "server.log")
    client = srv.client(socket_timeout=10)
    first = client.execute_command("TWRITE", "a", b"x")
    assert first == 0
    filler = fill(small_fs)
    # Stream "a" still has room below its reservation, so it keeps working;
    # a brand-new stream needs a reservation first. Bigger batches eventually
    # need a new mark too.
    results = [try_write(client, f"new{i}-" + "k" * 200, b"y") for i in range(300)]
    assert "misconf" in results
    offsets_file = small_fs / "dump.rcp.offsets"
    assert offsets_file.exists()
    filler.unlink()
    acked: dict[int, bytes] = {}
    wait_until_writable(client, acked, "fresh")
    srv.kill9()
    srv.start()
    client = srv.client()
    # Lost data, kept offsets: the next offset of "fresh" is past what was handed out.
    assert client.execute_command("TWRITE", "fresh", b"z") > max(acked)


@pytest.mark.slow
def test_failed_bgsave_with_save_rules_refuses_writes(small_fs: Path, server_factory) -> None:
    srv = server_factory(dir=small_fs, logfile=small_fs.parent / "server.log")
    client = srv.client(socket_timeout=10)
    client.config_set("save", "3600 1")
    client.execute_command("TWRITE", "s", b"x" * 1000)
    filler = fill(small_fs)
    big = b"y" * 100_000
    for _ in range(20):
        try_write(client, "s", big)  # the snapshot needs more room than is left
    assert client.bgsave()  # the child starts, then fails to write
    wait_for(lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0, timeout=15)

    assert client.info("persistence")["rdb_last_bgsave_status"] == "err"
    assert try_write(client, "s", b"refused") == "misconf"
    filler.unlink()
    assert client.save()
    assert isinstance(try_write(client, "s", b"accepted"), int)


@pytest.mark.slow
def test_write_that_cannot_be_logged_is_never_acknowledged(small_fs: Path, server_factory) -> None:
    """A command bigger than the AOF's preallocated room, on a full disk:
    the write fails after the command ran, so its reply must not be sent as
    a success (the server drops it and closes the connection)."""
    srv = server_factory(
        dir=small_fs,
        logfile=small_fs.parent / "server.log",
        appendonly="yes",
        appendfsync="always",
    )
    client = srv.client(socket_timeout=10)
    assert client.execute_command("TWRITE", "s", b"first") == 0
    filler = fill(small_fs)
    result = try_write(client, "s", b"z" * 1_500_000)  # past any preallocated slice
    assert result in ("misconf", "closed")
    srv.kill9()
    filler.unlink()
    srv.start()
    messages = read_all(srv.client(), "s")
    assert messages[0] == b"first"
    if result == "closed" and len(messages) > 1:
        # It ran and was logged later, fine; what matters is that no success
        # reply went out for an unlogged write.
        assert messages[1] in (None, b"z" * 1_500_000)


@pytest.mark.slow
def test_shutdown_save_on_full_disk_keeps_running(small_fs: Path, server_factory) -> None:
    srv = server_factory(dir=small_fs, logfile=small_fs.parent / "server.log")
    client = srv.client(socket_timeout=10)
    client.execute_command("TWRITE", "s", b"x" * 100_000)
    filler = fill(small_fs)
    with pytest.raises(redis.exceptions.ResponseError, match="SHUTDOWN"):
        client.execute_command("SHUTDOWN", "SAVE")
    assert client.ping()
    filler.unlink()
    assert client.save()
