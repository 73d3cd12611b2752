"""python -m bench.attacks [--quick]: what one hostile client costs the
others, rcp11 side by side with redis-server in one run (issue 8, items 3
and 5). Prints a table; nothing is written.

unread replies
    A writer fills `big` with 1000 messages of 40 bytes (a ~44 KB reply per
    read). The attacker pipelines N x `TREAD big 0 1000` (redis-server:
    `LRANGE big 0 999` over a list of the same elements) with a 4 KB
    receive buffer and never reads. Measured: the server's peak RSS growth
    (VmHWM minus VmRSS before the attack), whether the attacker was closed,
    and the worst PING latency another client saw meanwhile. With
    `client-output-buffer-limit normal 10mb 5mb 10` and with none.

pipelines that cannot use runs
    100k pipelined `TWRITE pk x` (redis-server: `RPUSH pk x`) with a reader
    blocked on another key, with maxmemory set, and inside MULTI: the time
    to the last reply and the worst PING latency of another client.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Callable

from bench.resp import encode_command
from bench.servers import Server, server_pool

LIMIT = "normal 10mb 5mb 10"


def hwm_bytes(srv: Server) -> int:
    with open(f"/proc/{srv.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM line")


class Pinger:
    """Another client: PING every 5 ms, remembering the slowest answer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.worst = 0.0
        self.count = 0
        self.failed = False
        self.stopped = False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopped:
            started = time.perf_counter()
            try:
                self.sock.sendall(b"PING\r\n")
                if self.sock.recv(64) != b"+PONG\r\n":
                    self.failed = True
            except OSError:
                self.failed = True
                return
            self.worst = max(self.worst, time.perf_counter() - started)
            self.count += 1
            time.sleep(0.005)

    def __enter__(self) -> Pinger:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped = True
        self.thread.join()
        self.sock.close()


def attacker_connected(srv: Server) -> bool:
    """Whether the server still lists a client whose last command was the
    attacker's (unread replies in the socket hide a close from the client)."""
    listing = srv.command(b"CLIENT", b"LIST")
    return b"cmd=tread" in listing or b"cmd=lrange" in listing


def unread_replies(srv: Server, requests: int, watch: float) -> dict[str, object]:
    if srv.kind == "rcp11":
        srv.call(b"TWRITE", b"big", b"ENTRIES", *[b"m" * 40] * 1000)
        request = encode_command(b"TREAD", b"big", 0, 1000)
    else:
        srv.call(b"RPUSH", b"big", *[b"m" * 40] * 1000)
        request = encode_command(b"LRANGE", b"big", 0, 999)
    before = srv.rss_bytes()
    attacker = socket.socket()
    attacker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    attacker.connect(("127.0.0.1", srv.port))
    attacker.settimeout(watch)
    with Pinger(srv.port) as pinger:
        try:
            attacker.sendall(request * requests)
        except OSError:
            pass  # closed by the server, or it stopped reading: both are answers
        deadline = time.monotonic() + watch
        while time.monotonic() < deadline and attacker_connected(srv):
            time.sleep(0.05)
    closed = not attacker_connected(srv)
    attacker.close()
    return {
        "peak RSS growth MB": round((hwm_bytes(srv) - before) / 2**20, 1),
        "attacker closed": closed,
        "worst PING ms": round(pinger.worst * 1000, 1),
        "pings": pinger.count,
    }


def pipelined_writes(srv: Server, n: int, condition: str) -> dict[str, object]:
    name = b"TWRITE" if srv.kind == "rcp11" else b"RPUSH"
    srv.call(name, b"pk", b"first")
    blocked = None
    if condition == "reader blocked elsewhere":
        blocked = socket.create_connection(("127.0.0.1", srv.port))
        if srv.kind == "rcp11":
            blocked.sendall(encode_command(b"TREAD", b"other", 0, 1, b"BLOCK", 0))
        else:
            blocked.sendall(encode_command(b"BLPOP", b"other", 0))
        while b"blocked_clients:1" not in srv.command(b"INFO", b"clients"):
            time.sleep(0.01)
    if condition == "maxmemory":
        srv.call(b"CONFIG", b"SET", b"maxmemory", b"1gb")
    body = encode_command(name, b"pk", b"x") * n
    lines = n
    if condition == "inside MULTI":
        body = encode_command(b"MULTI") + body + encode_command(b"EXEC")
        lines = 2 * n + 2  # +OK, n x +QUEUED, *n, n integers
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=120)
    with Pinger(srv.port) as pinger:
        started = time.perf_counter()
        sender = threading.Thread(target=sock.sendall, args=(body,), daemon=True)
        sender.start()
        seen = 0
        while seen < lines:
            seen += sock.recv(1 << 20).count(b"\n")
        elapsed = time.perf_counter() - started
    sock.close()
    if blocked is not None:
        blocked.close()
    srv.call(b"DEL", b"pk")
    srv.call(b"CONFIG", b"SET", b"maxmemory", b"0")
    return {
        "seconds": round(elapsed, 2),
        "commands/s": round(n / elapsed),
        "worst PING ms": round(pinger.worst * 1000, 1),
    }


def run_side_by_side(
    title: str, measure: Callable[[Server], dict[str, object]], **extra: str
) -> None:
    with server_pool() as pool:
        for kind in ("rcp11", "redis"):
            srv = pool.start(kind, **extra)
            print(f"{title:45s} {srv.label:6s} {measure(srv)}", flush=True)
            pool.stop(srv)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.attacks")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    args = parser.parse_args()
    requests = 2000
    writes = 20_000 if args.quick else 100_000
    watch = 3.0 if args.quick else 10.0
    run_side_by_side(
        f"unread replies x{requests}, limit {LIMIT}",
        lambda srv: unread_replies(srv, requests, watch),
        client_output_buffer_limit=LIMIT,
    )
    run_side_by_side(
        f"unread replies x{requests}, no limit",
        lambda srv: unread_replies(srv, requests, watch),
    )
    for condition in ("reader blocked elsewhere", "maxmemory", "inside MULTI"):
        run_side_by_side(
            f"{writes} pipelined writes, {condition}",
            lambda srv, condition=condition: pipelined_writes(srv, writes, condition),
        )


if __name__ == "__main__":
    main()
