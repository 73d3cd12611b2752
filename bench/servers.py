"""Start the servers under test on free ports, each in its own temp dir.

Every server started here is registered in one `ServerPool`; leaving the
pool's `with` block (normally, by an exception, or by SIGTERM/SIGINT turned
into an exception) kills them all, so a benchmark never leaves a process
behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process: rcp11 or the reference redis-server."""

    def __init__(self, kind: str, workdir: Path, extra: dict[str, str] | None = None) -> None:
        self.kind = kind
        self.dir = workdir
        self.port = free_port()
        self.extra = extra or {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def label(self) -> str:
        return "rcp11" if self.kind == "rcp11" else "redis"

    def argv(self) -> list[str]:
        directives = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "save": "",
            "appendonly": "no",
            "dir": str(self.dir),
            "logfile": str(self.dir / "server.log"),
        }
        directives.update(self.extra)
        if self.kind == "rcp11":
            args = [sys.executable, "-m", "rcp11", "server"]
        else:
            args = [REDIS_SERVER]
        for name, value in directives.items():
            args += [f"--{name}", value]
        return args

    def start(self, timeout: float = 30.0) -> Server:
        self.dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # `python -m rcp11` must find the checkout even when bench is run
        # from another directory without an editable install.
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            self.argv(),
            cwd=self.dir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr.log", "wb"),  # the child keeps it open
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited with {self.proc.returncode} at start:\n{self.log_tail()}"
                )
            try:
                if self.command(b"PING") == b"+PONG\r\n":
                    self.warm_up()
                    return self
            except OSError:
                pass  # not listening yet
            time.sleep(0.05)
        raise RuntimeError(
            f"{self.label} did not answer PING within {timeout}s:\n{self.log_tail()}"
        )

    def warm_up(self) -> None:
        """Run each command kind once, so that no measurement pays for a
        first call (lazy imports, first allocations) but no data stays."""
        if self.kind == "rcp11":
            commands = [(b"TWRITE", b"warm", b"ENTRIES", b"a", b"b"), (b"TREAD", b"warm", 0, 2)]
        else:
            commands = [(b"XADD", b"warm", b"*", b"f", b"a"), (b"RPUSH", b"warml", b"a")]
            commands.append((b"XRANGE", b"warm", b"-", b"+", b"COUNT", 1))
        for args in commands:
            self.call(*args)
        self.call(b"DEL", b"warm", b"warml")

    def log_tail(self, lines: int = 20) -> str:
        text = ""
        for name in ("server.log", "stderr.log"):
            path = self.dir / name
            if path.exists():
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def command(self, *args: bytes | str | int, timeout: float = 30.0) -> bytes:
        """One raw round trip on a fresh connection; returns the raw reply."""
        import hiredis

        from bench.resp import encode_command

        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(encode_command(*args))
            reader = hiredis.Reader()
            raw = b""
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError(f"{self.label} closed the connection")
                raw += chunk
                reader.feed(chunk)
                if reader.gets() is not False:
                    return raw

    def call(self, *args: bytes | str | int) -> object:
        """A round trip returning the parsed reply (errors as exceptions)."""
        import hiredis

        reader = hiredis.Reader()
        reader.feed(self.command(*args))
        reply = reader.gets()
        if isinstance(reply, hiredis.ReplyError):
            raise RuntimeError(f"{self.label}: {args[0]!r} failed: {reply}")
        return reply

    def info(self, section: str) -> dict[str, str]:
        """One INFO section as field -> value."""
        reply = self.call(b"INFO", section)
        assert isinstance(reply, bytes), reply
        lines = reply.decode().splitlines()
        return dict(line.split(":", 1) for line in lines if ":" in line and line[0] != "#")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_bytes(self) -> int:
        """Resident set size from /proc/PID/status (VmRSS)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS line")

    def syscalls(self) -> int:
        """Read- and write-family system calls of the whole process so far
        (syscr + syscw of /proc/PID/io: read, recv, write, send...)."""
        with open(f"/proc/{self.pid}/io") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["syscr"]) + int(fields["syscw"])

    def kernel_seconds(self) -> float:
        """Seconds all threads spent in the kernel so far (stime of
        /proc/PID/stat, in clock ticks: 10 ms, fine over runs of seconds).
        On loopback the sender's system calls also run the receiving side's
        TCP processing, so this is most of what moving the bytes costs."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # After "pid (comm)": state is field 3, utime 14 and stime 15.
        return int(fields[12]) / os.sysconf("SC_CLK_TCK")

    def sched_seconds(self) -> tuple[float, float]:
        """(seconds on a CPU by all threads, seconds the main thread was
        runnable but waiting for a CPU).

        From /proc/PID/task/*/schedstat, which counts in nanoseconds (the
        tick-based /proc/PID/stat is too coarse for short runs). The waiting
        time shows how much other processes on this shared machine delayed
        the server.
        """
        running = waiting = 0
        for task in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{task}/schedstat") as f:
                    fields = f.read().split()
            except FileNotFoundError:
                continue  # the thread ended meanwhile
            running += int(fields[0])
            if int(task) == self.pid:
                # The event loop's thread: its waits are the ones that delay replies.
                waiting = int(fields[1])
        return running / 1e9, waiting / 1e9

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ServerPool:
    """Owns every server of one benchmark run and their temp directories."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rcp11-bench-"))
        self.servers: list[Server] = []

    def start(self, kind: str, **extra: str) -> Server:
        name = f"{kind}{len(self.servers)}"
        srv = Server(kind, self.root / name, {k.replace("_", "-"): v for k, v in extra.items()})
        self.servers.append(srv)
        return srv.start()

    def stop(self, srv: Server) -> None:
        srv.stop()
        shutil.rmtree(srv.dir, ignore_errors=True)

    def close(self) -> None:
        for srv in self.servers:
            try:
                srv.stop()
            except Exception:  # keep killing the others
                if srv.proc is not None:
                    srv.proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _raise_on_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def server_pool() -> Iterator[ServerPool]:
    """A pool whose servers die with the benchmark, also on SIGTERM."""
    previous = signal.signal(signal.SIGTERM, _raise_on_signal)
    pool = ServerPool()
    try:
        yield pool
    finally:
        pool.close()
        signal.signal(signal.SIGTERM, previous)
