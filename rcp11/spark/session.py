"""A local SparkSession with the rcp11 data source registered.

For trying rcp11 from Spark on one machine, for scripts and for the
project's own examples, tests and benchmarks: one place that says which
settings a local session needs. On a cluster, build the session as usual
and call ``rcp11.spark.register(spark)``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What a local session sets: no web UI nor console progress bar (they cost
# a port and garble a terminal), two shuffle partitions (Spark's 200 make a
# small job slow), and no empty trailing micro-batches (each costs a
# planning round).
LOCAL_SETTINGS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


def local_session(
    app: str = "rcp11",
    master: str = "local[2]",
    settings: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """A SparkSession on ``master`` with rcp11 registered: LOCAL_SETTINGS,
    then ``settings`` (added, or overriding; e.g. LOCAL_CHECKPOINT_SETTINGS
    for short micro-batches with a checkpoint on a local disk).

    Executors run this interpreter (PYSPARK_PYTHON), so they import the
    same rcp11 and pyspark the driver does."""
    from pyspark.sql import SparkSession

    from rcp11.spark.registration import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    # SparkSession.Builder(), not .builder: the shared builder keeps its
    # options for every later session of the process.
    builder = SparkSession.Builder().master(master).appName(app)
    for name, value in {**LOCAL_SETTINGS, **(settings or {})}.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    register(session)
    return session
