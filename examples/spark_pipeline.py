"""A streaming pipeline on rcp11 with Spark, exactly once end to end.

JSON events land in three streams (``<run>:events:0`` .. ``:2``, like the
partitions of a topic). A Spark Structured Streaming query reads all three
(``subscribePattern``), parses the JSON, counts actions per 10-second
event-time window (with a watermark, so each window is written once, when
it is complete), and appends the counts as JSON to the stream
``<run>:counts`` through the exactly-once sink.

    .venv/bin/python examples/spark_pipeline.py         # live: 30 s of events, counts as they close
    .venv/bin/python examples/spark_pipeline.py --once  # a fixed batch of past events, then exit

It uses the server on --port (default 6379) and starts a temporary one if
nothing answers there. ``<run>`` is ``rcp11-example:`` and a tag made from
the checkpoint directory: a new run (a new checkpoint) never meets an
earlier run's keys on a server that is used again, and a run restarted with
the same --checkpoint goes on with its own: kill it and run it again with
the same --checkpoint, no count is written twice. --once removes its keys
when it is done, and the directories it made (checkpoint, temporary
server) go too. The port may be any node of a Redis Cluster of
redis-servers with the rcp11 module: the producer, the Spark source and the
sink then work on the cluster (examples/cluster/ starts one and runs this).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from rcp11.client import Client, ClusterClient

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter

SHARDS = 3
ACTIONS = ["view", "click", "buy"]
WINDOW = "10 seconds"
# A past instant for --once, so the counts are the same on every run.
ONCE_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


class Keys:
    """The keys one run works on (see the module's docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    @classmethod
    def for_checkpoint(cls, checkpoint: str) -> Keys:
        tag = hashlib.sha256(os.path.abspath(checkpoint).encode()).hexdigest()[:12]
        return cls(f"rcp11-example:{tag}:")

    def events(self, shard: int) -> str:
        return f"{self.prefix}events:{shard}"

    @property
    def pattern(self) -> str:
        return f"{self.prefix}events:*"

    @property
    def counts(self) -> str:
        return f"{self.prefix}counts"

    def all(self) -> list[str]:
        return [self.events(shard) for shard in range(SHARDS)] + [self.counts]


def make_event(rng: random.Random, ts_ms: int) -> tuple[int, bytes]:
    """(shard, JSON message): a user's action, sharded by user."""
    user = rng.randrange(100)
    action = rng.choices(ACTIONS, weights=[70, 25, 5])[0]
    body = json.dumps({"user": f"u{user}", "action": action, "ts": ts_ms})
    return user % SHARDS, body.encode()


def past_events(count: int, seed: int = 11) -> list[tuple[int, bytes]]:
    """``count`` events 50 ms apart from ONCE_START_MS, then one event a
    minute later that moves the watermark past all of them."""
    rng = random.Random(seed)
    events = [make_event(rng, ONCE_START_MS + 50 * i) for i in range(count)]
    events.append(make_event(rng, ONCE_START_MS + 50 * count + 60_000))
    return events


def produce(client: Client | ClusterClient, keys: Keys, events: list[tuple[int, bytes]]) -> None:
    by_stream: dict[str, list[bytes]] = {}
    for shard, body in events:
        by_stream.setdefault(keys.events(shard), []).append(body)
    for stream, bodies in by_stream.items():
        for start in range(0, len(bodies), 1000):
            client.twrite(stream, *bodies[start : start + 1000])


def produce_live(
    client: Client | ClusterClient, keys: Keys, seconds: float, stop: threading.Event
) -> None:
    rng = random.Random()
    deadline = time.time() + seconds
    while time.time() < deadline and not stop.is_set():
        produce(client, keys, [make_event(rng, int(time.time() * 1000)) for _ in range(50)])
        time.sleep(0.1)


def connect(port: int) -> Client | ClusterClient:
    """A client for the server on ``port``, or for the whole cluster when it
    is a Redis Cluster node (CLUSTER SLOTS answers with slots)."""
    client = Client(port=port)
    try:
        clustered = bool(client.execute_command("CLUSTER SLOTS"))
    except redis.ResponseError:  # rcp11-server, or redis-server not in cluster mode
        clustered = False
    if not clustered:
        return client
    client.close()
    return ClusterClient(host="127.0.0.1", port=port)


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def server(port: int) -> Iterator[int]:
    """The server on ``port``, or a temporary one on a free port."""
    if answers(port):
        yield port
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tempfile.mkdtemp(prefix="rcp11-example-")
    print(f"no server on the given port: starting a temporary one on {port}", flush=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "rcp11", "server", "--port", str(port), "--dir", directory]
        + ["--appendonly", "yes", "--logfile", os.path.join(directory, "server.log")]
    )
    try:
        while not answers(port):
            if process.poll() is not None:
                log = Path(directory, "server.log")
                raise SystemExit("the server did not start:\n" + log.read_text()[-2000:])
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def build_query(
    spark: SparkSession, port: int, keys: Keys, checkpoint: str, once: bool
) -> DataStreamWriter:
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("rcp11")
        .option("port", port)
        .option("subscribePattern", keys.pattern)
        .option("startingOffsets", "earliest")
        .schema("value STRING")  # JSON text; invalid UTF-8 would be an error
        .load()
        .select(F.from_json("value", "user STRING, action STRING, ts BIGINT").alias("e"))
        .select("e.action", F.timestamp_millis("e.ts").alias("event_time"))
    )
    counts = (
        events.withWatermark("event_time", WINDOW)
        .groupBy(F.window("event_time", WINDOW), "action")
        .count()
        .select(
            F.to_json(
                F.struct(
                    F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss").alias("window"),
                    "action",
                    "count",
                )
            ).alias("value")
        )
    )
    writer = (
        counts.writeStream.format("rcp11")
        .outputMode("append")
        .option("port", port)
        .option("stream", keys.counts)
        .option("checkpointLocation", checkpoint)
    )
    return writer.trigger(availableNow=True) if once else writer.trigger(processingTime="2 seconds")


