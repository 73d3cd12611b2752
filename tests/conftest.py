"""Shared fixtures: real rcp11 servers on free ports (never 6379)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

REPO = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], Any], timeout: float = 30.0) -> bool:
    """Poll until condition() is true; True, or AssertionError at timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)
    return True


def wait_blocked(client: redis.Redis, n: int, timeout: float = 10.0) -> None:
    """Wait until the server reports exactly n blocked clients, so a test's
    order of events is the server's order and not a race."""
    deadline = time.monotonic() + timeout
    while int(client.info("clients")["blocked_clients"]) != n:
        assert time.monotonic() < deadline, f"blocked_clients never reached {n}"
        time.sleep(0.01)


def mbulk(*args: bytes) -> bytes:
    """A request as a client sends it: a RESP array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


def tw(client: redis.Redis, key: str, *entries: Any) -> int:
    """TWRITE key entry, or TWRITE key ENTRIES e1 e2 ... for several."""
    if len(entries) == 1:
        return client.execute_command("TWRITE", key, entries[0])
    return client.execute_command("TWRITE", key, "ENTRIES", *entries)


def tr(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command("TREAD", *args)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run fn in a daemon thread; its reply or exception lands in the box."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["reply"] = fn()
        except Exception as exc:  # the caller asserts on it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def persistence_in_process(directory: Path, **directives: str) -> tuple[Any, Any]:
    """(ServerState, Persistence) on `directory`, in this process, wired as
    the server wires them, with no save rules; `directives` as for CONFIG
    SET (underscores for dashes). Not loaded yet: call .load()."""
    from rcp11.commands import execute
    from rcp11.config import Config
    from rcp11.persistence import Persistence
    from rcp11.state import ServerState

    config = Config()
    config.set("dir", str(directory))
    config.set("save", "")
    for name, value in directives.items():
        config.set(name.replace("_", "-"), value)
    state = ServerState(config)
    state.persistence = persistence = Persistence(state, execute)
    return state, persistence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """An rcp11-server child process started with --directive overrides.
    kind says which server it is ("rcp11"; RedisModuleServer is "module").

    Each server gets its own directory (dir), so snapshots and AOF files of
    different tests never meet. restart() keeps port and directory.
    """

    kind = "rcp11"

    def __init__(self, workdir: Path, conf: Path | None = None, **directives: object) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = conf
        self.port = int(directives.pop("port", 0)) or free_port()
        self.directives: dict[str, str] = {
            "save": "",
            "appendonly": "no",
            "dir": str(self.dir),
            "logfile": str(self.dir / "server.log"),
        }
        self.directives.update({k.replace("_", "-"): str(v) for k, v in directives.items()})
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "rcp11", "server"]
        if self.conf is not None:
            args.append(str(self.conf))
        args += ["--port", str(self.port)]
        for name, value in self.directives.items():
            args += [f"--{name}", value]
        return args

    def start(self, wait: bool = True, timeout: float = 20.0) -> ServerProcess:
        self.proc = subprocess.Popen(
            self.argv(), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            client = redis.Redis(
                port=self.port,
                protocol=2,
                password=self.directives.get("requirepass"),
                socket_timeout=2,
            )
            try:
                client.ping()
                return
            except (
                redis.exceptions.ConnectionError,
                redis.exceptions.BusyLoadingError,
                redis.exceptions.TimeoutError,
            ):
                pass  # not listening yet, or still replaying its files
            finally:
                client.close()
            time.sleep(0.05)
        raise RuntimeError(f"server did not answer within {timeout}s:\n{self.output()}")

    def output(self) -> str:
        log = self.dir / "server.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        if self.proc is not None and self.proc.poll() is not None and self.proc.stdout:
            text += self.proc.stdout.read().decode(errors="replace")
        return text

    def client(self, protocol: int = 2, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, protocol=protocol, **kwargs)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, **changes: object) -> ServerProcess:
        self.stop()
        self.directives.update({k.replace("_", "-"): str(v) for k, v in changes.items()})
        return self.start()


class RedisModuleServer(ServerProcess):
    """redis-server with the rcp11 module loaded, driven like ServerProcess
    (port, dir, client(), stop(), kill9(), restart()).

    Directives are redis-server's; module configs take their "rcp11."
    names (rcp11.stream-node-max-entries ...). RCP11_MODULE_PATH overrides
    the module (CI's sanitizer run builds its own) and RCP11_MODULE_PRELOAD
    is put into LD_PRELOAD (the sanitizer runtime)."""

    kind = "module"

    def __init__(self, workdir: Path, conf: Path | None = None, **directives: object) -> None:
        super().__init__(workdir, conf, **directives)
        self.directives.setdefault("enable-debug-command", "yes")

    def argv(self) -> list[str]:
        args = ["redis-server"]
        if self.conf is not None:
            args.append(str(self.conf))
        args += ["--port", str(self.port), "--bind", "127.0.0.1", "--loadmodule", module_path()]
        for name, value in self.directives.items():
            args += [f"--{name}", value]
        return args

    def start(self, wait: bool = True, timeout: float = 20.0) -> ServerProcess:
        env = dict(os.environ)
        preload = os.environ.get("RCP11_MODULE_PRELOAD")
        if preload:
            env["LD_PRELOAD"] = preload
        self.proc = subprocess.Popen(
            self.argv(), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
        if wait:
            self.wait_ready(timeout)
        return self


def module_path() -> str:
    """The Redis module the tests load (python -m rcp11 module-path)."""
    override = os.environ.get("RCP11_MODULE_PATH")
    if override:
        return override
    from rcp11.__main__ import module_path as built

    path = built()
    if not path.is_file():
        pytest.fail(f"the Redis module was not built ({path}): pip install -e .")
    return str(path)


@pytest.fixture(scope="module", params=["rcp11", "module"])
def stream_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server per test module and kind: rcp11-server ("rcp11") and
    redis-server with the rcp11 module ("module"). Tests of the stream
    commands take it (usually as their module's `srv`) so that both
    servers answer them: a difference is a bug, or Redis's own wording."""
    if request.param == "module":
        require("redis-server")
        server: ServerProcess = RedisModuleServer(tmp_path_factory.mktemp("module-redis"))
    else:
        server = ServerProcess(tmp_path_factory.mktemp("module-server"))
    server.start()
    yield server
    server.stop()


def free_cluster_port() -> int:
    """A port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        try:
            with socket.socket() as bus:
                bus.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class ModuleCluster:
    """Six redis-servers with the module, joined into a cluster of three
    primaries with one replica each (`redis-cli --cluster create`), on
    loopback. ``module_factory(port=..., **directives)`` starts one node
    (the module_factory fixture, or a longer-lived one)."""

    def __init__(self, module_factory: Any, nodes: int = 6) -> None:
        self.servers: list[RedisModuleServer] = []
        for _ in range(nodes):
            srv: RedisModuleServer = module_factory(
                port=free_cluster_port(),
                cluster_enabled="yes",
                cluster_config_file="nodes.conf",
                cluster_node_timeout=3000,
                repl_diskless_sync_delay=0,
            )
            self.servers.append(srv)
        addresses = [f"127.0.0.1:{srv.port}" for srv in self.servers]
        done = subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1"]
            + ["--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        for srv in self.servers:
            client = srv.client()
            wait_for(lambda client=client: client.cluster("info")["cluster_state"] == "ok", 60)
            client.close()
        wait_for(self._replicas_in_sync, 60)

    def client(self) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.servers[0].port)

    def node_client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port)

    def primaries(self) -> list[int]:
        return [srv.port for srv in self.servers if self._role(srv.port) == "master"]

    def replica_of(self, primary_port: int) -> int:
        for srv in self.servers:
            info = redis.Redis(port=srv.port).info("replication")
            if info["role"] == "slave" and info["master_port"] == primary_port:
                return srv.port
        raise AssertionError(f"no replica of {primary_port}")

    def _role(self, port: int) -> str:
        client = redis.Redis(port=port)
        try:
            return client.info("replication")["role"]
        finally:
            client.close()

    def _replicas_in_sync(self) -> bool:
        """Every replica has everything its primary sent (what WAIT waits
        for): the offsets match and the link is up."""
        for port in self.primaries():
            info = redis.Redis(port=port).info("replication")
            replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            if len(replicas) != 1:
                return False
            if (
                replicas[0]["state"] != "online"
                or replicas[0]["offset"] != info["master_repl_offset"]
            ):
                return False
        return True


def local_spark(app: str, master: str = "local[2,2]") -> Any:
    """A local SparkSession for one test module, with rcp11 registered:
    executors run this interpreter, no UI, two shuffle partitions, and no
    empty trailing micro-batches (each costs a planning round)."""
    from pyspark.sql import SparkSession

    from rcp11.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.Builder()  # not .builder: its options outlive sessions
        .master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("OFF")
    register(session)
    return session


@pytest.fixture
def module_factory(tmp_path: Path) -> Iterator:
    """Start redis-servers with the module: module_factory(appendonly="yes",
    **{"rcp11.stream-compression": "zlib"}) -> RedisModuleServer."""
    started: list[RedisModuleServer] = []

    def make(start: bool = True, **directives: object) -> RedisModuleServer:
        require("redis-server")
        srv = RedisModuleServer(tmp_path / f"redis{len(started)}", **directives)
        started.append(srv)
        if start:
            srv.start()
        return srv

    yield make
    for srv in started:
        srv.kill9()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator:
    """Start servers: server_factory(appendonly="yes", ...) -> ServerProcess."""
    started: list[ServerProcess] = []

    def make(conf: Path | None = None, start: bool = True, **directives: object) -> ServerProcess:
        srv = ServerProcess(tmp_path / f"srv{len(started)}", conf, **directives)
        started.append(srv)
        return srv.start() if start else srv

    yield make
    for srv in started:
        srv.kill9()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server shared by a test module (its tests flush it as needed):
    starting one per test would dominate the run time on a small machine."""
    server = ServerProcess(tmp_path_factory.mktemp("module-server")).start()
    yield server
    server.stop()


@pytest.fixture
def server(server_factory) -> ServerProcess:
    """One running server with persistence off."""
    return server_factory()


@pytest.fixture
def r(server: ServerProcess) -> Iterator[redis.Redis]:
    client = server.client(protocol=2)
    yield client
    client.close()


@pytest.fixture
def r3(server: ServerProcess) -> Iterator[redis.Redis]:
    client = server.client(protocol=3)
    yield client
    client.close()


def have(program: str) -> bool:
    return shutil.which(program) is not None


def require(program: str) -> None:
    """Fail (not skip) when CI lacks a tool it promised to install; outside
    CI a missing tool skips, so a laptop without redis-tools still runs."""
    if have(program):
        return
    if os.environ.get("CI"):
        pytest.fail(f"{program} is not installed; .ci/run must install it")
    pytest.skip(f"{program} not installed")


def stream_info(client: redis.Redis) -> dict[str, Any]:
    """INFO's streams section of either server: rcp11-server's "streams",
    or the module's "rcp11_streams", whose fields Redis prefixes with the
    module name ("rcp11_stream_messages"): returned without the prefix."""
    info = client.info("streams")
    if info:
        return info
    return {k.removeprefix("rcp11_"): v for k, v in client.info("rcp11").items()}


@pytest.fixture(scope="session")
def redis_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real redis-server 7 (persistence off) to compare answers with;
    yields its port."""
    require("redis-server")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis-reference")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        + ["--appendonly", "no", "--dir", str(workdir), "--logfile", str(workdir / "log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16) == b"+PONG\r\n"
        except OSError:
            return False

    wait_for(answers, timeout=10)
    yield port
    proc.kill()
    proc.wait()


def redis_cli(port: int, *args: str, stdin: str | None = None) -> str:
    """redis-cli's output (stdout and stderr) for one command, or for
    what stdin holds (e.g. a transaction, or --pipe input)."""
    require("redis-cli")
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout + done.stderr


def serve_reads(state: Any, client: Any, chunks: list[bytes], lane: bool = True) -> bytes:
    """What a connection does with each read, in process (the server's
    Connection.data_received() and process() without the network): the C
    lane first (unless lane=False), then the parser and run_pipeline() for
    the rest. Returns the reply bytes; a protocol error ends it as it ends
    the connection."""
    from rcp11.commands import Stop, protocol_error_reply, run_lane, run_pipeline
    from rcp11.errors import ProtocolError
    from rcp11.resp import RequestParser

    parser = client.__dict__.setdefault("_test_parser", RequestParser())
    out: list[bytes] = []
    out_bytes = 0
    mark = 1 << 62
    for data in chunks:
        if client.closing:
            break
        if lane and client.blocked is None:
            consumed, out_bytes = run_lane(state, client, parser, data, out, out_bytes, mark)
            data = data[consumed:]
            if not data:
                continue
        try:
            if client.blocked is not None:
                parser.feed(data)
                continue
            commands: list[list[bytes]] | None = parser.take(data)
            index = 0
            while True:
                if not commands:
                    commands, index = parser.drain(), 0
                    if not commands:
                        break
                index, out_bytes, stop = run_pipeline(
                    state, client, commands, index, out, out_bytes, mark
                )
                if stop is Stop.DONE:
                    commands = None
                elif stop is not Stop.OUTPUT and stop is not Stop.CLOCK:
                    parser.push_back(commands[index:])
                    break
        except ProtocolError as exc:
            out.append(protocol_error_reply(state, exc.message))
            client.closing = True
    return b"".join(out)


def dispatch_read(state: Any, client: Any, commands: list[list[bytes]]) -> list[Any]:
    """The replies to one read holding commands, as the server runs it
    (serve_reads()), decoded: integers, bytes, lists, and rcp11.resp.Error
    for error replies."""
    import hiredis

    from rcp11.resp import Error, encode_command

    data = serve_reads(state, client, [b"".join(map(encode_command, commands))])
    reader = hiredis.Reader(replyError=Error)
    reader.feed(data)
    replies = []
    while (reply := reader.gets()) is not False:
        replies.append(reply)
    return replies
