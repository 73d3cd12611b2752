"""examples/spark_pipeline.py: its windowed counts are right (each
(window, action) once, as counted in plain Python), and with nothing on the
given port it starts a server of its own. The pipeline runs in this
module's SparkSession, as the command runs it in its own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import REPO, ServerProcess, free_port, local_spark

from rcp11.client import Client

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

EXAMPLE = REPO / "examples" / "spark_pipeline.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """local[2], as the example's own command runs it."""
    session = local_spark("rcp11-example-test", "local[2]")
    yield session
    session.stop()


@pytest.mark.slow
def test_pipeline_once_writes_each_window_count_once(
    example: ModuleType, spark: Any, shared_server: ServerProcess, tmp_path: Path
) -> None:
    client = Client(port=shared_server.port)
    client.flushall()
    events = 2000
    shown: list[str] = []
    checkpoint = str(tmp_path / "checkpoint")
    ok = example.run_pipeline(
        spark, shared_server.port, checkpoint, once=True, events=events, show=shown.append
    )
    assert ok

    written = [
        json.loads(m)
        for m in client.tread(example.Keys.for_checkpoint(checkpoint).counts, 0, 10_000)
    ]
    check_counts(example, events, written)
    assert [json.loads(line) for line in shown] == written  # what it showed is what it wrote
    client.close()


def check_counts(example: ModuleType, events: int, written: list[dict]) -> None:
    """Each (window, action) written once, with the count plain Python finds."""
    expected: Counter[tuple[str, str]] = Counter()
    for _, body in example.past_events(events)[:-1]:  # the last one only moves time on
        event = json.loads(body)
        start = event["ts"] // 10_000 * 10
        window = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        expected[(window, event["action"])] += 1
    got = Counter({(c["window"], c["action"]): c["count"] for c in written})
    assert len(written) == len(got)  # no window written twice
    assert got == expected
    assert sum(got.values()) == events


def test_a_server_of_its_own_when_nothing_answers(example: ModuleType) -> None:
    with example.server(free_port()) as port:
        client = Client(port=port)
        assert client.twrite("events:0", b"{}") == 0
        client.close()
    assert not example.answers(port)  # stopped again


def test_the_command_documents_itself() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "--once" in done.stdout and "--port" in done.stdout
