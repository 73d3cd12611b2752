"""register(spark): the "rcp11" format in a SparkSession, and the client
code shipped to its executors."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rcp11.spark.datasource import RCP11DataSource


def register(spark: SparkSession, ship: bool = True) -> type[RCP11DataSource]:
    """Register the "rcp11" format with a SparkSession; returns the class.

    With ``ship`` (the default) the client-side code goes to the executors
    through ``spark.sparkContext.addPyFile`` (once per zip content)."""
    from rcp11.spark.datasource import RCP11DataSource
    from rcp11.spark.ship import client_zip

    if ship:
        path = client_zip()
        context = spark.sparkContext
        shipped = getattr(context, "_rcp11_shipped", set())
        if path not in shipped:
            context.addPyFile(path)
            shipped.add(path)
            context._rcp11_shipped = shipped  # type: ignore[attr-defined]
    spark.dataSource.register(RCP11DataSource)
    return RCP11DataSource
