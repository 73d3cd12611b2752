"""A local SparkSession with the rcp11 data source registered."""

from __future__ import annotations

import os
import sys
from typing import Any

# py4j's callback server (what foreachBatch calls back through) waits on its
# socket with select(), which fails for descriptors >= 1024; a long test
# session has more open by the time Spark starts. So a few low descriptors
# are held from the start and given to the callback server, started with
# the first Spark session (it lives as long as the process's gateway).
_LOW_FDS = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]


def _start_callback_server(session: Any) -> None:
    from pyspark.java_gateway import ensure_callback_server_started

    while _LOW_FDS:
        os.close(_LOW_FDS.pop())
    ensure_callback_server_started(session.sparkContext._gateway)


# What every test session sets: executors run this interpreter, no UI, two
# shuffle partitions, and no empty trailing micro-batches (each costs a
# planning round).
SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


def local_spark(
    app: str,
    master: str = "local[2,2]",
    settings: dict[str, str] | None = None,
    log_level: str = "OFF",
) -> Any:
    """A local SparkSession for one test module (or a driver a test runs),
    with rcp11 registered: SETTINGS, then `settings` (added, or
    overriding). The default master retries a failed task once; "local[2]"
    fails the job at once."""
    from pyspark.sql import SparkSession

    from rcp11.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    # SparkSession.Builder(), not .builder: the shared builder's options
    # outlive its sessions.
    builder = SparkSession.Builder().master(master).appName(app)
    for name, value in {**SETTINGS, **(settings or {})}.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    _start_callback_server(session)
    register(session)
    return session
