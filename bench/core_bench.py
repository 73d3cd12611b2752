"""Micro-benchmarks of the storage core (src/macronode.c through rcp11.storage).

    python -m bench.core_bench [--quick | --smoke] [--max-messages N] [--out PATH]

Measures, in-process and without a server: batch append throughput of
100-byte messages, random-offset TREAD-style reads (read_resp of 100
messages) at growing stream sizes, memory per message, eviction time, and
zlib compression of generated JSON log lines (ratio and read slowdown).
Prints a markdown report and writes it to bench/results/core.md (main only;
`run(mode)` is the entry point `python -m bench` calls and writes nothing).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rcp11.storage import Stream

RESULTS = Path(__file__).resolve().parent / "results" / "core.md"
MESSAGE_BYTES = 100
READ_COUNT = 100
# Bytes of RAM a stream of 100-byte messages needs per message, with margin
# for the reference buffers; used to skip sizes the machine cannot hold.
RAM_PER_MESSAGE = 110
TITLE = "Storage core (C macronode) micro-benchmarks"


@dataclass(frozen=True)
class Sizes:
    append_messages: int
    single_appends: int
    read_points: tuple[int, ...]
    read_samples: int
    log_lines: int


SIZES = {
    "full": Sizes(10_000_000, 300_000, (1_000_000, 10_000_000, 100_000_000), 20_000, 1_000_000),
    "quick": Sizes(2_000_000, 100_000, (1_000_000, 10_000_000), 5_000, 200_000),
    "smoke": Sizes(100_000, 10_000, (100_000,), 500, 20_000),
}


def log(message: str) -> None:
    print(f"[core_bench] {message}", file=sys.stderr, flush=True)


def available_ram() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def percentile(sorted_values: list[float], pct: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * pct / 100))]


def payload_block(messages: int, seed: int = 1) -> bytes:
    """Incompressible 100-byte messages back to back (random bytes)."""
    return (
        np.random.default_rng(seed).integers(0, 256, messages * MESSAGE_BYTES, np.uint8).tobytes()
    )


def fill(stream: Stream, total: int, block: bytes, per_call: int) -> float:
    """Append `total` 100-byte messages in batches of per_call; return seconds."""
    lens = np.full(per_call, MESSAGE_BYTES, dtype=np.uint32)
    view = memoryview(block)[: per_call * MESSAGE_BYTES]
    done = 0
    started = time.perf_counter()
    while done < total:
        n = min(per_call, total - done)
        stream.append_joined(view[: n * MESSAGE_BYTES], lens[:n])
        done += n
    return time.perf_counter() - started


def read_latencies(
    reader: Callable[[int, int], object], limit: int, samples: int, seed: int = 2
) -> list[float]:
    """Microseconds per call of reader(offset, READ_COUNT) at random offsets, sorted."""
    rng = random.Random(seed)
    offsets = [rng.randrange(max(1, limit - READ_COUNT)) for _ in range(samples)]
    return timed_reads(reader, offsets)


def timed_reads(reader: Callable[[int, int], object], offsets: list[int]) -> list[float]:
    """Microseconds per call of reader(offset, READ_COUNT) for each offset, sorted."""
    timings: list[float] = []
    clock = time.perf_counter_ns
    for offset in offsets:
        t0 = clock()
        reader(offset, READ_COUNT)
        timings.append((clock() - t0) / 1000)
    timings.sort()
    return timings


def log_lines(n: int, seed: int = 7) -> list[bytes]:
    """Generated JSON access-log lines: timestamps, levels, ids, paths, agents."""
    rng = random.Random(seed)
    levels = ["info"] * 8 + ["warn", "error"]
    methods = ["GET"] * 6 + ["POST", "PUT", "DELETE"]
    paths = ["/api/v1/items", "/api/v1/users", "/api/v2/orders", "/health", "/login", "/search"]
    agents = [
        "Mozilla/5.0 (X11; Linux x86_64)",
        "curl/8.4.0",
        "okhttp/4.12",
        "python-requests/2.31",
    ]
    statuses = [200] * 12 + [201, 204, 301, 400, 404, 500]
    ts = 1_763_700_000_000
    lines = []
    for _ in range(n):
        ts += rng.randrange(0, 40)
        record = (
            f'{{"ts":{ts},"level":"{rng.choice(levels)}","method":"{rng.choice(methods)}",'
            f'"path":"{rng.choice(paths)}/{rng.randrange(100_000)}",'
            f'"status":{rng.choice(statuses)},"ms":{rng.expovariate(1 / 40):.1f},'
            f'"user":"u{rng.randrange(20_000):05d}","ip":"10.{rng.randrange(256)}.'
            f'{rng.randrange(256)}.{rng.randrange(256)}","agent":"{rng.choice(agents)}",'
            f'"req":"{rng.getrandbits(64):016x}"}}'
        )
        lines.append(record.encode())
    return lines


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def bench_append(sizes: Sizes, block: bytes) -> str:
    rows = []
    for per_call in (1000, 100):
        s = Stream()
        seconds = fill(s, sizes.append_messages, block, per_call)
        n = sizes.append_messages
        rows.append(
            [
                f"append_joined, {per_call} msgs/call",
                f"{n:,}",
                f"{n / seconds / 1e6:.2f} M",
                f"{n * MESSAGE_BYTES / seconds / 1e9:.2f}",
            ]
        )
        del s
    messages = [block[i * MESSAGE_BYTES : (i + 1) * MESSAGE_BYTES] for i in range(100)]
    s = Stream()
    n = sizes.append_messages // 10
    started = time.perf_counter()
    for _ in range(n // 100):
        s.append(messages)
    seconds = time.perf_counter() - started
    rows.append(
        [
            "append(list of 100 bytes objects)",
            f"{n:,}",
            f"{n / seconds / 1e6:.2f} M",
            f"{n * MESSAGE_BYTES / seconds / 1e9:.2f}",
        ]
    )
    s = Stream()
    one = [messages[0]]
    n = sizes.single_appends
    started = time.perf_counter()
    for _ in range(n):
        s.append(one)
    seconds = time.perf_counter() - started
    rows.append(
        [
            "append([one message]) per call",
            f"{n:,}",
            f"{n / seconds / 1e6:.2f} M",
            f"{n * MESSAGE_BYTES / seconds / 1e9:.2f}",
        ]
    )
    return "### Append, 100-byte messages\n\n" + table(
        ["workload", "messages", "msgs/s", "GB/s"], rows
    )


def bench_reads(sizes: Sizes, block: bytes, max_messages: int) -> tuple[str, str]:
    rows = []
    evict_row: list[str] | None = None
    ram = available_ram()
    for total in sizes.read_points:
        if total > max_messages:
            log(f"skipping {total:,} messages (--max-messages {max_messages:,})")
            continue
        if total * RAM_PER_MESSAGE > ram * 0.8:
            log(f"skipping {total:,} messages: {ram / 1e9:.1f} GB available")
            continue
        log(f"filling {total:,} messages")
        s = Stream()
        fill_seconds = fill(s, total, block, 10_000)
        resp = read_latencies(lambda o, c, s=s: s.read_resp(o, c, False), total, sizes.read_samples)
        lists = read_latencies(s.read, total, sizes.read_samples // 4)
        rows.append(
            [
                f"{total:,}",
                f"{s.memory_bytes / 1e9:.2f}",
                f"{total / fill_seconds / 1e6:.2f} M",
                f"{percentile(resp, 50):.1f}",
                f"{percentile(resp, 99):.1f}",
                f"{percentile(lists, 50):.1f}",
                f"{percentile(lists, 99):.1f}",
            ]
        )
        evict = total // 2
        nodes = s.num_nodes
        started = time.perf_counter()
        evicted = s.evict_upto(evict - 1)
        seconds = time.perf_counter() - started
        assert evicted == evict
        evict_row = [
            f"{evict:,} of {total:,}",
            f"{nodes - s.num_nodes:,}",
            f"{seconds * 1e3:.1f}",
        ]
        del s
        gc.collect()
    reads = "### Random-offset reads of 100 messages (100-byte messages)\n\n" + table(
        [
            "messages",
            "memory GB",
            "fill msgs/s",
            "read_resp median us",
            "read_resp p99 us",
            "read() median us",
            "read() p99 us",
        ],
        rows,
    )
    evicts = "### Eviction (evict_upto the older half of the largest stream)\n\n" + (
        table(["evicted", "nodes freed", "ms"], [evict_row]) if evict_row else "(not run)"
    )
    return reads, evicts


def bench_memory(block: bytes) -> str:
    rows = []
    for n in (1, 10, 1000, 100_000):
        s = Stream()
        fill(s, n, block, 1)
        label = f"{n:,} messages, appended one by one"
        rows.append([label, f"{s.num_nodes}", f"{s.memory_bytes / n:.2f}"])
    s = Stream()
    fill(s, 1_000_000, block, 10_000)
    rows.append(["1,000,000 messages, full nodes", f"{s.num_nodes}", f"{s.memory_bytes / 1e6:.2f}"])
    return "### Memory per 100-byte message (memory_bytes / messages, C allocations)\n\n" + table(
        ["stream", "nodes", "bytes/message"], rows
    )


def bench_compression(sizes: Sizes) -> str:
    lines = log_lines(sizes.log_lines)
    data = b"".join(lines)
    lens = np.fromiter(map(len, lines), dtype=np.uint32, count=len(lines))
    ends = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
    n = len(lines)
    rows = []
    base: dict[str, float] = {}
    for level in (0, 1, 6, 9):
        s = Stream(compression_level=level)
        started = time.perf_counter()
        for i in range(0, n, 1000):
            j = min(i + 1000, n)
            s.append_joined(data[int(ends[i]) : int(ends[j])], lens[i:j])
        append_seconds = time.perf_counter() - started
        memory = s.memory_bytes
        random_reads = read_latencies(
            lambda o, c, s=s: s.read_resp(o, c, False), n, sizes.read_samples
        )
        in_order = timed_reads(
            lambda o, c, s=s: s.read_resp(o, c, False), list(range(0, n - READ_COUNT, READ_COUNT))
        )
        # In order, only some reads inflate a chunk: the mean is the cost per
        # read; the slowest 1% is dropped as scheduler noise on a busy host.
        kept = in_order[: max(1, len(in_order) * 99 // 100)]
        sequential = sum(kept) / len(kept)
        median = percentile(random_reads, 50)
        if level == 0:
            base = {"memory": memory, "random": median, "sequential": sequential}
        rows.append(
            [
                "off" if level == 0 else f"zlib {level}",
                f"{memory / n:.1f}",
                f"{base['memory'] / memory:.2f}x",
                f"{n / append_seconds / 1e6:.2f} M",
                f"{median:.1f} ({median / base['random']:.1f}x)",
                f"{sequential:.1f} ({sequential / base['sequential']:.1f}x)",
                f"{s.num_compressed_nodes}/{s.num_nodes}",
            ]
        )
    avg = len(data) / n
    return (
        f"### zlib on generated JSON log lines ({n:,} lines, {avg:.0f} bytes average)\n\n"
        + table(
            [
                "compression",
                "bytes/message",
                "ratio",
                "append msgs/s",
                "random read_resp(100) median us",
                "in-order read_resp(100) mean us",
                "compressed nodes",
            ],
            rows,
        )
        + "\n\nA compressed node is zlib chunks of >= 16 KB; a random read of 100 "
        "messages inflates the two or three chunks it touches (the 8-chunk cache rarely "
        "hits), a consumer reading in order inflates each chunk once. Ratio is raw "
        "memory / compressed memory, offset tables and the raw active node included."
    )


def environment(mode: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()
    return (
        f"Mode `{mode}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load[0]:.1f} at start. Single process, no server: "
        "the cost of the C core plus its cffi binding. Appending to a new stream "
        "writes memory the process touches for the first time; on this machine that "
        f"alone runs at {first_touch_gbps():.2f} GB/s (page faults), the ceiling "
        "for the append rows."
    )


def first_touch_gbps(size: int = 256 << 20) -> float:
    """Write speed into freshly mapped memory (page-fault bound)."""
    started = time.perf_counter()
    fresh = np.empty(size, dtype=np.uint8)
    fresh.fill(1)
    seconds = time.perf_counter() - started
    del fresh
    return size / seconds / 1e9


def run(mode: str = "full", max_messages: int | None = None) -> str:
    """The whole report as markdown (the entry point `python -m bench` uses)."""
    sizes = SIZES[mode]
    limit = max_messages if max_messages is not None else max(sizes.read_points)
    header = environment(mode)
    block = payload_block(10_000)
    log("append")
    sections = [bench_append(sizes, block)]
    log("reads")
    reads, evicts = bench_reads(sizes, block, limit)
    sections += [reads, evicts]
    log("memory")
    sections.append(bench_memory(block))
    log("compression")
    sections.append(bench_compression(sizes))
    return "## " + TITLE + "\n\n" + header + "\n\n" + "\n\n".join(sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core_bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes (about 2 minutes)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    parser.add_argument(
        "--max-messages",
        type=int,
        default=None,
        help="largest stream for the read/evict points (100M needs about 11 GB of RAM)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="markdown file to write")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    report = run(mode, args.max_messages)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
