"""A Spark driver killed with SIGKILL in the middle of a micro-batch, then
restarted from its checkpoint (here, in this process's SparkSession):
every input row is in the target exactly once, and the staging streams the
dead driver left are cleaned up. And the server killed with kill -9 in the
middle of a query, in every appendfsync mode: the query rides it out and
copies every row exactly once, with nobody restarting anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess, local_spark, wait_for
from helpers_crash import as_if_rebooted
from spark_copy_driver import SETTINGS as COPY_SETTINGS
from spark_copy_driver import start_copy

from rcp11.client import Client

DRIVER = Path(__file__).with_name("spark_copy_driver.py")
ROWS = 6_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """This file's session: the copy driver's (spark_copy_driver.py), for the
    restarted copy."""
    session = local_spark("rcp11-recovery-test", "local[2]", COPY_SETTINGS)
    yield session
    session.stop()


def start_driver(port: int, checkpoint: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), str(port), str(checkpoint)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: the JVM and workers die with it
        )


def staging_in_flight(client: Client) -> bool:
    """A micro-batch after a committed one is being staged (the driver copies
    two micro-batches of 3000 rows)."""
    progress = client.keys("rcp11-sink:*:progress")
    if not progress:
        return False
    committed = int(client.get(progress[0]).split()[0])
    for registry in client.keys("rcp11-sink:*:staged"):
        for entry in client.tread(registry, 0, 1000):
            if entry is not None:
                batch, _, key = entry.decode().partition(" ")
                if int(batch) > committed and client.exists(key):
                    return True
    return False


def test_driver_killed_mid_batch_then_restarted_is_exactly_once(
    spark: Any, shared_server: ServerProcess, tmp_path: Path
) -> None:
    client = Client(port=shared_server.port)
    client.flushall()
    for start in range(0, ROWS, 3000):
        client.twrite("src", *[b"row-%d" % i for i in range(start, start + 3000)])
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    driver = start_driver(shared_server.port, checkpoint, log)
    try:
        wait_for(lambda: staging_in_flight(client) or driver.poll() is not None, timeout=240)
        assert driver.poll() is None, log.read_text()[-3000:]
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    left_behind = [
        k for k in client.keys("rcp11-sink:*") if not k.endswith((b":progress", b":staged"))
    ]
    assert left_behind, "the kill should leave a half-written staging stream"
    assert Counter(m for m in client.tread("dst", 0, ROWS)) != Counter(
        b"row-%d" % i for i in range(ROWS)
    )

    restarted = start_copy(spark, shared_server.port, str(checkpoint), slow=False)
    restarted.awaitTermination(300)
    assert restarted.exception() is None
    copied = [m for m in client.tread("dst", 0, 2 * ROWS) if m is not None]
    assert Counter(copied) == Counter(b"row-%d" % i for i in range(ROWS))
    assert len(copied) == ROWS
    # Only the progress key and the staging registry are left: no staging stream.
    kinds = sorted(k.rsplit(b":", 1)[-1] for k in client.keys("rcp11-sink:*"))
    assert kinds == [b"progress", b"staged"]
    client.close()


@pytest.mark.parametrize("fsync", ["always", "everysec", "no", "everysec-rebooted"])
def test_server_killed_mid_query_is_exactly_once_unattended(
    spark: Any, server_factory: Any, tmp_path: Path, fsync: str
) -> None:
    """kill -9 of the server while a streaming copy stages and commits, then
    the server restarted (as a supervisor would): the query goes on by
    itself. A whole AOF (any appendfsync after kill -9) leaves no gap; a
    reboot under everysec (the AOF slot from another boot) raises every
    stream to its reservation mark, a gap in the staging streams and the
    registry that the sink takes for what it is, not for lost rows."""
    rebooted = fsync.endswith("-rebooted")
    srv = server_factory(appendonly="yes", appendfsync=fsync.removesuffix("-rebooted"))
    client = Client(port=srv.port)
    for start in range(0, ROWS, 3000):
        client.twrite("src", *[b"row-%d" % i for i in range(start, start + 3000)])
    query = start_copy(
        spark, srv.port, str(tmp_path / "checkpoint"), slow=True, until_caught_up=True
    )
    try:
        wait_for(lambda: staging_in_flight(client) or not query.isActive, timeout=240)
        assert query.isActive, query.exception()
        srv.kill9()
        if rebooted:
            as_if_rebooted(srv.dir)
        srv.start()
        query.awaitTermination(300)
    finally:
        query.stop()
    assert query.exception() is None
    client = Client(port=srv.port)
    # Read whole, nulls dropped: after a reboot dst holds a gap.
    copied = [m for m in client.tread("dst", 0, 1 << 24) if m is not None]
    assert Counter(copied) == Counter(b"row-%d" % i for i in range(ROWS))
    assert len(copied) == ROWS
    kinds = sorted(k.rsplit(b":", 1)[-1] for k in client.keys("rcp11-sink:*"))
    assert kinds == [b"progress", b"staged"]
    client.close()
