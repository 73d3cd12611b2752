"""Retention and the time index: what they cost (docs/PROTOCOL.md section 6).

    python -m bench.retention_bench [--quick | --full | --smoke] [--out PATH]

1. Bytes per message the append times add (core level: every node keeps
   its first message's time and a delta per message, 0 to 8 bytes wide;
   counted from the nodes of a filled stream, against the memory the
   stream holds per message).
2. TSEEK's cost on a large stream (core level, Stream.seek_time, random
   times): 100M messages with --full, 10M by default, 1M with --quick.
3. The worst PING round trip of another client while retention drops a lot
   of data (10 GB with --full, 1 GB by default, 256 MB with --quick): an
   rcp11 server filled with 1 KB messages, then `CONFIG SET
   stream-retention-ms 1`; beside it, redis-server dropping the same bytes
   by active expiry (1 MB strings with a 1 ms TTL), Redis's own background
   way of letting old data go. Worst and p99.9 PING while the drop runs,
   against each server's idle worst; the ratio is rcp11 / redis.
4. Writes/s under `maxmemory-policy streams-oldest` with 10, 1,000 and
   100,000 streams (in process, through the command layer: TWRITEs of
   100 bytes to random streams of a server kept just over `maxmemory`, so
   a write in ~10 evicts the oldest node of all streams). What finding
   that node costs as the number of streams grows.

Prints a markdown report and writes it to bench/results/retention-<mode>.md
(not in git); `python -m bench` puts it on BENCHMARKS.md (default sizes).
"""

from __future__ import annotations

import argparse
import gc
import random
import socket
import sys
import threading
import time
from pathlib import Path

from bench.core_bench import available_ram, percentile, table, time_bytes
from bench.resp import encode_command
from bench.servers import Server, server_pool
from rcp11.storage import Stream

RESULTS = Path(__file__).resolve().parent / "results"
MESSAGE_BYTES = 100
DROP_MESSAGE_BYTES = 1024
REDIS_VALUE_BYTES = 1 << 20
T0 = 1_700_000_000_000

SIZES = {
    # (messages for the seek stream, bytes dropped by retention)
    "full": (100_000_000, 10 << 30),
    "default": (10_000_000, 1 << 30),
    "quick": (1_000_000, 256 << 20),
    "smoke": (100_000, 8 << 20),  # proves it runs (tests/test_bench_smoke.py)
}


def log(message: str) -> None:
    print(f"[retention] {message}", file=sys.stderr, flush=True)


# -- 1 and 2: the core ------------------------------------------------------


