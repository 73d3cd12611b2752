"""Spark on rcp11: the data source next to Spark's own, in one run.

    python -m bench.spark_bench [--quick|--smoke]     (also: python -m bench --suite spark)

1. Batch read: the same rows (100-byte values in 2 streams, 2 Spark
   partitions) read from rcp11 and from Parquet files, each into Spark's
   `noop` sink, on `local[2]`. Goal: rcp11 at least half of Parquet's rate.
2. Streaming sink: the same rows (a Parquet directory read as a stream with
   Trigger.AvailableNow) written by the exactly-once rcp11 sink and by the
   `noop` sink. Goal: rcp11 at least half of noop's rate.
3. End-to-end latency: a producer appends timestamped messages at a fixed
   rate; a streaming query copies them (rcp11 source -> rcp11 sink) and a
   consumer blocked on the output stream measures send to receive; once
   with the default trigger, once with processingTime 100 ms. Goal: p99
   under 500 ms at 1000 messages/s.

Only ratios within one run mean anything on a shared machine; the report
says how loaded the machine was and at what nice level this ran.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import Table
from bench.servers import Server

SIZES = {
    # rows read, rows written by the sink, latency: messages/s, seconds, warm-up s, repeats
    "full": (2_000_000, 1_000_000, 1000, 20.0, 5.0, 3),
    "quick": (400_000, 200_000, 1000, 8.0, 3.0, 2),
    "smoke": (20_000, 20_000, 200, 3.0, 2.0, 1),
}
VALUE_BYTES = 100
STREAMS = ("bench:0", "bench:1")
# Issue 24's latency goal, for both triggers.
GOAL_LATENCY_P99_MS = 500
# The triggers the latency is measured with: (label, processingTime or None).
TRIGGERS = (("default trigger", None), ("processingTime 100 ms", "100 milliseconds"))


def fill(server: Server, rows: int) -> None:
    from rcp11.client import Client

    client = Client(port=server.port)
    value = b"x" * VALUE_BYTES
    pipe = client.pipeline(transaction=False)
    per_stream = rows // len(STREAMS)
    for stream in STREAMS:
        for start in range(0, per_stream, 1000):
            pipe.twrite(stream, *[value] * min(1000, per_stream - start))
            if len(pipe) >= 64:
                pipe.execute()
    pipe.execute()
    client.close()


def session(local_checkpoint: bool = False) -> Any:
    """local[2]; with ``local_checkpoint`` the settings docs/SPARK.md gives
    for short micro-batches on a local checkpoint (about 150 ms less per
    micro-batch here). Only the latency runs use them: the raw local file
    system they include also skips Hadoop's checksums of every local file,
    Spark's Parquet reads (the baselines of the throughput rows) included:
    a change of baseline, not of rcp11."""
    from rcp11.spark import LOCAL_CHECKPOINT_SETTINGS, local_session

    return local_session(
        "rcp11-bench", settings=LOCAL_CHECKPOINT_SETTINGS if local_checkpoint else None
    )


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def best_rates(
    rows: int, repeats: int, actions: dict[str, Callable[[], object]]
) -> dict[str, float]:
    """Rows/s of each action, best of ``repeats`` runs taken in turns (so a
    burst of load from elsewhere hits both sides alike)."""
    best = dict.fromkeys(actions, 0.0)
    for _ in range(repeats):
        for name, action in actions.items():
            best[name] = max(best[name], rows / timed(action))
    return best


def no_io_source(rows: int) -> type:
    """A Python data source that yields the same rows as ready-made Arrow
    batches (no I/O): the ceiling of Spark's Python data source path. Made
    in a function so that Spark ships the class by value."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class NoIOReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(len(STREAMS))]

        def read(self, partition: InputPartition) -> Any:
            import numpy as np
            import pyarrow as pa

            size = 100_000  # the rcp11 reader's batch size
            per_partition = rows // len(STREAMS)
            values = pa.array([b"x" * VALUE_BYTES] * size, pa.binary())
            stream = pa.repeat(STREAMS[partition.value], size)
            stamps = pa.array(np.full(size, 1_700_000_000_000_000), pa.timestamp("us", tz="UTC"))
            for start in range(0, per_partition, size):
                count = min(size, per_partition - start)
                offsets = pa.array(np.arange(start, start + count, dtype=np.int64))
                yield pa.RecordBatch.from_arrays(
                    [
                        stream.slice(0, count),
                        offsets,
                        values.slice(0, count),
                        stamps.slice(0, count),
                    ],
                    names=["stream", "offset", "value", "timestamp"],
                )

    class NoIOSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rcp11_bench_no_io"

        def schema(self) -> str:
            return "stream STRING, offset BIGINT, value BINARY, timestamp TIMESTAMP"

        def reader(self, schema: Any) -> DataSourceReader:
            return NoIOReader()

    return NoIOSource


