"""The data source's options: one table, parsed and checked when the
DataFrame is defined (``load()``), never later on an executor.

Names and meanings follow Spark's Kafka integration wherever one applies
(subscribe, subscribePattern, startingOffsets, endingOffsets,
failOnDataLoss, maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay,
minPartitions, maxRecordsPerPartition; ``topic`` as a synonym of
``stream``). Spark hands options over as a case-insensitive dict, so lookups
go through the lower-case name; errors show the documented spelling.

Everything here is a small frozen dataclass: Spark pickles readers and
writers to its Python workers, and a socket must never travel with them.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rcp11 import errors

# Kafka's special offsets in a startingOffsets / endingOffsets JSON object.
EARLIEST = -2
LATEST = -1

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
        "endingOffsets",
        "batch read",
        "latest",
        'latest or JSON {"stream": offset} (exclusive), -1 = latest',
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

# Options Spark itself adds or forwards: load()/save() paths, the
# streaming writer's checkpoint and query name.
SPARK_OPTIONS = ("path", "paths", "checkpointLocation", "queryName")

_CANONICAL = {doc.name.lower(): doc.name for doc in OPTIONS}
_CANONICAL.update({name.lower(): name for name in SPARK_OPTIONS})


class OptionError(ValueError):
    """An option is unknown, malformed or conflicts with another one."""


def check_names(options: Mapping[str, str]) -> None:
    """Unknown option names are an error that lists the known ones."""
    for name in options:
        if name.lower() in _CANONICAL:
            continue
        close = difflib.get_close_matches(name.lower(), list(_CANONICAL), n=1, cutoff=0.75)
        hint = _CANONICAL[close[0]] if close else None
        known = sorted(doc.name for doc in OPTIONS)
        raise OptionError(errors.spark_unknown_option(name, hint, known))


def _text(options: Mapping[str, str], name: str) -> str | None:
    # Spark's CaseInsensitiveDict finds any spelling; a plain dict (tests,
    # direct use) is searched without case.
    value = options.get(name.lower())
    if value is None:
        value = next((v for k, v in options.items() if k.lower() == name.lower()), None)
    return None if value is None else str(value)


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    text = _text(options, name)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(errors.spark_bad_option(name, text, "an integer")) from None
    if value < minimum:
        raise OptionError(errors.spark_bad_option(name, text, f"an integer >= {minimum}"))
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _text(options, name)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise OptionError(errors.spark_bad_option(name, text, "true or false"))


_DURATION = re.compile(r"\s*(\d+)\s*(us|ms|s|sec|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_MS = {"us": 0.001, "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000}
_UNIT_MS.update({"h": 3_600_000, "d": 86_400_000})


def parse_duration_ms(name: str, text: str) -> int:
    """Spark's time strings: a number with a unit (us, ms, s, m/min, h, d); ms if none."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise OptionError(errors.spark_bad_option(name, text, "a duration such as 500ms or 15m"))
    unit = (match.group(2) or "ms").lower()
    return int(int(match.group(1)) * _UNIT_MS[unit])


@dataclass(frozen=True)
class Endpoint:
    """Where the server is and how long to keep trying; no socket inside."""

    host: str = "127.0.0.1"
    port: int = 6379
    username: str | None = None
    password: str | None = None
    retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS
    retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(options: Mapping[str, str]) -> Endpoint:
    return Endpoint(
        host=_text(options, "host") or "127.0.0.1",
        port=_int(options, "port", 6379, 1) or 6379,
        username=_text(options, "username"),
        password=_text(options, "password"),
        retry_timeout_ms=_int(options, "retryTimeoutMs", DEFAULT_RETRY_TIMEOUT_MS, 0) or 0,
        retry_backoff_ms=_int(options, "retryBackoffMs", DEFAULT_RETRY_BACKOFF_MS, 1) or 1,
    )


# ---------------------------------------------------------------------------
# Offsets: "earliest" | "latest" | {"stream": offset}
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetSpec:
    """A startingOffsets / endingOffsets value: a word, or per-stream offsets
    (>= 0, or EARLIEST / LATEST) as a tuple of pairs (hashable, picklable)."""

    word: str | None = None  # "earliest" | "latest"
    per_stream: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, int]:
        return dict(self.per_stream)


def parse_offsets(name: str, text: str) -> OffsetSpec:
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return OffsetSpec(word=stripped.lower())
    try:
        parsed = json.loads(stripped)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(errors.spark_bad_offsets(name, text))
    pairs = []
    for stream, offset in parsed.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise OptionError(errors.spark_bad_offsets(name, text))
        pairs.append((stream, offset))
    return OffsetSpec(per_stream=tuple(sorted(pairs)))


