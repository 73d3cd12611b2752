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


def local_spark(app: str, master: str = "local[2,2]") -> Any:
    """A local SparkSession for one test module, with rcp11 registered:
    executors run this interpreter, no UI, two shuffle partitions, and no
    empty trailing micro-batches (each costs a planning round)."""
    from pyspark.sql import SparkSession

    from rcp11.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.Builder()  # not .builder: its options outlive sessions
        .master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("OFF")
    _start_callback_server(session)
    register(session)
    return session
