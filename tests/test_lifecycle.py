"""The server's life: start-up, signals, SHUTDOWN, daemon mode, the log.

Start-up order: bind, lock the data directory, then touch files.

As redis-server: "Address already in use" comes before any data is loaded
(it came after 3.3 s of loading a 62 MB AOF). A server started on a data
directory that another server uses refuses to start and names that
server's pid (a lock file in `dir`), before it touches a file there:
such a second server once deleted the running server's temporary snapshot
and AOF-rewrite files, so the running server's BGSAVE failed and it
refused writes with MISCONF.

Then --help and --version, SIGTERM and SIGINT (Ctrl-C, also with blocked
clients), SHUTDOWN [NOSAVE], daemonize with its pidfile and logfile, and
the log's format and levels.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import (
    RawClient,
    ServerProcess,
    answers_ping,
    free_port,
    run_server,
    tr,
    tw,
    wait_blocked,
    wait_for,
)


def snapshot_of_dir(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---------------------------------------------------------- the command line


@pytest.mark.slow
def test_help_and_version() -> None:
    result = run_server("--help")
    assert result.returncode == 0
    assert "Usage: rcp11-server" in result.stdout
    result = run_server("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("rcp11 server v=")


def test_console_script() -> None:
    # The script pip installed into the environment running the tests (the
    # venv run-tests.sh made), never whatever rcp11-server is first on PATH.
    script = Path(sys.executable).parent / "rcp11-server"
    assert script.exists(), f"{script} missing: pip install -e . into this environment"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stdout.startswith("rcp11 server v=")


@pytest.mark.slow
def test_info_shows_the_executable_as_an_absolute_path(tmp_path: Path) -> None:
    """Started by a relative path (`.venv/bin/rcp11-server`), from a
    directory it then leaves for `dir`, as the Quick start does."""
    env = Path(sys.executable).parent.parent
    script = Path(sys.executable).parent / "rcp11-server"
    relative = os.path.relpath(script, env)
    port = free_port()
    proc = subprocess.Popen(
        [relative, "--port", str(port), "--dir", str(tmp_path), "--save", ""],
        cwd=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: answers_ping(port), timeout=30)
        client = redis.Redis(port=port)
        shown = client.info("server")["executable"]
        assert os.path.isabs(shown) and os.path.samefile(shown, script)
        client.close()
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.slow
def test_port_in_use_exits(shared_server: ServerProcess, tmp_path: Path) -> None:
    result = run_server("--port", str(shared_server.port), "--save", "", "--dir", str(tmp_path))
    assert result.returncode == 1
    assert "Failed listening on port" in result.stdout


# ------------------------------------------------------ shutdown and signals


LOG_LINE = re.compile(r"^\d+:[MC] \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2}\.\d{3} [.\-*#] .+")


@pytest.mark.slow
def test_sigterm_exits_cleanly_and_logs(server_factory) -> None:
    srv = server_factory(loglevel="verbose")
    assert srv.stop() == 0
    log = (srv.dir / "server.log").read_text()
    lines = log.splitlines()
    assert all(LOG_LINE.match(line) for line in lines if line and not line.startswith(" ")), log
    assert "Ready to accept connections tcp" in log
    assert f"port {srv.port}" in log
    assert "Received SIGTERM" in log
    assert "bye bye" in log


@pytest.mark.slow
def test_a_clean_shutdown_removes_the_lock_file(server_factory) -> None:
    """SIGTERM, SIGINT and SHUTDOWN leave no rcp11.lock behind; kill -9 does
    (the lock itself goes with the process: the next start takes it)."""
    srv = server_factory(appendonly="yes")
    lock = srv.dir / "rcp11.lock"
    assert lock.read_text() == f"{srv.proc.pid}\n"
    assert srv.stop() == 0
    assert not lock.exists()
    srv.start()
    srv.kill9()
    assert lock.exists()
    srv.start()
    try:
        srv.client().shutdown(nosave=True)
    except redis.exceptions.ConnectionError:
        pass
    assert srv.proc.wait(20) == 0
    assert not lock.exists()


def test_a_lock_taken_on_a_file_removed_meanwhile_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server shutting down removes its lock file while another opens it:
    the other's lock is then on a file no one else can see, so it locks the
    one the name gives now."""
    from rcp11 import datafiles

    locked = datafiles._lock_file
    calls = []

    def removed_after_the_first(path: str) -> int:
        fd = locked(path)
        calls.append(path)
        if len(calls) == 1:
            os.unlink(path)
        return fd

    monkeypatch.setattr(datafiles, "_lock_file", removed_after_the_first)
    path = datafiles.lock_data_dir(str(tmp_path))
    try:
        assert len(calls) == 2
        assert os.path.samestat(os.stat(path), os.fstat(datafiles._held[path]))
    finally:
        datafiles.release_data_dirs()
    assert not os.path.exists(path) and datafiles._held == {}


@pytest.mark.slow
def test_sigint_and_shutdown_command(server_factory) -> None:
    srv = server_factory()
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(20) == 0
    srv.start()
    client = srv.client()
    try:
        client.shutdown(nosave=True)
    except redis.exceptions.ConnectionError:
        pass
    assert srv.proc.wait(20) == 0


