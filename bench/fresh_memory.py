"""What fresh memory costs a growing server, and a ballast that makes that
cost the same for every segment of the stored-data curve.

Why this exists. On a virtual machine whose balloon device does free page
reporting (virtio-balloon's VIRTIO_BALLOON_F_REPORTING, as on this machine),
the guest kernel tells the host about free blocks of 2^page_reporting_order
pages (2 MB) and the host drops their backing. A page of such a block costs
a host-side fault on its next first touch: measured here, ~8 us of kernel
time per 4 KB page instead of ~2 us for a page the host still backs. Free
memory in fragments smaller than a reported block, and memory freed too
recently to have been reported, is still backed; the buddy allocator hands
out the smallest free blocks first, so a process that grows from empty gets
"warm" pages for its first few GB (2.5-10 GB here within one hour, more as
memory fragments) and "cold" ones after. A server storing 100-byte
records takes ~26 page faults per 1000 records just for the new data, so the
switch costs it ~0.16 us per record, 15-25% of its throughput, at whatever
stored size the machine's fragmentation puts the switch: a step in the
throughput-versus-stored curve that says nothing about the server.

The ballast is a child process that takes fresh memory 128 MB at a time,
timing the kernel's work per page, until the pages it gets cost what
unbacked ones cost (measured against memory it has just freed and taken
back, which is backed for sure), and holds it while the curve runs. So every
fresh page of the server is a cold one, as for any server that has been
growing for a while, and the curve shows what stored data does to the
server, not where the machine's warm memory runs out. To keep the ballast
small it first asks the kernel to compact memory (when run as root), which
merges fragments into reportable blocks, and waits for the reporting to
settle. It is a no-op where the kernel does no free page reporting.
"""

from __future__ import annotations

import json
import mmap
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPORTING = Path("/sys/module/page_reporting/parameters")
COMPACT = Path("/proc/sys/vm/compact_memory")
PAGE = mmap.PAGESIZE
CHUNK = 128 << 20  # touched and timed at a time
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MIN_KERNEL_SECONDS = 0.1  # 10 ticks: below that, the per-fault figure is noise
# A chunk is "cold" when its pages cost this many times a host-backed page
# (measured here: ~2 us warm, 6-9 us cold); the ballast stops after this
# many cold chunks in a row, i.e. once warm memory is used up, not at a
# stray slow chunk.
COLD_FACTOR = 2.0
COLD_CHUNKS_TO_STOP = 4


@dataclass
class FaultCounters:
    """A process's page faults and CPU split by mode, from /proc/PID/stat."""

    minor_faults: int
    user_seconds: float
    kernel_seconds: float

    @classmethod
    def of(cls, pid: int) -> FaultCounters:
        with open(f"/proc/{pid}/stat") as f:
            # Fields after the command name, which may contain spaces.
            fields = f.read().rsplit(")", 1)[1].split()
        return cls(int(fields[7]), int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS)

    def since(self, before: FaultCounters) -> FaultCounters:
        return FaultCounters(
            self.minor_faults - before.minor_faults,
            self.user_seconds - before.user_seconds,
            self.kernel_seconds - before.kernel_seconds,
        )

    @property
    def us_per_fault(self) -> float | None:
        """Kernel time per fault in microseconds (all kernel time, so an
        upper bound; page faults dominate it for a server storing data).
        None when the kernel time is too short for /proc's 10 ms ticks."""
        if self.kernel_seconds < MIN_KERNEL_SECONDS or not self.minor_faults:
            return None
        return self.kernel_seconds * 1e6 / self.minor_faults


def reporting_order() -> int | None:
    """The order of the blocks the kernel reports to the host, or None when
    this kernel does no free page reporting."""
    try:
        return int((REPORTING / "page_reporting_order").read_text())
    except (OSError, ValueError):
        return None


def _reported_kib() -> int | None:
    try:
        return int((REPORTING / "reported_kib").read_text())
    except (OSError, ValueError):
        return None  # a kernel without this counter: nothing to wait for


def compact_free_memory() -> bool:
    """Ask the kernel to compact memory (root only; a fraction of a second
    here), so that free fragments merge into blocks that get reported: less
    warm memory for the ballast to hold. False when not allowed."""
    try:
        COMPACT.write_text("1")
    except OSError:
        return False
    return True


