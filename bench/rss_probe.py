"""One memory case of bench/core_bench.py, run in a fresh process.

    python bench/rss_probe.py '{"messages": 2000000, "streams": 10, "per_call": 1,
                                "min_size": 100, "max_size": 100}'

Appends `messages` messages (sizes uniform in min_size..max_size, random
bytes) to `streams` streams picked at random, `per_call` messages per call,
and prints one JSON line: RSS growth (VmRSS of this process), the core's
own accounting (sum of memory_bytes), then RSS above the start after
evicting everything, and after glibc's malloc_trim(0) with its duration.
Runs as a script (not `-m`) so that a build of rcp11 on PYTHONPATH is the
one measured: that is how the before/after figures were taken.

    python bench/rss_probe.py --server quick    (or full, smoke)

runs only the memory row of the Redis suite (bench/redis_suite.py: RSS
growth of a fresh rcp11-server over the growth of INFO streams'
stream_memory_bytes, beside redis-server) and prints its table and figures.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import random
import sys
import time

from rcp11.storage import Stream


def rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(case: dict[str, int]) -> dict[str, float]:
    n, streams, per_call = case["messages"], case["streams"], case["per_call"]
    rng = random.Random(3)
    pool = rng.randbytes(1 << 16)
    sizes = [rng.randint(case["min_size"], case["max_size"]) for _ in range(4096)]
    batches = [
        [pool[k * 7 : k * 7 + sizes[(k + j) % 4096]] for j in range(per_call)] for k in range(64)
    ]
    order = [rng.randrange(streams) for _ in range(n // per_call)]
    # Builds before the time index had no now_ms; the figures compare builds.
    kw = {"now_ms": 0} if "now_ms" in inspect.signature(Stream.append).parameters else {}
    base = rss()
    ss = [Stream() for _ in range(streams)]
    started = time.perf_counter()
    for i, k in enumerate(order):
        ss[k].append(batches[i & 63], **kw)
    seconds = time.perf_counter() - started
    grown = rss() - base
    memory = sum(s.memory_bytes for s in ss)
    payload = sum(s.payload_bytes for s in ss)
    for s in ss:
        s.evict_keep(0)
    after_evict = rss() - base
    libc = ctypes.CDLL("libc.so.6")
    started = time.perf_counter()
    libc.malloc_trim(0)
    trim_ms = (time.perf_counter() - started) * 1e3
    return {
        "rss": grown,
        "memory": memory,
        "payload": payload,
        "messages": len(order) * per_call,
        "after_evict": after_evict,
        "after_trim": rss() - base,
        "trim_ms": trim_ms,
        "seconds": seconds,
    }


def server_row(mode: str) -> None:
    """The Redis suite's memory row alone, without the noisy throughput rows."""
    import tempfile
    from pathlib import Path

    from bench.common import Context
    from bench.redis_suite import _memory
    from bench.report import SuiteReport
    from bench.servers import server_pool

    report = SuiteReport("memory", "memory row")
    with server_pool() as pool, tempfile.TemporaryDirectory() as plots:
        _memory(Context(mode, pool, Path(plots)), report, lambda m: print(m, file=sys.stderr))
    for table in report.tables:
        print(table.markdown())
    print(json.dumps({"data": report.data, "errors": report.errors}))


if __name__ == "__main__":
    if sys.argv[1] == "--server":
        sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        server_row(sys.argv[2] if len(sys.argv) > 2 else "quick")
    else:
        print(json.dumps(main(json.loads(sys.argv[1]))))
