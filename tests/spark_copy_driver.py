"""The Spark driver test_spark_recovery.py kills: copies stream ``src`` into
``dst`` with the rcp11 source and sink, micro-batch by micro-batch.

    python spark_copy_driver.py PORT CHECKPOINT

runs until killed, each micro-batch taking a while so that a kill -9 lands
in the middle of one. ``start_copy`` is the same query for the restart.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from harness.spark import local_spark

# Arrow batches of 200 rows: pace() sleeps once per batch, so a micro-batch
# (up to 3000 rows) spans many sleeps. The restart in test_spark_recovery.py
# runs its session with the same settings.
SETTINGS = {"spark.sql.execution.arrow.maxRecordsPerBatch": "200"}


def start_copy(
    spark: Any, port: int, checkpoint: str, slow: bool, until_caught_up: bool | None = None
) -> Any:
    """Start the copy query; ``slow`` paces it and, unless
    ``until_caught_up``, never stops; otherwise it copies what is there
    (Trigger.AvailableNow)."""

    def pace(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if slow:
                time.sleep(0.1)  # a long micro-batch, so the kill lands inside one
            yield batch

    source = (
        spark.readStream.format("rcp11")
        .option("port", port)
        .option("subscribe", "src")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 3000)
        .option("minPartitions", 2)
        .load()
    )
    writer = (
        source.select("value")
        .mapInArrow(pace, "value binary")
        .writeStream.format("rcp11")
        .option("port", port)
        .option("stream", "dst")
        .option("batchSize", 100)
        .option("checkpointLocation", checkpoint)
    )
    if until_caught_up is None:
        until_caught_up = not slow
    return (writer.trigger(availableNow=True) if until_caught_up else writer).start()


def main(port: int, checkpoint: str) -> int:
    # ERROR, not local_spark's OFF: the test shows this log when the driver dies.
    spark = local_spark("rcp11-copy", "local[2]", SETTINGS, log_level="ERROR")
    start_copy(spark, port, checkpoint, slow=True).awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