def batch_read(spark: Any, port: int, rows: int, repeats: int, work: Path) -> dict[str, float]:
    spark.dataSource.register(no_io_source(rows))
    no_io = spark.read.format("rcp11_bench_no_io").load()
    df = spark.read.format("rcp11").option("port", port).option("subscribe", ",".join(STREAMS))
    df = df.option("minPartitions", 2).load()
    parquet = str(work / "read.parquet")
    df.repartition(2).write.mode("overwrite").parquet(parquet)
    from_parquet = spark.read.parquet(parquet)
    frames = {"rcp11": df, "parquet": from_parquet, "no-io": no_io}
    for frame in frames.values():  # warm-up: Python workers, JIT
        frame.write.format("noop").mode("overwrite").save()
    return best_rates(
        rows,
        repeats,
        {
            name: (lambda frame=frame: frame.write.format("noop").mode("overwrite").save())
            for name, frame in frames.items()
        },
    )


def no_io_sink() -> type:
    """A Python streaming sink that only counts its rows: the ceiling of
    Spark's Python sink path (rows to Arrow, to a Python worker)."""
    from pyspark.sql.datasource import DataSource, WriterCommitMessage

    try:
        from pyspark.sql.datasource import DataSourceStreamArrowWriter as Base
    except ImportError:  # Spark 4.0
        from pyspark.sql.datasource import DataSourceStreamWriter as Base

    class CountingWriter(Base):  # type: ignore[misc,valid-type]
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: Any, batchId: int) -> None:
            pass

    class NoIOSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rcp11_bench_no_io_sink"

        def schema(self) -> str:
            return "value BINARY"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return CountingWriter()

    return NoIOSink


def streaming_sink(spark: Any, port: int, rows: int, repeats: int, work: Path) -> dict[str, float]:
    from rcp11.client import Client

    source_dir = str(work / "sink-input")
    spark.range(rows, numPartitions=2).selectExpr(
        f"CAST(repeat('x', {VALUE_BYTES}) AS BINARY) AS value"
    ).write.mode("overwrite").parquet(source_dir)
    schema = spark.read.parquet(source_dir).schema
    spark.dataSource.register(no_io_sink())
    client = Client(port=port)
    runs = iter(range(10_000))

    def run(sink: str) -> None:
        checkpoint = str(work / f"checkpoint-{next(runs)}")
        writer = spark.readStream.schema(schema).parquet(source_dir).writeStream
        if sink == "rcp11":
            client.delete("bench:sink")
            writer = writer.format("rcp11").option("port", port).option("stream", "bench:sink")
        else:
            writer = writer.format(sink)
        query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))

    run("noop")  # warm-up
    run("rcp11")
    written = client.tread("bench:sink", 0, 0, withinfo=True).next_offset
    if written != rows:
        raise RuntimeError(f"the sink wrote {written} rows, not {rows}")
    rates = best_rates(
        rows,
        repeats,
        {
            "rcp11": lambda: run("rcp11"),
            "noop": lambda: run("noop"),
            "no-io": lambda: run("rcp11_bench_no_io_sink"),
        },
    )
    client.close()
    return rates


