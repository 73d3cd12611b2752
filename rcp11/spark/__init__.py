"""PySpark data source "rcp11": read and write rcp11 streams from Spark.

    from rcp11.spark import register
    register(spark)
    df = spark.read.format("rcp11").option("port", 6379).load("events")
    df.write.format("rcp11").option("key", "copy").mode("append").save()

Importing this package is cheap: pyspark is imported only when the data
source class is first used (``register`` or ``RCP11DataSource``). Options and
behaviour are documented on ``rcp11.spark.source.RCP11DataSource``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rcp11.spark.source import RCP11DataSource

__all__ = ["RCP11DataSource", "register"]


def register(spark: SparkSession) -> type[RCP11DataSource]:
    """Register the "rcp11" format with a SparkSession; returns the class."""
    from rcp11.spark.source import RCP11DataSource

    spark.dataSource.register(RCP11DataSource)
    return RCP11DataSource


def __getattr__(name: str) -> Any:
    if name == "RCP11DataSource":
        from rcp11.spark.source import RCP11DataSource

        return RCP11DataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
