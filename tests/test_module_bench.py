"""The module's benchmark suite runs end to end (tiny sizes, no timing
assertions: figures belong to BENCHMARKS.md, not to tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)  # its child process's own timeout fires first
def test_module_suite_smoke_run_writes_every_table(tmp_path: Path) -> None:
    require("redis-server")
    require("redis-benchmark")
    page = tmp_path / "page.md"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--suite", "module", "--out", str(page)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    detail = f"stdout:\n{done.stdout}\nstderr (tail):\n{done.stderr[-4000:]}"
    assert done.returncode == 0, detail
    record = json.loads(page.with_suffix(".json").read_text())
    suite = record["suites"]["module"]
    assert not suite["errors"], detail
    text = page.read_text()
    for heading in (
        "## Suite: the rcp11 Redis module inside redis-server",
        "### Throughput inside one redis-server",
        "### Memory for 20,000 entries of 100 bytes",
        "### Persistence of 0.01 GB",
        "### Replication catch-up",
        "### Offset reservations and read-committed",
        "### Retention dropping 0.01 GB",
    ):
        assert heading in text, heading
    data = suite["data"]
    for key in ("write_p1", "write_p32", "batch_write", "read_xrange_p1", "read_lrange_p32"):
        assert data[key]["module"] > 0 and data[key]["redis"] > 0, key
    assert data["memory_module_stream"] > 100  # at least the payload itself
    assert data["bgsave_gb_s"] > 0 and data["load_gb_s"] > 0 and data["replication_gb_s"] > 0
    assert data["retention_drop_gb_s"] > 0 and data["retention_worst_ping_ms"] > 0
    for key in ("write_replica", "new_stream_replica", "visible_read_committed"):
        assert data[f"reservation_{key}_p50_ratio"] > 0, key
