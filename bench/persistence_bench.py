"""Persistence benchmark: rcp11 next to redis-server 7.

    python -m bench.persistence_bench [--quick] [--size-gb 2] [--out bench/results/persistence.md]

Measures, for both servers:

1. Write throughput with appendonly no / appendfsync no / everysec / always,
   as a ratio to appendonly no (rcp11 TWRITE, Redis XADD; 100-byte messages,
   4 connections pipelining 64 commands each).
2. SAVE and load time of one large stream (2 GB of message payload in the
   full run) in GB/s of payload, against Redis SAVE and restart of an
   equivalent Redis stream (one 1 KB field per entry).
3. The longest event-loop stall during BGSAVE and BGREWRITEAOF of that
   stream: a client pings every millisecond and records its worst latency
   (and the worst without any background job, as a baseline).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import hiredis

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def encode(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


class Conn:
    """A minimal blocking RESP connection (no client library in the way)."""

    def __init__(self, port: int, timeout: float = 600.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def replies(self, count: int) -> list[object]:
        out: list[object] = []
        while len(out) < count:
            reply = self.reader.gets()
            if reply is False:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("server closed the connection")
                self.reader.feed(chunk)
                continue
            out.append(reply)
        return out

    def call(self, *args: bytes | str | int) -> object:
        self.send(encode(*args))
        reply = self.replies(1)[0]
        if isinstance(reply, hiredis.ReplyError):
            raise RuntimeError(str(reply))
        return reply

    def close(self) -> None:
        self.sock.close()


@dataclass
class Server:
    kind: str  # "rcp11" | "redis"
    directory: Path
    directives: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    def argv(self) -> list[str]:
        if self.kind == "rcp11":
            args = [sys.executable, "-m", "rcp11", "server"]
        else:
            args = ["redis-server"]
        args += ["--port", str(self.port), "--dir", str(self.directory)]
        args += ["--logfile", str(self.log)]
        for name, value in self.directives.items():
            args += [f"--{name}", value]
        return args

    def start(self, timeout: float = 600.0) -> float:
        """Start and wait until it answers PING; returns the seconds taken."""
        self.directory.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.log.read_text()[-2000:]}")
            try:
                conn = Conn(self.port, timeout=2)
                try:
                    if conn.call("PING") in (b"PONG", "PONG"):
                        return time.monotonic() - started
                except RuntimeError:
                    pass  # -LOADING
                finally:
                    conn.close()
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"{self.kind} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def loaded_seconds(self) -> float | None:
        """Load time as the server logged it (rcp11 and Redis both say
        'DB loaded from disk: ... seconds')."""
        text = self.log.read_text(errors="replace")
        found = re.findall(r"DB loaded from disk:.*?([0-9.]+) seconds", text)
        return float(found[-1]) if found else None


# ---------------------------------------------------------------------------
# 1. write throughput
# ---------------------------------------------------------------------------


def write_command(kind: str, key: str, payload: bytes) -> bytes:
    if kind == "rcp11":
        return encode("TWRITE", key, payload)
    return encode("XADD", key, "*", "d", payload)


def _writer(port: int, command: bytes, depth: int, deadline: float, counts: list[int]) -> None:
    conn = Conn(port)
    batch = command * depth
    done = 0
    try:
        while time.monotonic() < deadline:
            conn.send(batch)
            conn.replies(depth)
            done += depth
    finally:
        counts.append(done)
        conn.close()


def throughput(server: Server, seconds: float, connections: int = 4, depth: int = 64) -> float:
    payload = b"m" * 100
    threads = []
    counts: list[int] = []
    start = time.monotonic()
    deadline = start + seconds
    for index in range(connections):
        command = write_command(server.kind, f"bench:{index}", payload)
        thread = threading.Thread(
            target=_writer, args=(server.port, command, depth, deadline, counts)
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - start)


MODES = [
    ("appendonly no", {"appendonly": "no"}),
    ("appendfsync no", {"appendonly": "yes", "appendfsync": "no"}),
    ("appendfsync everysec", {"appendonly": "yes", "appendfsync": "everysec"}),
    ("appendfsync always", {"appendonly": "yes", "appendfsync": "always"}),
]


def bench_throughput(root: Path, seconds: float, repeat: int, log) -> dict[str, dict[str, float]]:
    """Median of `repeat` runs per server and mode, the runs interleaved so
    that a noisy neighbour hurts every mode alike."""
    samples: dict[str, dict[str, list[float]]] = {
        kind: {label: [] for label, _ in MODES} for kind in ("rcp11", "redis")
    }
    for round_index in range(repeat):
        for kind in ("rcp11", "redis"):
            for label, directives in MODES:
                directory = root / f"tp-{kind}-{label.replace(' ', '-')}"
                srv = Server(kind, directory, {"save": "", **directives})
                srv.start()
                try:
                    rate = throughput(srv, seconds)
                finally:
                    srv.kill()
                    shutil.rmtree(directory, ignore_errors=True)
                samples[kind][label].append(rate)
                log(f"  [{round_index + 1}/{repeat}] {kind:5} {label:22} {rate:12,.0f} writes/s")
    return {
        kind: {label: statistics.median(rates) for label, rates in by_mode.items()}
        for kind, by_mode in samples.items()
    }


# ---------------------------------------------------------------------------
# 2. SAVE / load of a big stream, 3. stalls
# ---------------------------------------------------------------------------

MESSAGE = 1024
PER_COMMAND = 1000


def fill_big_stream(server: Server, payload_bytes: int) -> int:
    """Write payload_bytes of 1 KB messages into one stream; returns the
    message count."""
    blob = os.urandom(MESSAGE * PER_COMMAND)
    messages = [blob[i * MESSAGE : (i + 1) * MESSAGE] for i in range(PER_COMMAND)]
    if server.kind == "rcp11":
        commands = [encode("TWRITE", "big", "ENTRIES", *messages)]
        per_send = PER_COMMAND
    else:
        commands = [encode("XADD", "big", "*", "d", m) for m in messages]
        per_send = 1
    total = payload_bytes // MESSAGE
    conn = Conn(server.port)
    chunk = b"".join(commands)
    replies = len(commands)
    written = 0
    try:
        while written < total:
            conn.send(chunk)
            for reply in conn.replies(replies):
                if isinstance(reply, hiredis.ReplyError):
                    raise RuntimeError(str(reply))
            written += PER_COMMAND if per_send == PER_COMMAND else replies
    finally:
        conn.close()
    return written


class Pinger:
    """PING every millisecond from a thread; remembers the worst latency."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.worst = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn = Conn(self.port)
        ping = encode("PING")
        try:
            while not self._stop.is_set():
                sent = time.perf_counter()
                conn.send(ping)
                conn.replies(1)
                self.worst = max(self.worst, time.perf_counter() - sent)
                self.samples += 1
                time.sleep(0.001)
        finally:
            conn.close()


