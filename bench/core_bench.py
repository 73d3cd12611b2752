"""Micro-benchmarks of the storage core (src/macronode.c through rcp11.storage).

    python -m bench.core_bench [--quick | --smoke] [--max-messages N] [--out PATH]

Measures, in-process and without a server: batch append throughput of
100-byte messages, random-offset TREAD-style reads (read_resp of 100
messages) at growing stream sizes, seeks by time, memory per message,
eviction time, concatenation (TCONCAT) against copying, zlib compression of
realistic JSON events (bench/json_events.py) at compression depths 0, 4
and 16 (ratio and read cost near the tail), and resident memory against
the core's own accounting, each case in a fresh process.
Prints a markdown report and writes it to bench/results/core.md (main only;
`run(mode)` is the entry point `python -m bench` calls and writes nothing).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.json_events import events
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
    rss_messages: int  # per fresh-process memory case
    concat_messages: int


SIZES = {
    "full": Sizes(
        10_000_000,
        300_000,
        (1_000_000, 10_000_000, 100_000_000),
        20_000,
        1_000_000,
        10_000_000,
        5_000_000,
    ),
    "quick": Sizes(
        2_000_000, 100_000, (1_000_000, 10_000_000), 5_000, 200_000, 2_000_000, 1_000_000
    ),
    "smoke": Sizes(100_000, 10_000, (100_000,), 500, 20_000, 100_000, 50_000),
}
# A consumer "near the tail" reads within the newest this many messages
# (4 nodes of 1000): what compression depth 4 keeps raw.
NEAR_TAIL = 4_000


def log(message: str) -> None:
    print(f"[core_bench] {message}", file=sys.stderr, flush=True)


def time_bytes(s: Stream) -> int:
    """Bytes a stream spends on its messages' append times: each node's
    time deltas and its first message's time."""
    return sum(n.time_width * n.count + 8 for n in s.nodes())


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


# Appends in the benchmarks pass their own clock: call k happens at T0 + k ms.
T0 = 1_763_700_000_000


