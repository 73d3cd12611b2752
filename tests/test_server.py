"""The network front end, end to end: real rcp11-server processes, raw
sockets, redis-py, redis-cli and redis-benchmark."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import redis
from conftest import (
    RawClient,
    ServerProcess,
    free_port,
    mbulk,
    require,
    run_server,
    wait_for,
)

from rcp11.state import NullPersistence

LOG_LINE = re.compile(r"^\d+:[MC] \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2}\.\d{3} [.\-*#] .+")


# -- protocol -------------------------------------------------------------------


def test_quit_closes_after_reply(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    conn.send(mbulk(b"QUIT") + mbulk(b"PING"))
    assert conn.reply() == b"OK"
    assert conn.closed()


# -- limits -----------------------------------------------------------------------


def test_requirepass_limits_what_comes_before_auth(server_factory) -> None:
    srv = server_factory(requirepass="s3cret")
    conn = RawClient(srv.port)
    conn.send(mbulk(b"TWRITE", b"a", b"b"))
    assert str(conn.reply()).startswith("NOAUTH")
    conn.send(mbulk(b"AUTH", b"wrong"))
    assert str(conn.reply()).startswith("WRONGPASS")
    # AUTH and a command too big for an unauthenticated client, in one write:
    # the second is parsed after AUTH succeeded, as Redis does.
    conn.send(mbulk(b"AUTH", b"s3cret") + mbulk(b"TWRITE", b"a", b"ENTRIES", *[b"m"] * 20))
    assert conn.reply() == b"OK"
    assert conn.reply() == 0
    # Before AUTH a client cannot make the server buffer big requests.
    stranger = RawClient(srv.port)
    stranger.send(b"*100\r\n")
    assert "unauthenticated multibulk length" in str(stranger.reply())
    assert stranger.closed()


def test_protected_mode_refuses_non_loopback(server_factory) -> None:
    # 127.0.0.2 is not "local" for protected mode: only 127.0.0.1, ::1 and
    # unix sockets are.
    srv = server_factory(bind="127.0.0.1 127.0.0.2")
    outsider = RawClient(srv.port, host="127.0.0.2", source="127.0.0.2")
    error = str(outsider.reply())
    assert error.startswith("DENIED Redis is running in protected mode")
    assert outsider.closed()
    local = RawClient(srv.port)
    local.send(mbulk(b"PING"))
    assert local.reply() == b"PONG"
    srv.client().config_set("requirepass", "pw")
    allowed = RawClient(srv.port, host="127.0.0.2", source="127.0.0.2")
    allowed.send(mbulk(b"AUTH", b"pw") + mbulk(b"PING"))
    assert allowed.reply() == b"OK"
    assert allowed.reply() == b"PONG"


def test_protected_mode_off(server_factory) -> None:
    srv = server_factory(bind="127.0.0.1 127.0.0.2", protected_mode="no")
    outsider = RawClient(srv.port, host="127.0.0.2", source="127.0.0.2")
    outsider.send(mbulk(b"PING"))
    assert outsider.reply() == b"PONG"


# -- start-up, signals, daemon ------------------------------------------------------


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


def test_port_in_use_exits(shared_server: ServerProcess, tmp_path: Path) -> None:
    result = run_server("--port", str(shared_server.port), "--save", "", "--dir", str(tmp_path))
    assert result.returncode == 1
    assert "Failed listening on port" in result.stdout


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


def test_daemonize_and_pidfile(tmp_path: Path) -> None:
    port = free_port()
    pidfile = tmp_path / "rcp11.pid"
    logfile = tmp_path / "daemon.log"
    args = ["--port", str(port), "--daemonize", "yes", "--pidfile", str(pidfile)]
    args += ["--logfile", str(logfile), "--save", "", "--dir", str(tmp_path)]
    result = run_server(*args)
    assert result.returncode == 0  # the launcher returns once detached
    assert wait_for(pidfile.exists)
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


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- tools --------------------------------------------------------------------------


def test_redis_cli(shared_server: ServerProcess, shared_client: redis.Redis) -> None:
    require("redis-cli")
    port = str(shared_server.port)
    result = subprocess.run(
        ["redis-cli", "-p", port, "PING"], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == "PONG"
    commands = "".join(f"TWRITE mass m{i}\r\n" for i in range(2000))
    result = subprocess.run(
        ["redis-cli", "-p", port, "--pipe"],
        input=commands,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "errors: 0, replies: 2000" in result.stdout
    result = subprocess.run(
        ["redis-cli", "-p", port, "TREAD", "mass", "-2", "5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.stdout.split() == ["m1998", "m1999"]


def test_redis_benchmark(shared_server: ServerProcess) -> None:
    require("redis-benchmark")
    result = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(shared_server.port),
            "-t",
            "ping",
            "-n",
            "2000",
            "-c",
            "5",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "PING_MBULK" in result.stdout.replace("\r", "\n")
    assert shared_server.client().ping() is True


class FakeTransport:
    """Just enough of an asyncio transport to drive a Connection in-process."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def make_connection(persistence: object) -> tuple[object, object, FakeTransport]:
    import asyncio

    from rcp11 import server as server_module
    from rcp11.blocking import BlockingManager
    from rcp11.config import Config
    from rcp11.state import ServerState

    config = Config()
    config.apply_args(["--save", ""])
    state = ServerState(config)
    BlockingManager(state)
    state.persistence = persistence  # type: ignore[assignment]
    srv = server_module.Server(state, asyncio.new_event_loop())
    conn = server_module.Connection(srv)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return srv, conn, transport


class RecordingPersistence(NullPersistence):
    aof_state = "on"

    def __init__(self, outcome: bool) -> None:
        self.outcome = outcome
        self.logged: list[list[bytes]] = []
        self.flushed_before_write: list[bool] = []
        self.transport: FakeTransport | None = None

    def propagate(self, argv: list[bytes]) -> None:
        self.logged.append(argv)

    def flush(self) -> bool:
        assert self.transport is not None
        # nothing of this iteration may have reached the socket yet
        self.flushed_before_write.append(not self.transport.written)
        return self.outcome


def test_persistence_flush_runs_before_any_reply_is_written() -> None:
    persistence = RecordingPersistence(outcome=True)
    srv, conn, transport = make_connection(persistence)
    persistence.transport = transport
    conn.data_received(mbulk(b"TWRITE", b"s", b"a") + mbulk(b"TWRITE", b"s", b"b"))
    assert transport.written == []  # replies wait for the end of the iteration
    srv.flush()
    assert persistence.flushed_before_write == [True]
    assert b"".join(transport.written) == b":0\r\n:1\r\n"
    assert [argv[0] for argv in persistence.logged] == [b"TWRITE", b"TWRITE"]


def test_unlogged_writes_are_never_acknowledged() -> None:
    persistence = RecordingPersistence(outcome=False)
    srv, conn, transport = make_connection(persistence)
    persistence.transport = transport
    conn.data_received(mbulk(b"TWRITE", b"s", b"a"))
    srv.flush()
    assert transport.written == []
    assert transport.closed


def _answers(client: redis.Redis) -> bool:
    try:
        return client.ping() is True
    except redis.ConnectionError:
        return False