def wait_for_reporter(quiet_s: float = 4.0, timeout_s: float = 30.0) -> float:
    """Wait until the kernel has stopped reporting free blocks (memory freed
    just before, e.g. by the previous server, is still backed by the host
    until reported). Returns the seconds waited."""
    start = time.monotonic()
    last = _reported_kib()
    if last is None:
        return 0.0
    still_since = start
    while time.monotonic() - start < timeout_s:
        time.sleep(0.5)
        now = _reported_kib()
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet_s:
            break
    return time.monotonic() - start


@dataclass
class Ballast:
    """What the ballast holds and what touching it cost, chunk by chunk."""

    held_bytes: int = 0
    waited_s: float = 0.0
    warm_us: float = 0.0  # kernel us per fault re-touching just-freed memory
    us_per_fault: list[float] = field(default_factory=list)
    reached_cold: bool = False
    compacted: bool = False
    skipped: str = ""

    def describe(self) -> str:
        if self.skipped:
            return f"no ballast ({self.skipped})"
        costs = self.us_per_fault
        end = (
            "until fresh pages cost"
            if self.reached_cold
            else "up to its memory cap, and fresh pages still cost"
        )
        compacted = "memory was compacted, then " if self.compacted else ""
        return (
            f"before the first segment, {compacted}a ballast process took {self.held_bytes / 2**30:.1f} GiB "
            f"of host-backed free memory (first touch {costs[0]:.1f} us of kernel time per 4 KB "
            f"page) {end} {costs[-1]:.1f} us per page, and held it until the last segment"
        )


@contextmanager
def warm_memory_held(limit_bytes: int) -> Iterator[Ballast]:
    """Hold the machine's host-backed free memory (up to limit_bytes) for
    the duration of the block; see the module docstring."""
    if reporting_order() is None:
        yield Ballast(skipped="this kernel reports no free pages to a host")
        return
    compacted = compact_free_memory()
    waited = wait_for_reporter()
    # A child of its own: forked load generators must not copy its page
    # tables, and it dies with our end of the pipe however we exit.
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.fresh_memory", str(limit_bytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"ballast process exited with {proc.wait()}")
        report = json.loads(line)
        yield Ballast(
            report["held"],
            waited,
            report["warm_us"],
            report["us_per_fault"],
            report["cold"],
            compacted,
        )
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _touch(size: int) -> tuple[mmap.mmap, float]:
    """Fault in `size` fresh bytes; kernel microseconds per fault."""
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    before = resource.getrusage(resource.RUSAGE_SELF)
    for offset in range(0, size, PAGE):
        m[offset] = 1
    after = resource.getrusage(resource.RUSAGE_SELF)
    faults = max(after.ru_minflt - before.ru_minflt, 1)
    return m, round((after.ru_stime - before.ru_stime) * 1e6 / faults, 2)


def _hold(limit: int) -> None:
    """The ballast child: take fresh memory until it costs what memory the
    host no longer backs costs, report, hold it until stdin closes."""
    # Reference for a host-backed page: memory just freed and taken back at
    # once is still backed (free page reporting waits for whole free blocks).
    scratch, _ = _touch(CHUNK)
    scratch.close()
    scratch, warm_us = _touch(CHUNK)
    scratch.close()
    chunks, costs = [], []
    cold_in_a_row = 0
    while cold_in_a_row < COLD_CHUNKS_TO_STOP and (len(chunks) + 1) * CHUNK <= limit:
        m, cost = _touch(CHUNK)
        chunks.append(m)
        costs.append(cost)
        cold_in_a_row = cold_in_a_row + 1 if cost >= COLD_FACTOR * warm_us else 0
    report = {
        "held": len(chunks) * CHUNK,
        "warm_us": warm_us,
        "us_per_fault": costs,
        "cold": cold_in_a_row >= COLD_CHUNKS_TO_STOP,
    }
    print(json.dumps(report), flush=True)
    sys.stdin.read()  # EOF when the parent closes the pipe or dies


if __name__ == "__main__":
    _hold(int(sys.argv[1]))