def run_pipeline(
    spark: SparkSession,
    port: int,
    checkpoint: str,
    once: bool,
    events: int = 5000,
    seconds: float = 30,
    show: Callable[[str], None] = print,
) -> bool:
    """Produce events, run the query, show each count as it is written.
    Returns whether the query ended without an error."""
    keys = Keys.for_checkpoint(checkpoint)
    client = connect(port)
    # Window starts are shown in UTC, whatever the machine's zone; a window
    # is written by the micro-batch that follows the one moving the
    # watermark past it, which may have no data.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "true")
    stop = threading.Event()
    producer = None
    if once:
        produce(client, keys, past_events(events))
    else:
        producer = threading.Thread(
            target=produce_live, args=(client, keys, seconds, stop), daemon=True
        )
        producer.start()
    query = build_query(spark, port, keys, checkpoint, once).start()
    shown = 0
    try:
        while query.isActive:
            query.awaitTermination(2)
            for message in client.tread(keys.counts, shown, 1000):
                show(message.decode())
                shown += 1
            if producer is not None and not producer.is_alive():
                query.stop()
    finally:
        stop.set()
    for message in client.tread(keys.counts, shown, 100_000):
        show(message.decode())
    client.close()
    return query.exception() is None


def remove_keys(port: int, keys: Keys) -> None:
    """The run's streams, and the sink's bookkeeping for its counts
    (docs/SPARK.md: `rcp11-sink:{<target>}:<query>:*`, one hash slot)."""
    client = connect(port)
    try:
        sink_keys = client.scan_iter(match=f"rcp11-sink:{{{keys.counts}}}:*", count=1000)
        for key in [*keys.all(), *sink_keys]:  # one by one: a cluster spreads them out
            client.delete(key)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--once", action="store_true", help="past events, Trigger.AvailableNow")
    parser.add_argument("--events", type=int, default=5000, help="events for --once")
    parser.add_argument("--seconds", type=float, default=30, help="how long to produce live")
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (default: new)")
    args = parser.parse_args(argv)

    from rcp11.spark import local_session

    with server(args.port) as port:
        spark = local_session("rcp11-example")
        checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="rcp11-example-checkpoint-")
        try:
            ok = run_pipeline(
                spark, port, checkpoint, args.once, args.events, args.seconds, show=print_flush
            )
        finally:
            spark.stop()
            if args.checkpoint is None:
                shutil.rmtree(checkpoint, ignore_errors=True)
        keys = Keys.for_checkpoint(checkpoint)
        if args.once:
            remove_keys(port, keys)
        else:
            print(f"counts are in stream {keys.counts}", flush=True)
        return 0 if ok else 1


def print_flush(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