def fill(
    stream: Stream, total: int, block: bytes, per_call: int, ms_per_call: float = 1.0
) -> float:
    """Append `total` 100-byte messages in batches of per_call, call k at
    time T0 + k * ms_per_call; return seconds."""
    lens = np.full(per_call, MESSAGE_BYTES, dtype=np.uint32)
    view = memoryview(block)[: per_call * MESSAGE_BYTES]
    done = calls = 0
    started = time.perf_counter()
    while done < total:
        n = min(per_call, total - done)
        stream.append_joined(view[: n * MESSAGE_BYTES], lens[:n], T0 + int(calls * ms_per_call))
        done += n
        calls += 1
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
        seeks = seek_latencies(s, T0, T0 + total // 10_000, sizes.read_samples)
        rows.append(
            [
                f"{total:,}",
                f"{s.memory_bytes / 1e9:.2f}",
                f"{total / fill_seconds / 1e6:.2f} M",
                f"{percentile(resp, 50):.1f}",
                f"{percentile(resp, 99):.1f}",
                f"{percentile(lists, 50):.1f}",
                f"{percentile(lists, 99):.1f}",
                f"{percentile(seeks, 50):.2f} / {percentile(seeks, 99):.2f}",
            ]
        )
        index_bytes = time_bytes(s)
        evict = total // 2
        nodes = s.num_nodes
        started = time.perf_counter()
        evicted = s.evict_upto(evict - 1)
        seconds = time.perf_counter() - started
        assert evicted == evict
        # Retention by age over the rest, 64 nodes per call (a cron step).
        worst = 0.0
        calls = 0
        while True:
            started = time.perf_counter()
            ev = s.evict_older_than(T0 + total // 10_000, max_nodes=64)
            worst = max(worst, time.perf_counter() - started)
            calls += 1
            if not ev.more:
                break
        evict_row = [
            f"{evict:,} of {total:,}",
            f"{nodes - s.num_nodes:,}",
            f"{seconds * 1e3:.1f}",
            f"{calls:,} calls, worst {worst * 1e3:.2f} ms",
            f"{index_bytes / total:.3f}",
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
            "seek_time median / p99 us",
        ],
        rows,
    )
    evicts = "### Eviction and the time index (the largest stream)\n\n" + (
        table(
            [
                "evict_upto the older half",
                "nodes freed",
                "ms",
                "then evict_older_than the rest, 64 nodes per call",
                "time index bytes per message",
            ],
            [evict_row],
        )
        if evict_row
        else "(not run)"
    )
    return reads, evicts


def seek_latencies(s: Stream, lo_ms: int, hi_ms: int, samples: int) -> list[float]:
    """Microseconds per seek_time() at random times in [lo_ms, hi_ms], sorted."""
    rng = random.Random(3)
    times = [rng.randint(lo_ms, hi_ms) for _ in range(samples)]
    clock = time.perf_counter_ns
    out = []
    for t in times:
        t0 = clock()
        s.seek_time(t)
        out.append((clock() - t0) / 1000)
    out.sort()
    return out


# Append rates of the memory table's paced rows (messages per ms): how wide
# a node's time deltas get (1000 messages per node).
MEMORY_RATES = ((100.0, "100 per ms"), (0.01, "1 per 100 ms"))


def bench_memory(block: bytes) -> str:
    rows = []

    def row(label: str, s: Stream, n: int) -> None:
        rows.append(
            [label, f"{s.num_nodes}", f"{s.memory_bytes / n:.2f}", f"{time_bytes(s) / n:.3f}"]
        )

    for n in (1, 10, 1000, 100_000):
        s = Stream()
        fill(s, n, block, 1)
        row(f"{n:,} messages, appended one by one, 1 per ms", s, n)
    for rate, label in MEMORY_RATES:
        s = Stream()
        fill(s, 100_000, block, 1, 1 / rate)
        row(f"100,000 messages, appended one by one, {label}", s, 100_000)
    s = Stream()
    fill(s, 1_000_000, block, 10_000)
    row("1,000,000 messages, full nodes of one ms each", s, 1_000_000)
    return (
        "### Memory per 100-byte message (memory_bytes / messages, C allocations)\n\n"
        + table(["stream", "nodes", "bytes/message", "of which append times"], rows)
        + "\nAppend times: each node's first time (8 bytes) and a delta per message, as "
        "narrow as the node's time span allows (0 bytes within one ms, 1 up to 255 ms, "
        "2 up to 65.5 s, 4 up to 49.7 days).\n"
    )


# Fresh-process memory cases: (label, streams, messages per call, sizes).
RSS_CASES = [
    ("1 stream, batches of 100, 100 B", 1, 100, (100, 100)),
    ("10 streams, one message per call, 100 B", 10, 1, (100, 100)),
    ("300 streams, one message per call, 50..150 B", 300, 1, (50, 150)),
    ("1000 streams, one message per call, 100 B", 1000, 1, (100, 100)),
]


def bench_rss(sizes: Sizes) -> str:
    rows = []
    probe = Path(__file__).resolve().parent / "rss_probe.py"
    for label, streams, per_call, (lo, hi) in RSS_CASES:
        case = {
            "messages": sizes.rss_messages,
            "streams": streams,
            "per_call": per_call,
            "min_size": lo,
            "max_size": hi,
        }
        log(f"memory: {label}")
        out = subprocess.run(
            [sys.executable, str(probe), json.dumps(case)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout)
        n = r["messages"]
        rows.append(
            [
                label,
                f"{n:,}",
                f"{r['rss'] / n:.1f}",
                f"{r['memory'] / n:.1f}",
                f"{r['rss'] / r['memory']:.3f}",
                f"{r['after_evict'] / 1e6:.1f}",
                f"{r['after_trim'] / 1e6:.1f} ({r['trim_ms']:.1f} ms)",
            ]
        )
    return (
        "### Resident memory against the core's accounting (fresh process each)\n\n"
        + table(
            [
                "case",
                "messages",
                "RSS growth bytes/message",
                "memory_bytes/message",
                "RSS / memory_bytes",
                "RSS MB left after evicting all",
                "after malloc_trim(0)",
            ],
            rows,
        )
        + "\n\nglibc malloc, bench/rss_probe.py (one process per case). memory_bytes counts "
        "what the core asked malloc for, including the room reserved in active nodes "
        "(pages not yet touched are not resident, so RSS can be below it). glibc keeps "
        "freed node blobs (< 128 KB, below its mmap threshold) in the heap for reuse: RSS "
        "does not fall after an eviction until malloc_trim(0) hands the free pages back, "
        "at the cost shown."
    )


def bench_concat(sizes: Sizes, block: bytes) -> str:
    rows = []
    n = sizes.concat_messages
    for level in (0, 6):
        src = Stream(compression_level=level)
        fill(src, n, block, 1000)
        payload = src.read(src.first_offset, 0)  # warm the call
        copy_src = Stream(compression_level=level)
        fill(copy_src, n, block, 1000)
        dst = Stream(compression_level=level)
        dst.append([b"first"], T0)
        started = time.perf_counter()
        dst.concat(src)
        moved = time.perf_counter() - started
        # The same messages copied through append (what TCONCAT costs
        # through the Stream API: read and append again, in 1000s).
        dst2 = Stream(compression_level=level)
        dst2.append([b"first"], T0)
        started = time.perf_counter()
        for off in range(0, n, 1000):
            dst2.append(copy_src.read(off, 1000), T0)
        copied = time.perf_counter() - started
        assert dst.length == dst2.length == n + 1 and not payload
        rows.append(
            [
                "off" if level == 0 else f"zlib {level}",
                f"{n:,}",
                f"{moved * 1e3:.2f}",
                f"{copied * 1e3:.0f}",
                f"{copied / moved:.0f}x",
            ]
        )
    return "### Concatenation (TCONCAT's core): moving nodes vs copying messages\n\n" + table(
        ["compression", "messages", "concat ms", "read + append ms", "speedup"], rows
    )


def interleaved_reads(streams: list[Stream], offsets: list[int]) -> list[list[float]]:
    """Microseconds of read_resp(offset, READ_COUNT) per stream, sorted; for
    each offset every stream is read in turn."""
    clock = time.perf_counter_ns
    out: list[list[float]] = [[] for _ in streams]
    for offset in offsets:
        for k, s in enumerate(streams):
            t0 = clock()
            s.read_resp(offset, READ_COUNT, False)
            out[k].append((clock() - t0) / 1000)
    for timings in out:
        timings.sort()
    return out


# (zlib level, compression depth); level 0 is the uncompressed reference.
COMPRESSION_CASES = [(0, 0), (1, 0), (6, 0), (6, 4), (6, 16), (9, 0)]


def bench_compression(sizes: Sizes) -> str:
    lines = events(sizes.log_lines)
    data = b"".join(lines)
    lens = np.fromiter(map(len, lines), dtype=np.uint32, count=len(lines))
    ends = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
    n = len(lines)
    rng = random.Random(4)
    near_tail = [rng.randrange(n - NEAR_TAIL, n - READ_COUNT) for _ in range(sizes.read_samples)]
    anywhere_offsets = [rng.randrange(n - READ_COUNT) for _ in range(sizes.read_samples)]
    streams = []
    for level, depth in COMPRESSION_CASES:
        s = Stream(compression_level=level, compression_depth=depth)
        started = time.perf_counter()
        for i in range(0, n, 1000):
            j = min(i + 1000, n)
            s.append_joined(data[int(ends[i]) : int(ends[j])], lens[i:j], T0 + i)
        streams.append((s, time.perf_counter() - started, s.memory_bytes))
        assert not s.compress_pending
    # Reads are timed case after case for each offset, so that the machine's
    # other load weighs on every case alike: the ratios are what counts.
    only = [s for s, _, _ in streams]
    tails = interleaved_reads(only, near_tail)
    anywheres = interleaved_reads(only, anywhere_offsets)
    in_orders = interleaved_reads(only, list(range(0, n - READ_COUNT, READ_COUNT)))
    rows = []
    base: dict[str, float] = {}
    for (level, depth), (s, append_seconds, memory), tail_t, any_t, order_t in zip(
        COMPRESSION_CASES, streams, tails, anywheres, in_orders, strict=True
    ):
        tail = percentile(tail_t, 50)
        anywhere = percentile(any_t, 50)
        # In order, only some reads inflate a chunk: the mean is the cost per
        # read; the slowest 1% is dropped as scheduler noise on a busy host.
        kept = order_t[: max(1, len(order_t) * 99 // 100)]
        sequential = sum(kept) / len(kept)
        if level == 0:
            base = {"memory": memory, "tail": tail, "random": anywhere, "sequential": sequential}
        rows.append(
            [
                "off" if level == 0 else f"zlib {level}, depth {depth}",
                f"{memory / n:.1f}",
                f"{base['memory'] / memory:.2f}x",
                f"{n / append_seconds / 1e6:.2f} M",
                f"{tail:.1f} ({tail / base['tail']:.2f}x)",
                f"{anywhere:.1f} ({anywhere / base['random']:.1f}x)",
                f"{sequential:.1f} ({sequential / base['sequential']:.1f}x)",
                f"{s.num_compressed_nodes}/{s.num_nodes}",
            ]
        )
    avg = len(data) / n
    return (
        f"### zlib on realistic JSON events ({n:,} events of bench/json_events.py, "
        f"{avg:.0f} bytes average, nodes of 1000)\n\n"
        + table(
            [
                "compression",
                "bytes/message",
                "ratio",
                "append msgs/s",
                f"read_resp(100) near the tail (newest {NEAR_TAIL:,}) median us",
                "random read_resp(100) median us",
                "in-order read_resp(100) mean us",
                "compressed nodes",
            ],
            rows,
        )
        + "\n\nDepth N keeps the newest N sealed nodes raw (like list-compress-depth), so a "
        "consumer near the tail reads raw nodes; a compressed node is zlib chunks of >= 16 "
        "KB, and a random read of 100 messages inflates the two or three chunks it touches "
        "(the 8-chunk cache rarely hits), a consumer reading in order inflates each chunk "
        "once. Ratio is raw memory / compressed memory, offset and time tables and the raw "
        "nodes included."
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
    log("concat")
    sections.append(bench_concat(sizes, block))
    log("compression")
    sections.append(bench_compression(sizes))
    log("resident memory")
    sections.append(bench_rss(sizes))
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
