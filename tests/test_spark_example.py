"""examples/spark_pipeline.py runs with one command and its windowed
counts are right: each (window, action) once, as counted in plain Python."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO, ServerProcess

from rcp11.client import Client

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "spark_pipeline.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_once_writes_each_window_count_once(srv: ServerProcess, tmp_path: Path) -> None:
    client = Client(port=srv.port)
    client.flushall()
    events = 2000
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--port", str(srv.port), "--once"]
        + ["--events", str(events), "--checkpoint", str(tmp_path / "checkpoint")],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
    )
    assert done.returncode == 0, done.stderr[-3000:]

    expected: Counter[tuple[str, str]] = Counter()
    for _, body in load_example().past_events(events)[:-1]:  # the last one only moves time
        event = json.loads(body)
        start = event["ts"] // 10_000 * 10
        window = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        expected[(window, event["action"])] += 1
    written = [json.loads(m) for m in client.tread("counts", 0, 10_000)]
    got = Counter({(c["window"], c["action"]): c["count"] for c in written})
    assert len(written) == len(got)  # no window written twice
    assert got == expected
    assert sum(got.values()) == events
    # What the command printed is what it wrote.
    assert [
        json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")
    ] == written
    client.close()
