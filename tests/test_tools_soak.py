"""A short run of the soak (bench/soak.py): mixed load with kill -9 rounds
and a checker; `python -m bench.soak --duration 600` is the real run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(420)  # its child process's own timeout fires first
@pytest.mark.slow
def test_soak_smoke_run_loses_nothing_and_reuses_no_offset() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--duration", "20", "--kill-every", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    done = re.search(
        r"soak done: .* (\d+) acknowledged messages, (\d+) checked .* (\d+) handed to group "
        r"readers .* (\d+) kill -9 rounds: OK",
        proc.stdout,
    )
    assert done, proc.stdout[-3000:]
    acked, checked, group, kills = map(int, done.groups())
    assert acked > 1000 and checked > 1000 and group > 100 and kills >= 2, done.group(0)


@pytest.mark.timeout(420)  # its child process's own timeout fires first
@pytest.mark.slow
def test_soak_checker_catches_a_server_that_loses_acknowledged_writes() -> None:
    # Without the AOF a kill -9 loses the messages (they read as null: the
    # offsets file still keeps their offsets from being reused).
    proc = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--duration", "6", "--kill-every", "3"]
        + ["--appendonly", "no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    kept = re.search(r"soak: server files kept in (\S+)", proc.stdout)
    assert kept, proc.stdout[-3000:]
    shutil.rmtree(kept.group(1))  # kept for a person to look at; not here
    assert "None instead of seq" in proc.stdout, proc.stdout[-3000:]