# ---------------------------------------------------------------------------
# Which streams a read covers
# ---------------------------------------------------------------------------


def split_stream_list(text: str) -> tuple[str, ...]:
    """Kafka's topic list rules: comma-separated, trimmed, empty names dropped."""
    names = [name.strip() for name in text.split(",")]
    return tuple(dict.fromkeys(name for name in names if name))


@dataclass(frozen=True)
class Subscription:
    """Either fixed stream names or a glob re-resolved with SCAN."""

    names: tuple[str, ...] = ()
    pattern: str | None = None

    def describe(self) -> str:
        return f"pattern {self.pattern!r}" if self.pattern is not None else ", ".join(self.names)


def parse_subscription(options: Mapping[str, str]) -> Subscription | None:
    """None when no read option says which streams (then it is not a read)."""
    given = {
        name: _text(options, name)
        for name in ("subscribe", "subscribePattern", "path")
        if _text(options, name) is not None
    }
    if not given:
        return None
    if len(given) > 1:
        raise OptionError(errors.spark_subscription_conflict(sorted(given)))
    ((name, text),) = given.items()
    assert text is not None
    if name == "subscribePattern":
        if not text:
            raise OptionError(errors.spark_bad_option(name, text, "a non-empty glob"))
        return Subscription(pattern=text)
    names = split_stream_list(text)
    if not names:
        raise OptionError(errors.spark_bad_option(name, text, "one or more stream names"))
    return Subscription(names=names)


@dataclass(frozen=True)
class ReadOptions:
    endpoint: Endpoint
    subscription: Subscription | None
    starting: OffsetSpec | None  # None: the default of batch / streaming
    ending: OffsetSpec | None
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    evict_on_commit: bool = False

    def require_subscription(self) -> Subscription:
        if self.subscription is None:
            raise OptionError(errors.SPARK_NO_SUBSCRIPTION)
        return self.subscription


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    starting = _text(options, "startingOffsets")
    ending = _text(options, "endingOffsets")
    delay = _text(options, "maxTriggerDelay")
    return ReadOptions(
        endpoint=parse_endpoint(options),
        subscription=parse_subscription(options),
        starting=parse_offsets("startingOffsets", starting) if starting is not None else None,
        ending=parse_offsets("endingOffsets", ending) if ending is not None else None,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", None, 1),
        min_offsets_per_trigger=_int(options, "minOffsetsPerTrigger", None, 1),
        max_trigger_delay_ms=parse_duration_ms(
            "maxTriggerDelay", delay if delay is not None else DEFAULT_MAX_TRIGGER_DELAY
        ),
        min_partitions=_int(options, "minPartitions", None, 1),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", None, 1),
        batch_size=_int(options, "batchSize", DEFAULT_BATCH_SIZE, 1) or DEFAULT_BATCH_SIZE,
        evict_on_commit=_bool(options, "evictOnCommit", False),
    )


def check_batch_read(read: ReadOptions) -> None:
    """Kafka's rules for batch queries: no 'latest' start, no 'earliest' end."""
    read.require_subscription()
    if read.starting is not None:
        if read.starting.word == "latest" or LATEST in read.starting.as_dict().values():
            raise OptionError(errors.SPARK_BATCH_STARTING_LATEST)
    if read.ending is not None:
        if read.ending.word == "earliest" or EARLIEST in read.ending.as_dict().values():
            raise OptionError(errors.SPARK_BATCH_ENDING_EARLIEST)


def check_streaming_read(read: ReadOptions) -> None:
    read.require_subscription()
    if read.ending is not None:
        raise OptionError(errors.SPARK_STREAMING_ENDING)


@dataclass(frozen=True)
class WriteOptions:
    endpoint: Endpoint
    stream: str | None  # None: a stream (or topic) column names each row's target
    batch_size: int = DEFAULT_BATCH_SIZE


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    given = {
        name: _text(options, name)
        for name in ("stream", "topic", "path")
        if _text(options, name) is not None
    }
    if len(given) > 1:
        raise OptionError(errors.spark_target_option_conflict(sorted(given)))
    target = next(iter(given.values()), None)
    if target is not None and not target:
        raise OptionError(errors.spark_bad_option(next(iter(given)), target, "a stream name"))
    return WriteOptions(
        endpoint=parse_endpoint(options),
        stream=target,
        batch_size=_int(options, "batchSize", DEFAULT_BATCH_SIZE, 1) or DEFAULT_BATCH_SIZE,
    )


def check_all(options: Mapping[str, str]) -> None:
    """What load() can check without knowing whether it will read or write:
    names, every value, and conflicts among options of one side."""
    check_names(options)
    parse_read_options(options)
    parse_write_options(options)