@pytest.mark.slow
def test_ctrl_c_right_after_the_first_reply_shuts_down(tmp_path: Path) -> None:
    # The listeners started in an event-loop run of their own, and uvloop
    # sets signals aside while the loop is stopped: a SIGINT sent as soon as
    # the first PONG came back was lost 29 times in 40 (the server ran on).
    for attempt in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rcp11", "server", "--port", str(port), "--save", ""]
            + ["--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while (sock := _pong(port)) is None:
                assert time.monotonic() < deadline, "the server never answered PING"
                time.sleep(0.002)
            proc.send_signal(signal.SIGINT)
            try:
                assert proc.wait(15) == 0, f"attempt {attempt}"
            finally:
                sock.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _pong(port: int) -> socket.socket | None:
    """A connection that got +PONG to PING, or None while nothing answers."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return None
    sock.sendall(b"PING\r\n")
    if sock.recv(16) == b"+PONG\r\n":
        return sock
    sock.close()
    return None


@pytest.mark.slow
def test_shutdown_nosave_stops_the_server(server_factory: Any) -> None:
    srv = server_factory()
    client = srv.client()
    with pytest.raises(redis.ConnectionError):
        client.execute_command("SHUTDOWN", "NOSAVE")
    assert srv.proc.wait(20) == 0


@pytest.mark.slow
def test_ctrl_c_with_blocked_clients_saves_and_exits(server_factory: Any) -> None:
    srv = server_factory(save="3600 1")
    cl = srv.client()
    tw(cl, "s", "a")
    socks = []
    for n in range(4):
        sock = srv.raw()
        sock.send(
            b"TREAD s 1 5 GROUPNEW g%d BLOCK 0\r\n" % n if n % 2 else b"TREAD s 1 5 BLOCK 0\r\n"
        )
        socks.append(sock)
    wait_blocked(cl, 4)
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGINT)  # Ctrl-C in a terminal: a clean shutdown, as SIGTERM
    assert srv.proc.wait(10) == 0
    for sock in socks:
        sock.close()
    srv.start()
    cl = srv.client()
    assert tr(cl, "s", 0, 5) == [b"a"]
    assert cl.mget("g1", "g3") == [b"1", b"1"]
    assert tw(cl, "s", "b") == 1


# ------------------------------------------------------------ daemon and log


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


@pytest.mark.slow
def test_daemonize_and_pidfile(tmp_path: Path) -> None:
    port = free_port()
    pidfile = tmp_path / "rcp11.pid"
    logfile = tmp_path / "daemon.log"
    args = ["--port", str(port), "--daemonize", "yes", "--pidfile", str(pidfile)]
    args += ["--logfile", str(logfile), "--save", "", "--dir", str(tmp_path)]
    result = run_server(*args)
    assert result.returncode == 0  # the launcher returns once detached
    # The daemon writes the file as redis-server does (open, then write):
    # it may exist a moment before it holds the pid.
    assert wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    pid = int(pidfile.read_text())
    try:
        client = redis.Redis(port=port)
        assert wait_for(lambda: _pings(client))
        assert client.info("server")["process_id"] == pid
    finally:
        os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: not pidfile.exists())
    assert wait_for(lambda: not _alive(pid))
    assert "Ready to accept connections" in logfile.read_text()


def _alive_not_zombie(pid: int) -> bool:
    """Running, not exited: a daemon is reparented to PID 1, which may reap
    its zombie late (or never, in a container)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_daemonize_writes_pidfile_and_logfile(tmp_path: Path) -> None:
    port = free_port()
    pidfile, logfile = tmp_path / "rcp11.pid", tmp_path / "rcp11.log"
    args = ["--port", str(port), "--daemonize", "yes", "--pidfile", str(pidfile)]
    args += ["--logfile", str(logfile), "--dir", str(tmp_path), "--save", ""]
    launcher = run_server(*args, cwd=tmp_path)
    assert launcher.returncode == 0

    pid = 0
    try:
        wait_for(lambda: answers_ping(port) and pidfile.exists(), timeout=15)
        pid = int(pidfile.read_text().strip())
        assert redis.Redis(port=port).info("server")["process_id"] == pid
        assert logfile.stat().st_size > 0
        with RawClient(port) as raw:
            raw.send(b"SHUTDOWN NOSAVE\r\n")
            assert raw.read_until_closed() == b""
        wait_for(lambda: not _alive_not_zombie(pid), timeout=10)
        assert not pidfile.exists()
    finally:  # never leave a daemon behind, whatever failed
        if not pid and pidfile.exists():
            pid = int(pidfile.read_text().strip() or 0)
        if pid and _alive_not_zombie(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_loglevel_warning_keeps_notices_out_of_the_logfile(
    server_factory: Any, shared_server: ServerProcess
) -> None:
    quiet = server_factory(loglevel="warning")
    quiet.client().save()
    quiet.stop()
    assert (
        "Ready to accept connections" in (shared_server.dir / "server.log").read_text()
    )  # notice level
    assert "Ready to accept connections" not in (quiet.dir / "server.log").read_text()