def latency(
    spark: Any,
    port: int,
    rate: int,
    seconds: float,
    warm_up: float,
    work: Path,
    trigger: str | None = None,
) -> dict:
    """Send-to-receive latency of a copy query at a fixed input rate,
    measured once the query runs (its first micro-batch came through) and
    a warm-up has passed; ``trigger``: a processingTime, else the default."""
    from rcp11.client import Client

    name = "default" if trigger is None else trigger.replace(" ", "-")
    source, target = f"bench:lat-in-{name}", f"bench:lat-out-{name}"
    producer, consumer = Client(port=port), Client(port=port)
    stop, measuring, flowing = threading.Event(), threading.Event(), threading.Event()
    samples: list[float] = []

    def produce() -> None:
        interval = 0.01
        per_tick = max(1, int(rate * interval))
        next_tick = time.perf_counter()
        while not stop.is_set():
            stamp = b"%d" % time.time_ns()
            producer.twrite(source, *[stamp] * per_tick)
            next_tick += interval
            time.sleep(max(0.0, next_tick - time.perf_counter()))

    def consume() -> None:
        offset = 0
        while not stop.is_set():
            result = consumer.tread(target, offset, 10_000, block=200, withinfo=True)
            if result is None:
                continue
            now = time.time_ns()
            flowing.set()
            if measuring.is_set():
                samples.extend((now - int(m)) / 1e6 for _, m in result.items())
            offset = result.end

    writer = (
        spark.readStream.format("rcp11")
        .option("port", port)
        .option("subscribe", source)
        .load()
        .select("value")
        .writeStream.format("rcp11")
        .option("port", port)
        .option("stream", target)
        .option("checkpointLocation", str(work / f"latency-checkpoint-{name}"))
    )
    if trigger is not None:
        writer = writer.trigger(processingTime=trigger)
    query = writer.start()
    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    try:
        if not flowing.wait(timeout=300):
            raise RuntimeError("nothing came through the latency query in 300 s")
        time.sleep(warm_up)  # the warm-up window
        measuring.set()
        seen = len(query.recentProgress)
        time.sleep(seconds)  # the measurement window
        measuring.clear()
        progress = query.recentProgress[seen:]
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        query.stop()
        producer.close()
        consumer.close()
    if not samples:
        raise RuntimeError("no message came through the latency query while measuring")
    samples.sort()

    def phase(*names: str) -> float:
        """Median over the measured micro-batches of Spark's durationMs for
        these phases, added up."""
        totals = [sum(p["durationMs"].get(n, 0) for n in names) for p in progress]
        return statistics.median(totals) if totals else float("nan")

    return {
        "messages": len(samples),
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "max_ms": samples[-1],
        "batches": len(progress),
        # Where a micro-batch's time goes (Spark's StreamingQueryProgress):
        "batch_ms": phase("triggerExecution"),
        "source_ms": phase("latestOffset", "getBatch"),  # the source's planning
        "run_ms": phase("addBatch"),  # read and write tasks, the sink's commit
        "spark_ms": phase("queryPlanning", "walCommit", "commitOffsets"),  # Spark's own
    }


