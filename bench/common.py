"""What every suite gets: the run mode, the server pool, and a progress line."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench.loadgen import Job, RunResult, run_jobs
from bench.servers import Server, ServerPool

MODES = ("full", "quick", "smoke")
T = TypeVar("T", int, float)
Log = Callable[[str], None]


@dataclass
class Context:
    mode: str
    pool: ServerPool
    plots_dir: Path
    started: float = field(default_factory=time.monotonic)

    def pick(self, full: T, quick: T, smoke: T) -> T:
        """The size for the current mode."""
        return {"full": full, "quick": quick, "smoke": smoke}[self.mode]

    def log(self, suite: str, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:6.1f}s] [{suite}] {message}", file=sys.stderr, flush=True)


@dataclass
class Measured:
    run: RunResult
    server_cpu_pct: float
    server_wait_pct: float

    @property
    def rate(self) -> float:
        return self.run.rate

    @property
    def per_cpu_second(self) -> float:
        """Rate per second of server CPU: what the server does with a whole
        core, independent of how much of one the shared machine gave it."""
        return self.run.rate * 100.0 / self.server_cpu_pct if self.server_cpu_pct else 0.0

    def cpu_note(self) -> str:
        """Generator CPU / server CPU (+ server time spent waiting for a core)."""
        note = f"gen {self.run.loadgen_cpu_pct:.0f}% / srv {self.server_cpu_pct:.0f}%"
        if self.server_wait_pct >= 5:
            note += f" (+{self.server_wait_pct:.0f}% queued)"
        return note


def measure(server: Server, jobs: list[Job]) -> Measured:
    """Run jobs against one server, recording its CPU over the same interval."""
    run_before, wait_before = server.sched_seconds()
    wall_start = time.perf_counter()
    result = run_jobs(jobs)
    wall = time.perf_counter() - wall_start
    run_after, wait_after = server.sched_seconds()
    if result.errors:
        raise RuntimeError("; ".join(result.errors))
    # The wall around run_jobs includes fork and connect; the server is idle
    # then, so its CPU over the generator's own interval is the better base.
    base = result.wall if result.wall > 0 else wall
    return Measured(
        result,
        100.0 * (run_after - run_before) / base,
        100.0 * (wait_after - wait_before) / base,
    )
