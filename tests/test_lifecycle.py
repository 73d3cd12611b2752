"""Start-up order: bind, lock the data directory, then touch files.

As redis-server: "Address already in use" comes before any data is loaded
(it came after 3.3 s of loading a 62 MB AOF). A server started on a data
directory that another server uses refuses to start and names that
server's pid (a lock file in `dir`), before it touches a file there:
such a second server once deleted the running server's temporary snapshot
and AOF-rewrite files, so the running server's BGSAVE failed and it
refused writes with MISCONF.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from conftest import ServerProcess, free_port, run_server, tr, tw, wait_for


def snapshot_of_dir(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_second_server_on_the_same_port_and_dir_touches_nothing(server_factory) -> None:
    srv = server_factory(appendonly="yes", save="3600 1")
    client = srv.client()
    tw(client, "s", "a")
    assert client.save()
    # Stand-ins for the files a BGSAVE or an AOF rewrite child is writing.
    (srv.dir / "temp-rcp11-1700000000000.snap").write_bytes(b"child at work")
    (srv.dir / "temp-rewriteaof-rcp11-1700000000000.aof").write_bytes(b"child at work")
    before = snapshot_of_dir(srv.dir)
    done = run_server(
        "--port", str(srv.port), "--dir", str(srv.dir), "--appendonly", "yes", cwd=srv.dir
    )
    assert done.returncode == 1
    assert "Address already in use" in done.stdout or "Failed listening" in done.stdout
    assert snapshot_of_dir(srv.dir) == before
    # The running server is unharmed: it saves and accepts writes.
    assert client.bgsave()
    wait_for(lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0)
    assert client.info("persistence")["rdb_last_bgsave_status"] == "ok"
    assert tw(client, "s", "b") == 1


@pytest.mark.slow
def test_second_server_on_a_directory_in_use_refuses_naming_the_holder(
    server_factory,
) -> None:
    srv = server_factory(appendonly="yes")
    client = srv.client()
    tw(client, "s", "a")
    (srv.dir / "temp-rcp11-1700000000000.snap").write_bytes(b"child at work")
    before = snapshot_of_dir(srv.dir)
    other_port = free_port()
    log = srv.dir.parent / "second.log"
    done = run_server(
        "--port",
        str(other_port),
        "--dir",
        str(srv.dir),
        "--appendonly",
        "yes",
        "--logfile",
        str(log),
        cwd=srv.dir.parent,
    )
    assert done.returncode == 1
    text = log.read_text()
    assert f"is in use by another rcp11 server (pid {srv.proc.pid}" in text
    assert "DB loaded" not in text
    assert snapshot_of_dir(srv.dir) == before
    assert tw(client, "s", "b") == 1
    # The lock goes with the process (kill -9 too): the same directory then
    # starts normally.
    srv.kill9()
    srv.start()
    assert tr(srv.client(), "s", 0, 2) == [b"a", b"b"]
    assert not (srv.dir / "temp-rcp11-1700000000000.snap").exists()  # swept by its owner


@pytest.mark.slow
def test_port_in_use_is_reported_before_loading_anything(server_factory, tmp_path: Path) -> None:
    busy = server_factory()
    data = ServerProcess(tmp_path / "big", appendonly="yes", appendfsync="no")
    data.start()
    client = data.client()
    pipe = client.pipeline(transaction=False)
    for index in range(2000):
        pipe.execute_command("TWRITE", "s", b"x" * 100 + b"%d" % index)
    pipe.execute()
    data.stop()
    aof = data.dir / "appendonly.aof"
    aof_before = aof.stat().st_mtime_ns
    log = tmp_path / "second.log"
    done = run_server(
        "--port",
        str(busy.port),
        "--dir",
        str(data.dir),
        "--appendonly",
        "yes",
        "--logfile",
        str(log),
        cwd=tmp_path,
    )
    assert done.returncode == 1
    text = log.read_text()
    assert f"Failed listening on port {busy.port} (tcp), aborting." in text
    assert "loaded" not in text  # neither "AOF ... loaded" nor "DB loaded"
    assert aof.stat().st_mtime_ns == aof_before


def test_unix_socket_of_a_running_server_is_not_taken(server_factory, tmp_path: Path) -> None:
    path = tmp_path / "shared.sock"
    srv = server_factory(unixsocket=str(path))
    other = tmp_path / "other"
    other.mkdir()
    done = run_server(
        "--port", "0", "--unixsocket", str(path), "--dir", str(other), "--save", "", cwd=other
    )
    assert done.returncode == 1
    assert "Address already in use" in done.stdout
    unix = redis.Redis(unix_socket_path=str(path))
    assert unix.ping()
    unix.close()
    assert srv.client().ping()


def test_config_set_dir_into_a_directory_in_use_is_refused(server_factory) -> None:
    first = server_factory(enable_protected_configs="yes")
    second = server_factory()
    client = first.client()
    tw(client, "s", "a")
    before = snapshot_of_dir(second.dir)
    try:
        client.config_set("dir", str(second.dir))
    except redis.ResponseError as exc:
        assert f"in use by another rcp11 server (pid {second.proc.pid}" in str(exc)
    else:
        raise AssertionError("CONFIG SET dir into a directory in use was accepted")
    assert client.config_get("dir")["dir"] == str(first.dir)
    assert client.save()  # still into its own directory, cwd included
    assert (first.dir / "dump.rcp").exists()
    assert snapshot_of_dir(second.dir) == before