def run(mode: str = "full") -> str:
    read_rows, sink_rows, rate, seconds, warm_up, repeats = SIZES[mode]
    work = Path(tempfile.mkdtemp(prefix="rcp11-spark-bench-"))
    server = Server("rcp11", work / "server")
    spark = None
    load_before = os.getloadavg()[0]
    try:
        server.start()
        fill(server, read_rows)
        spark = session()
        read = batch_read(spark, server.port, read_rows, repeats, work)
        sink = streaming_sink(spark, server.port, sink_rows, repeats, work)
        # A new context for the latency runs; Hadoop caches file systems
        # per JVM, so the cached local one goes first.
        jvm = spark._jvm
        spark.stop()
        jvm.org.apache.hadoop.fs.FileSystem.closeAll()
        spark = session(local_checkpoint=True)
        lat = {
            label: latency(spark, server.port, rate, seconds, warm_up, work, trigger)
            for label, trigger in TRIGGERS
        }
    finally:
        if spark is not None:
            spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    read_ratio = read["rcp11"] / read["parquet"]
    sink_ratio = sink["rcp11"] / sink["noop"]
    table = Table(
        "Spark data source vs Spark's own (local[2], 100-byte values, best of "
        f"{repeats}, taken in turns)",
        ["workload", "rcp11 rows/s", "baseline", "baseline rows/s", "ratio", "goal"],
    )
    table.add(
        f"batch read, {read_rows:,} rows in 2 streams, minPartitions 2 -> noop",
        f"{read['rcp11']:,.0f}",
        "Parquet, same rows, 2 files",
        f"{read['parquet']:,.0f}",
        f"{read_ratio:.2f}x",
        "met" if read_ratio >= 0.5 else "missed (>= 0.5x)",
    )
    table.add(
        "batch read, the same rows from a Python data source doing no I/O (the API's ceiling)",
        f"{read['rcp11']:,.0f}",
        "no-I/O Python source",
        f"{read['no-io']:,.0f}",
        f"{read['rcp11'] / read['no-io']:.2f}x",
        "",
    )
    table.add(
        f"streaming sink (exactly once), {sink_rows:,} rows from Parquet, AvailableNow",
        f"{sink['rcp11']:,.0f}",
        "noop sink, same input",
        f"{sink['noop']:,.0f}",
        f"{sink_ratio:.2f}x",
        "met" if sink_ratio >= 0.5 else "missed (>= 0.5x)",
    )
    table.add(
        "streaming sink, the same rows into a Python sink that only counts them "
        "(the API's ceiling)",
        f"{sink['rcp11']:,.0f}",
        "no-I/O Python sink",
        f"{sink['no-io']:,.0f}",
        f"{sink['rcp11'] / sink['no-io']:.2f}x",
        "",
    )
    latency_table = Table(
        f"End-to-end latency: {rate} messages/s for {seconds:.0f} s "
        f"(after the first micro-batch and {warm_up:.0f} s of warm-up), "
        "rcp11 -> Spark copy query -> rcp11",
        [
            "trigger",
            "messages",
            "p50 ms",
            "p99 ms",
            "max ms",
            "micro-batch ms",
            "source planning ms",
            "tasks + sink commit ms",
            "Spark's planning + checkpoint ms",
            "goal",
        ],
    )
    latency_table.notes.append(
        "The micro-batch columns are medians over the measured micro-batches of Spark's "
        "StreamingQueryProgress.durationMs: triggerExecution; latestOffset + getBatch (the "
        "rcp11 source's planning); addBatch (the read and write tasks and the sink's "
        "commit); queryPlanning + walCommit + commitOffsets (Spark's planning and its "
        "checkpoint's offset and commit logs). A message waits for the next micro-batch "
        "to start, then for it to end: the latency is about 1.5 micro-batches. "
        "These runs use rcp11.spark.LOCAL_CHECKPOINT_SETTINGS (docs/SPARK.md, Speed); "
        "the throughput rows above use Spark's defaults."
    )
    for label, row in lat.items():
        latency_table.add(
            label,
            row["messages"],
            f"{row['p50_ms']:.0f}",
            f"{row['p99_ms']:.0f}",
            f"{row['max_ms']:.0f}",
            f"{row['batch_ms']:.0f}",
            f"{row['source_ms']:.0f}",
            f"{row['run_ms']:.0f}",
            f"{row['spark_ms']:.0f}",
            "met"
            if row["p99_ms"] < GOAL_LATENCY_P99_MS
            else f"missed (p99 < {GOAL_LATENCY_P99_MS})",
        )
    note = (
        f"nice {os.nice(0)}, load average {load_before:.2f} before and "
        f"{os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs shared with other work: "
        "only the ratios within this run compare."
    )
    table.notes.append(note)
    return table.markdown() + "\n" + latency_table.markdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true")
    size.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    print(run("quick" if args.quick else "smoke" if args.smoke else "full"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