def bench_time_index(messages: int) -> str:
    if messages * 110 > available_ram() * 0.8:
        return f"(skipped: {messages:,} messages do not fit in RAM)"
    log(f"filling {messages:,} messages of {MESSAGE_BYTES} bytes")
    s = Stream()
    block = bytes(range(256)) * (MESSAGE_BYTES * 10_000 // 256 + 1)
    block = block[: MESSAGE_BYTES * 10_000]
    lens = [MESSAGE_BYTES] * 10_000
    # One ms per 10,000 messages: the times a busy producer gives.
    for i in range(messages // 10_000):
        s.append_joined(block, lens, now_ms=T0 + i)
    index_bytes = time_bytes(s)
    rng = random.Random(7)
    hi = T0 + messages // 10_000
    clock = time.perf_counter_ns
    seeks = []
    for _ in range(100_000):
        t = rng.randint(T0, hi)
        start = clock()
        s.seek_time(t)
        seeks.append((clock() - start) / 1000)
    seeks.sort()
    row = [
        f"{messages:,}",
        f"{s.num_nodes:,}",
        f"{s.memory_bytes / messages:.2f}",
        f"{index_bytes / messages:.3f}",
        f"{100 * index_bytes / s.memory_bytes:.2f} %",
        f"{percentile(seeks, 50):.2f}",
        f"{percentile(seeks, 99):.2f}",
        f"{seeks[-1]:.2f}",
    ]
    del s
    gc.collect()
    return table(
        [
            "messages",
            "nodes",
            "memory bytes / message",
            "time index bytes / message",
            "share of memory",
            "TSEEK median us",
            "p99 us",
            "max us",
        ],
        [row],
    )


# -- 3: PING while retention drops ---------------------------------------------


class Pinger(threading.Thread):
    """One client doing PING round trips back to back, recording each."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stop_at: float | None = None
        self.samples: list[float] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        ping = encode_command(b"PING")
        clock = time.perf_counter
        while not self.stopped.is_set():
            start = clock()
            self.sock.sendall(ping)
            got = b""
            while not got.endswith(b"\r\n"):
                got += self.sock.recv(64)
            self.samples.append((clock() - start) * 1e3)
        self.sock.close()

    def finish(self) -> list[float]:
        self.stopped.set()
        self.join(30)
        return sorted(self.samples)


def _pings_while(port: int, seconds: float) -> list[float]:
    pinger = Pinger(port)
    pinger.start()
    time.sleep(seconds)
    return pinger.finish()


def _fill_rcp11(srv: Server, total: int) -> None:
    batch = 1000
    message = b"m" * DROP_MESSAGE_BYTES
    args = [b"TWRITE", b"events", b"ENTRIES"] + [message] * batch
    wire = encode_command(*args)
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        for _ in range(max(1, total // (batch * DROP_MESSAGE_BYTES))):
            sock.sendall(wire)
            reply = b""
            while not reply.endswith(b"\r\n"):
                reply += sock.recv(64)


def _fill_redis(srv: Server, total: int) -> None:
    value = b"v" * REDIS_VALUE_BYTES
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        for i in range(max(1, total // REDIS_VALUE_BYTES)):
            sock.sendall(encode_command(b"SET", b"k%d" % i, value))
            reply = b""
            while not reply.endswith(b"\r\n"):
                reply += sock.recv(64)


def _int_field(srv: Server, section: str, name: str) -> int:
    text = srv.call(b"INFO", section)
    text = text.decode() if isinstance(text, bytes) else str(text)
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split(":", 1)[1])
    raise KeyError(name)


def _drop_latency(srv: Server, start_drop: object, done: object) -> tuple[list[float], float]:
    pinger = Pinger(srv.port)
    pinger.start()
    time.sleep(0.2)
    started = time.perf_counter()
    start_drop()  # type: ignore[operator]
    while not done():  # type: ignore[operator]
        time.sleep(0.01)
    seconds = time.perf_counter() - started
    return pinger.finish(), seconds


def bench_drop(total: int) -> str:
    rows = []
    worst: dict[str, float] = {}
    with server_pool() as pool:
        log(f"rcp11: filling {total / 2**20:,.0f} MB of {DROP_MESSAGE_BYTES}-byte messages")
        rcp11 = pool.start("rcp11")
        _fill_rcp11(rcp11, total)
        idle = _pings_while(rcp11.port, 1.0)
        pings, seconds = _drop_latency(
            rcp11,
            lambda: rcp11.call(b"CONFIG", b"SET", b"stream-retention-ms", b"1"),
            lambda: _int_field(rcp11, "streams", "stream_messages") == 0,
        )
        dropped = _int_field(rcp11, "streams", "retention_evicted_bytes")
        rows.append(_row("rcp11 retention", dropped, seconds, idle, pings))
        worst["rcp11"] = pings[-1]
        pool.stop(rcp11)

        log(f"redis: filling {total / 2**20:,.0f} MB of 1 MB strings")
        redis = pool.start("redis")
        _fill_redis(redis, total)
        idle = _pings_while(redis.port, 1.0)
        keys = total // REDIS_VALUE_BYTES

        def expire_all() -> None:
            with socket.create_connection(("127.0.0.1", redis.port)) as sock:
                for i in range(keys):
                    sock.sendall(encode_command(b"PEXPIRE", b"k%d" % i, b"1"))
                    sock.recv(64)

        pings, seconds = _drop_latency(
            redis, expire_all, lambda: redis.call(b"DBSIZE") in (0, b"0")
        )
        rows.append(_row("redis active expiry", keys * REDIS_VALUE_BYTES, seconds, idle, pings))
        worst["redis"] = pings[-1]
    report = table(
        [
            "server",
            "dropped MB",
            "drop s",
            "idle worst PING ms",
            "PINGs during drop",
            "p99.9 ms",
            "worst ms",
        ],
        rows,
    )
    ratio = worst["rcp11"] / worst["redis"] if worst["redis"] else float("nan")
    return report + f"\nWorst PING during the drop, rcp11 / redis: {ratio:.2f}\n"


# -- 4: streams-oldest with many streams -------------------------------------

OLDEST_STREAMS = {"full": (10, 1000, 100_000), "smoke": (10, 100)}
OLDEST_NODE_ENTRIES = 10
OLDEST_SECONDS = {"smoke": 0.3}  # per row; 2 s otherwise


def bench_streams_oldest(streams: int, seconds: float) -> tuple[int, float, int]:
    """(writes, seconds, nodes evicted) for TWRITEs under streams-oldest
    with `streams` streams of two full nodes each."""
    from rcp11.commands import execute
    from rcp11.config import Config
    from rcp11.retention import Retention
    from rcp11.state import ClientState, ServerState

    config = Config()
    config.set("stream-node-max-entries", str(OLDEST_NODE_ENTRIES))
    config.set("maxmemory-policy", "streams-oldest")
    state = ServerState(config)
    state.retention = Retention(state, lambda: None)
    client = ClientState(authenticated=True)
    payload = b"x" * MESSAGE_BYTES
    keys = [b"stream:%d" % i for i in range(streams)]
    for key in keys:
        execute(state, client, [b"TWRITE", key, b"ENTRIES"] + [payload] * 2 * OLDEST_NODE_ENTRIES)
    config.set("maxmemory", str(state.used_memory() - 1))
    rng = random.Random(1)
    writes = 0
    gc.collect()
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            reply = execute(state, client, [b"TWRITE", keys[rng.randrange(streams)], payload])
            assert isinstance(reply, int), reply
        writes += 50
        if time.perf_counter() >= deadline:
            break
    seconds = time.perf_counter() - start
    evicted = state.stats.retention_evicted_messages // OLDEST_NODE_ENTRIES
    return writes, seconds, evicted


def bench_oldest(mode: str) -> str:
    rows = []
    for streams in OLDEST_STREAMS.get(mode, OLDEST_STREAMS["full"]):
        log(f"streams-oldest with {streams:,} streams")
        writes, seconds, evicted = bench_streams_oldest(streams, OLDEST_SECONDS.get(mode, 2.0))
        rows.append(
            [
                f"{streams:,}",
                f"{writes:,}",
                f"{evicted:,}",
                f"{writes / seconds:,.0f}",
            ]
        )
    return table(["streams", "writes", "nodes evicted", "writes/s"], rows)


def _row(
    label: str, dropped: int, seconds: float, idle: list[float], pings: list[float]
) -> list[str]:
    return [
        label,
        f"{dropped / 2**20:,.0f}",
        f"{seconds:.2f}",
        f"{idle[-1]:.2f}",
        f"{len(pings):,}",
        f"{percentile(pings, 99.9):.2f}",
        f"{pings[-1]:.2f}",
    ]


# `python -m bench` (the BENCHMARKS.md page) runs this suite at the default
# sizes for its full run: --full here (100M messages, 10 GB dropped) is a
# longer record than the page's time budget allows.
PAGE_SIZES = {"full": "default", "quick": "quick", "smoke": "smoke"}


def run(mode: str) -> str:
    """The page's section: `mode` is python -m bench's (full, quick, smoke)."""
    return report(PAGE_SIZES[mode])


def report(mode: str) -> str:
    messages, drop = SIZES[mode]
    parts = [
        f"## Retention and the time index ({mode})\n",
        "### Time index size and TSEEK cost (core, 100-byte messages)\n",
        bench_time_index(messages),
        f"\n### Worst PING while retention drops {drop / 2**30:.2f} GB\n",
        bench_drop(drop),
        "\n### Writes/s under maxmemory-policy streams-oldest (in process)\n",
        bench_oldest(mode),
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention_bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="1M messages, drop 256 MB")
    size.add_argument("--full", action="store_true", help="100M messages, drop 10 GB")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check that it runs")
    parser.add_argument(
        "--oldest-only",
        action="store_true",
        help="only part 4: writes/s under streams-oldest with many streams",
    )
    parser.add_argument("--out", type=Path, default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full" if args.full else "smoke" if args.smoke else "default"
    if args.oldest_only:
        text = f"## Writes/s under maxmemory-policy streams-oldest ({mode})\n\n" + bench_oldest(
            mode
        )
    else:
        text = report(mode)
    print(text)
    suffix = "-oldest" if args.oldest_only else ""
    out = args.out or RESULTS / f"retention{suffix}-{mode}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
