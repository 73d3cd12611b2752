"""examples/spark_pipeline.py: its windowed counts are right (each
(window, action) once, as counted in plain Python), and with nothing on the
given port it starts a server of its own. The pipeline runs in this
module's SparkSession, as the command runs it in its own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import REPO, ServerProcess, free_port, require

from rcp11.client import Client

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

EXAMPLE = REPO / "examples" / "spark_pipeline.py"
CLUSTER_EXAMPLE = REPO / "examples" / "cluster" / "run_cluster.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from rcp11.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.Builder()  # not .builder: its options outlive sessions
        .master("local[2]")
        .appName("rcp11-example-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("OFF")
    register(session)
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


@pytest.mark.timeout(900)  # its child process's own timeout fires first
@pytest.mark.slow
def test_the_cluster_example_runs_the_pipeline_on_a_redis_cluster(
    example: ModuleType, tmp_path: Path
) -> None:
    """examples/cluster/run_cluster.py: a cluster of module nodes (3
    primaries, 3 replicas) started from nothing, the pipeline run on it with
    --once, the right counts shown, every node stopped afterwards."""
    require("redis-server")
    require("redis-cli")
    done = subprocess.run(
        [sys.executable, str(CLUSTER_EXAMPLE), "--dir", str(tmp_path / "nodes")]
        + ["--", "--once", "--events", "2000"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cluster of 3 primaries up on ports" in done.stdout
    written = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    check_counts(example, 2000, written)
    ports = [int(p.name) for p in (tmp_path / "nodes").iterdir()]
    assert len(ports) == 6
    # The event streams were written on more than one primary (and its
    # replica): their AOFs name them. The nodes are gone afterwards.
    holders = [p for p in ports if b"events:" in aof_bytes(tmp_path / "nodes" / str(p))]
    assert len(holders) >= 4
    assert not any(example.answers(p) for p in ports)


@pytest.mark.slow
def test_once_again_on_the_same_server_counts_each_run_alone_and_leaves_nothing(
    example: ModuleType, shared_server: ServerProcess, tmp_path: Path
) -> None:
    """`spark_pipeline.py --once` run twice, as a user would, against one
    server that stays up: each run shows its own counts (no double counts
    from the earlier run's events), then removes its keys and the
    directories it made."""
    client = Client(port=shared_server.port)
    client.flushall()
    client.twrite("events:0", b"{not an example event}")  # a user's own stream stays
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--port", str(shared_server.port), "--once"]
            + ["--events", "1000"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "TMPDIR": str(scratch)},
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        written = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        check_counts(example, 1000, written)
        assert sorted(client.keys("*")) == [b"events:0"]
        assert [p.name for p in scratch.iterdir() if p.name.startswith("rcp11")] == []
    client.close()


def aof_bytes(node_dir: Path) -> bytes:
    return b"".join(f.read_bytes() for f in (node_dir / "appendonlydir").glob("*.aof"))


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
