"""The table of the data source's options: name, scope, default and
meaning of each, and the defaults themselves. docs/SPARK.md's option table
is this one (a test keeps them equal); parsing is rcp11.spark.options.
"""

from __future__ import annotations

from dataclasses import dataclass

# Messages per TREAD in a partition reader and per TWRITE in a sink task:
# measured (bench/spark_bench.py) so a request carries about a megabyte of
# 100-byte messages, enough to hide the round trip.
DEFAULT_BATCH_SIZE = 10_000
# How long a task or the driver keeps reconnecting through an outage before
# it fails with a clear error, and the first pause between attempts (it
# doubles up to RETRY_BACKOFF_MAX_MS).
DEFAULT_RETRY_TIMEOUT_MS = 60_000
DEFAULT_RETRY_BACKOFF_MS = 100
RETRY_BACKOFF_MAX_MS = 5_000
DEFAULT_MAX_TRIGGER_DELAY = "15m"


@dataclass(frozen=True)
class OptionDoc:
    name: str
    applies: str  # "read and write", "read", "batch read", "streaming read", "write"
    default: str
    meaning: str


OPTIONS: tuple[OptionDoc, ...] = (
    OptionDoc("host", "read and write", "127.0.0.1", "server host name or address"),
    OptionDoc("port", "read and write", "6379", "server port"),
    OptionDoc("username", "read and write", "(none)", "AUTH user name"),
    OptionDoc("password", "read and write", "(none)", "AUTH password"),
    OptionDoc(
        "retryTimeoutMs",
        "read and write",
        str(DEFAULT_RETRY_TIMEOUT_MS),
        "how long to keep reconnecting (and the socket timeout) before failing",
    ),
    OptionDoc(
        "retryBackoffMs",
        "read and write",
        str(DEFAULT_RETRY_BACKOFF_MS),
        f"first pause between reconnects; doubles up to {RETRY_BACKOFF_MAX_MS} ms",
    ),
    OptionDoc(
        "batchSize",
        "read and write",
        str(DEFAULT_BATCH_SIZE),
        "messages per TREAD (read) or per TWRITE (write)",
    ),
    OptionDoc(
        "cluster",
        "read and write",
        "auto",
        "Redis Cluster: auto (asks CLUSTER SLOTS), true (the server must be a cluster node) "
        "or false (one server)",
    ),
    OptionDoc("subscribe", "read", "", "comma-separated stream keys (or .load('a,b'))"),
    OptionDoc(
        "subscribePattern",
        "read",
        "",
        "a Redis glob; matching streams are found with SCAN, again every micro-batch",
    ),
    OptionDoc(
        "startingOffsets",
        "read",
        "earliest (batch), latest (streaming)",
        'earliest, latest (streaming only) or JSON {"stream": offset}, -2 = earliest, -1 = latest',
    ),
    OptionDoc(
        "startingTimestamp",
        "read",
        "(none)",
        "ms since the epoch: each stream starts at its first message appended at or after it "
        "(TSEEK); beats startingOffsetsByTimestamp and startingOffsets",
    ),
    OptionDoc(
        "startingOffsetsByTimestamp",
        "read",
        "(none)",
        'JSON {"stream": ms}: startingTimestamp per stream; beats startingOffsets',
    ),
    OptionDoc(
        "startingOffsetsByTimestampStrategy",
        "read",
        "error",
        "a stream with no message at or after its starting time: error, or latest "
        "(start at its next offset)",
    ),
    OptionDoc(
        "endingOffsets",
        "batch read",
        "latest",
        'latest or JSON {"stream": offset} (exclusive), -1 = latest',
    ),
    OptionDoc(
        "endingTimestamp",
        "batch read",
        "(none)",
        "ms since the epoch: each stream ends before its first message appended at or after "
        "it (TSEEK); beats endingOffsetsByTimestamp and endingOffsets",
    ),
    OptionDoc(
        "endingOffsetsByTimestamp",
        "batch read",
        "(none)",
        'JSON {"stream": ms}: endingTimestamp per stream; beats endingOffsets',
    ),
    OptionDoc(
        "failOnDataLoss",
        "read",
        "true",
        "fail when offsets the query needs were evicted or a stream was deleted/recreated; "
        "false skips the gap and logs it",
    ),
    OptionDoc(
        "maxOffsetsPerTrigger",
        "streaming read",
        "(none)",
        "at most this many offsets per micro-batch, shared by the streams in proportion "
        "to their backlog",
    ),
    OptionDoc(
        "minOffsetsPerTrigger",
        "streaming read",
        "(none)",
        "wait until this many offsets are available (or maxTriggerDelay passed)",
    ),
    OptionDoc(
        "maxTriggerDelay",
        "streaming read",
        DEFAULT_MAX_TRIGGER_DELAY,
        "longest wait for minOffsetsPerTrigger (e.g. 500ms, 30s, 15m, 1h)",
    ),
    OptionDoc(
        "minPartitions",
        "read",
        "(one per stream)",
        "split large offset ranges so there are at least this many Spark partitions",
    ),
    OptionDoc(
        "maxRecordsPerPartition",
        "read",
        "(none)",
        "split offset ranges so no Spark partition has more offsets than this",
    ),
    OptionDoc(
        "evictOnCommit",
        "streaming read",
        "false",
        "TEVICT what a micro-batch has read once Spark commits it",
    ),
    OptionDoc("stream", "write", "(the stream column)", "target stream for every row"),
    OptionDoc("topic", "write", "(the topic column)", "the same as stream (Kafka's name)"),
)