def wait_idle(conn: Conn, field_name: str) -> None:
    while True:
        info = conn.call("INFO", "persistence")
        text = info.decode() if isinstance(info, bytes) else str(info)
        if re.search(rf"^{field_name}:0", text, re.M):
            return
        time.sleep(0.05)


@dataclass
class BigResult:
    payload_gb: float = 0.0
    file_gb: float = 0.0
    save_s: float = 0.0
    load_s: float = 0.0
    restart_s: float = 0.0
    baseline_stall_ms: float = 0.0
    bgsave_stall_ms: float = 0.0
    bgsave_s: float = 0.0
    rewrite_stall_ms: float = 0.0
    rewrite_s: float = 0.0
    fork_ms: float = 0.0


def bench_big(kind: str, root: Path, payload_bytes: int, log) -> BigResult:
    directory = root / f"big-{kind}"
    directives = {"save": "", "appendonly": "no"}
    if kind == "redis":
        directives["rdbcompression"] = "no"  # rcp11 stores nodes as they sit in memory
    srv = Server(kind, directory, directives)
    srv.start()
    result = BigResult()
    try:
        count = fill_big_stream(srv, payload_bytes)
        result.payload_gb = count * MESSAGE / 1e9
        conn = Conn(srv.port)
        with Pinger(srv.port) as pinger:
            time.sleep(1.0)
        result.baseline_stall_ms = pinger.worst * 1000

        started = time.monotonic()
        conn.call("SAVE")
        result.save_s = time.monotonic() - started
        snapshot = directory / ("dump.rcp" if kind == "rcp11" else "dump.rdb")
        result.file_gb = snapshot.stat().st_size / 1e9
        log(f"  {kind:5} SAVE {result.payload_gb:.2f} GB payload in {result.save_s:.2f}s")

        with Pinger(srv.port) as pinger:
            started = time.monotonic()
            conn.call("BGSAVE")
            time.sleep(0.05)
            wait_idle(conn, "rdb_bgsave_in_progress")
            result.bgsave_s = time.monotonic() - started
        result.bgsave_stall_ms = pinger.worst * 1000
        info = conn.call("INFO", "all")
        found = re.search(rb"latest_fork_usec:(\d+)", info if isinstance(info, bytes) else b"")
        result.fork_ms = int(found.group(1)) / 1000 if found else float("nan")
        log(f"  {kind:5} BGSAVE {result.bgsave_s:.2f}s, worst ping {result.bgsave_stall_ms:.1f} ms")

        # The AOF: turning it on writes the first file in the background.
        conn.call("CONFIG", "SET", "appendonly", "yes")
        time.sleep(0.05)
        wait_idle(conn, "aof_rewrite_in_progress")
        with Pinger(srv.port) as pinger:
            started = time.monotonic()
            conn.call("BGREWRITEAOF")
            time.sleep(0.05)
            wait_idle(conn, "aof_rewrite_in_progress")
            result.rewrite_s = time.monotonic() - started
        result.rewrite_stall_ms = pinger.worst * 1000
        log(
            f"  {kind:5} BGREWRITEAOF {result.rewrite_s:.2f}s, worst ping {result.rewrite_stall_ms:.1f} ms"
        )
        conn.call("CONFIG", "SET", "appendonly", "no")
        conn.close()
        srv.kill()
        for name in os.listdir(directory):
            if name.startswith(("appendonly", "temp-")):
                path = directory / name
                shutil.rmtree(path) if path.is_dir() else path.unlink()

        os.sync()
        result.restart_s = srv.start()
        result.load_s = srv.loaded_seconds() or result.restart_s
        log(f"  {kind:5} load {result.load_s:.2f}s (restart until PING: {result.restart_s:.2f}s)")
    finally:
        srv.kill()
        shutil.rmtree(directory, ignore_errors=True)
    return result


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def render(
    args: argparse.Namespace,
    tp: dict[str, dict[str, float]],
    big: dict[str, BigResult],
    elapsed: float,
) -> str:
    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Persistence benchmark",
        "",
        f"`python -m bench.persistence_bench {' '.join(args.argv)}`".replace(" `", "`"),
        f"run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other work), "
        f"{redis_version.split(' sha')[0]}; load average at the end "
        f"{os.getloadavg()[0]:.1f}; took {elapsed:.0f}s.",
        "",
        "## Write throughput by persistence mode",
        "",
        "100-byte messages, 4 connections x 64 pipelined commands; rcp11 `TWRITE key msg`, "
        "Redis `XADD key * d msg`. Median of interleaved runs. "
        "Ratio = throughput / throughput with appendonly no.",
        "",
        "| mode | rcp11 writes/s | rcp11 ratio | Redis writes/s | Redis ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, _ in MODES:
        r = tp["rcp11"][label]
        d = tp["redis"][label]
        lines.append(
            f"| {label} | {r:,.0f} | {r / tp['rcp11']['appendonly no']:.2f} | "
            f"{d:,.0f} | {d / tp['redis']['appendonly no']:.2f} |"
        )
    lines += [
        "",
        "## Snapshot of one large stream",
        "",
        "One stream of 1 KB messages (rcp11: TWRITE 1000 entries per command; Redis: "
        "XADD with one 1 KB field, rdbcompression no). GB/s are of message payload. "
        "Load time is what each server logs as 'DB loaded from disk'.",
        "",
        "| | rcp11 | Redis |",
        "|---|---:|---:|",
    ]
    r, d = big["rcp11"], big["redis"]

    def row(name: str, a: str, b: str) -> None:
        lines.append(f"| {name} | {a} | {b} |")

    row("payload (GB)", f"{r.payload_gb:.2f}", f"{d.payload_gb:.2f}")
    row("snapshot file (GB)", f"{r.file_gb:.2f}", f"{d.file_gb:.2f}")
    row("SAVE (s)", f"{r.save_s:.2f}", f"{d.save_s:.2f}")
    row("SAVE (GB/s)", f"{r.payload_gb / r.save_s:.2f}", f"{d.payload_gb / d.save_s:.2f}")
    row("load (s)", f"{r.load_s:.2f}", f"{d.load_s:.2f}")
    row("load (GB/s)", f"{r.payload_gb / r.load_s:.2f}", f"{d.payload_gb / d.load_s:.2f}")
    row("restart until PING answers (s)", f"{r.restart_s:.2f}", f"{d.restart_s:.2f}")
    lines += [
        "",
        "## Event-loop stalls during background persistence",
        "",
        "A client sends PING every millisecond; the worst round trip while the job ran "
        "(fork included). Baseline: the worst over one idle second.",
        "",
        "| | rcp11 | Redis |",
        "|---|---:|---:|",
    ]
    row("baseline worst ping (ms)", f"{r.baseline_stall_ms:.1f}", f"{d.baseline_stall_ms:.1f}")
    row("BGSAVE duration (s)", f"{r.bgsave_s:.2f}", f"{d.bgsave_s:.2f}")
    row("fork for BGSAVE (ms, latest_fork_usec)", f"{r.fork_ms:.1f}", f"{d.fork_ms:.1f}")
    row("worst ping during BGSAVE (ms)", f"{r.bgsave_stall_ms:.1f}", f"{d.bgsave_stall_ms:.1f}")
    row("BGREWRITEAOF duration (s)", f"{r.rewrite_s:.2f}", f"{d.rewrite_s:.2f}")
    row(
        "worst ping during BGREWRITEAOF (ms)",
        f"{r.rewrite_stall_ms:.1f}",
        f"{d.rewrite_stall_ms:.1f}",
    )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.persistence_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, short runs (a smoke test)"
    )
    parser.add_argument(
        "--size-gb",
        type=float,
        default=None,
        help="payload of the large stream (default 2, quick 0.05)",
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="per throughput run (default 5, quick 1)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="throughput runs per mode, median kept (default 3, quick 1)",
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "persistence.md"))
    args = parser.parse_args(argv)
    # The command as the page shows it: the options that set the workload,
    # not --out (python -m bench passes a temporary file there).
    given = list(sys.argv[1:] if argv is None else argv)
    args.argv = [
        a
        for i, a in enumerate(given)
        if a != "--out" and not a.startswith("--out=") and (i == 0 or given[i - 1] != "--out")
    ]
    if shutil.which("redis-server") is None:
        parser.error("redis-server is not installed (apt-get install redis-server)")
    size_gb = args.size_gb if args.size_gb is not None else (0.05 if args.quick else 2.0)
    seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 5.0)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)

    def log(message: str) -> None:
        print(message, flush=True)

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="rcp11-persistence-bench-", dir=os.environ.get("TMPDIR")))
    try:
        log("write throughput:")
        tp = bench_throughput(root, seconds, repeat, log)
        big: dict[str, BigResult] = {}
        for kind in ("rcp11", "redis"):
            log(f"large stream ({size_gb} GB), {kind}:")
            big[kind] = bench_big(kind, root, int(size_gb * 1e9), log)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = render(args, tp, big, time.monotonic() - started)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    log(report)
    log(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
