"""Run Debian's `redis-benchmark` against a port and parse its CSV line.

The CPU the tool used (the growth of this process's reaped-children CPU
total across the run) is reported next to each figure, like the Python
generators' CPU.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

REDIS_BENCHMARK = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"


@dataclass
class BenchLine:
    rps: float
    p50_ms: float
    p99_ms: float
    wall: float
    loadgen_cpu: float
    # Filled in by callers that watch the server over the run.
    server_cpu_pct: float = 0.0
    server_wait_pct: float = 0.0  # runnable but waiting for a core
    server_us_per_request: float = 0.0
    server_kernel_us_per_request: float = 0.0
    server_syscalls_per_request: float = 0.0

    @property
    def loadgen_cpu_pct(self) -> float:
        return 100.0 * self.loadgen_cpu / self.wall if self.wall > 0 else 0.0


def redis_benchmark(
    port: int,
    command: list[str],
    requests: int,
    clients: int = 50,
    pipeline: int = 1,
    keyspace: int | None = None,
    timeout: float = 600.0,
) -> BenchLine:
    """One `redis-benchmark -c C -n N -P P --csv COMMAND...` run."""
    argv = [REDIS_BENCHMARK, "-h", "127.0.0.1", "-p", str(port)]
    argv += ["-c", str(clients), "-n", str(requests), "-P", str(pipeline), "--csv"]
    if keyspace is not None:
        argv += ["-r", str(keyspace)]
    argv += command
    cpu_before = children_cpu()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    wall = time.perf_counter() - start
    # communicate() reaped the child, so its CPU is now in the children
    # total; runs are sequential, so the delta is this run alone.
    cpu = children_cpu() - cpu_before
    if proc.returncode != 0:
        raise RuntimeError(f"redis-benchmark failed ({proc.returncode}): {err.decode()[-500:]}")
    rows = [r for r in csv.reader(io.StringIO(out.decode())) if r and r[0] != "test"]
    if not rows:
        raise RuntimeError("redis-benchmark printed no result: " + (out + err).decode()[-300:])
    row = rows[-1]
    return BenchLine(
        rps=float(row[1]),
        p50_ms=float(row[4]),
        p99_ms=float(row[6]),
        wall=wall,
        loadgen_cpu=cpu,
    )


def children_cpu() -> float:
    """CPU seconds of all reaped children of this process so far."""
    usage = os.times()
    return usage.children_user + usage.children_system
