"""PySpark data source "rcp11": read and write rcp11 streams from Spark.

    from pyspark.sql import SparkSession
    from rcp11.spark import register

    spark = SparkSession.builder.getOrCreate()
    register(spark)
    df = spark.read.format("rcp11").option("subscribe", "events").load()
    df.selectExpr("CAST(value AS STRING)")            # or .schema("value STRING")
    df.select("value").write.format("rcp11").option("stream", "copy").mode("append").save()

``register(spark)`` also ships the client-side code (``rcp11.client``,
``rcp11.spark``, and redis-py for executors that lack it) to the executors
with ``addPyFile``, so a cluster whose workers never installed rcp11 works.
Importing this package is cheap: pyspark is imported only by
``register`` or when ``RCP11DataSource`` is first used. On one machine,
``local_session()`` gives a local session with rcp11 registered. Options, schema and
the exactly-once sink: docs/SPARK.md.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from rcp11.spark.registration import register
from rcp11.spark.session import LOCAL_SETTINGS, local_session
from rcp11.spark.ship import VENDOR_DIR

if TYPE_CHECKING:
    from rcp11.spark.datasource import RCP11DataSource

__all__ = [
    "LOCAL_CHECKPOINT_SETTINGS",
    "LOCAL_SETTINGS",
    "RCP11DataSource",
    "local_session",
    "register",
]

# Spark settings for short micro-batches when the checkpoint is on a local
# disk (docs/SPARK.md, "Speed"): SparkSession.builder.config(map=...).
# Without the native Hadoop library (PySpark ships none), Hadoop's local
# file system, through the FileContext API Spark uses by default, starts
# `chmod` and `readlink` as child processes for every checkpoint file
# (about ten process starts per micro-batch, seen with strace). The
# FileSystem-based manager renames with one rename(2); the raw local file
# system writes no .crc side files (nor checks them on reads). Not for a
# checkpoint on an object store, where that manager's rename is a copy.
LOCAL_CHECKPOINT_SETTINGS = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
}


def _use_shipped_redis() -> None:
    try:
        import redis  # noqa: F401
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        archive = os.path.dirname(os.path.dirname(here))  # .../rcp11-spark-<hash>.zip
        if not archive.endswith(".zip"):
            raise
        sys.path.append(os.path.join(archive, VENDOR_DIR))


_use_shipped_redis()


def __getattr__(name: str) -> Any:
    if name == "RCP11DataSource":
        from rcp11.spark.datasource import RCP11DataSource

        return RCP11DataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
