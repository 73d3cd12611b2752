"""The data source's options (the table: rcp11.spark.option_table), parsed
and checked when the DataFrame is defined (``load()``), never later on an
executor.

Names and meanings follow Spark's Kafka integration wherever one applies
(subscribe, subscribePattern, startingOffsets, endingOffsets, the
timestamp options (startingTimestamp, startingOffsetsByTimestamp and its
strategy, endingTimestamp, endingOffsetsByTimestamp), failOnDataLoss, maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay,
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
from rcp11.spark.option_table import (  # noqa: F401 - OptionDoc and the defaults, re-exported
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_TRIGGER_DELAY,
    DEFAULT_RETRY_BACKOFF_MS,
    DEFAULT_RETRY_TIMEOUT_MS,
    OPTIONS,
    RETRY_BACKOFF_MAX_MS,
    OptionDoc,
)

# Kafka's special offsets in a startingOffsets / endingOffsets JSON object.
EARLIEST = -2
LATEST = -1

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
    cluster: str = "auto"  # "auto" | "true" | "false" (rcp11.spark.cluster)

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
        cluster=_choice(options, "cluster", ("auto", "true", "false")),
    )


def _choice(options: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (any case); the first is the default."""
    text = _text(options, name)
    if text is None:
        return choices[0]
    if text.strip().lower() not in choices:
        raise OptionError(errors.spark_bad_option(name, text, " or ".join(choices)))
    return text.strip().lower()


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


@dataclass(frozen=True)
class TimeSpec:
    """A position by time (resolved with TSEEK): one time for every stream
    (startingTimestamp / endingTimestamp) or one per stream (the
    ...OffsetsByTimestamp JSON), in ms since the epoch."""

    option: str  # the option it came from, for errors
    at: int | None = None
    per_stream: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, int]:
        return dict(self.per_stream)


def _timestamp(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise OptionError(errors.spark_bad_option(name, text, "a time in ms since the epoch"))
    return value


def parse_times(options: Mapping[str, str], every: str, by_stream: str) -> TimeSpec | None:
    """Kafka's precedence: one time for all streams beats the per-stream
    JSON; either beats the offsets option (the caller's). Both are checked."""
    given_every = _text(options, every)
    given_json = _text(options, by_stream)
    per_stream = None
    if given_json is not None:
        try:
            parsed = json.loads(given_json)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict) or not parsed:
            raise OptionError(errors.spark_bad_times(by_stream, given_json))
        pairs = []
        for stream, ms in parsed.items():
            if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
                raise OptionError(errors.spark_bad_times(by_stream, given_json))
            pairs.append((stream, ms))
        per_stream = TimeSpec(by_stream, per_stream=tuple(sorted(pairs)))
    if given_every is not None:
        return TimeSpec(every, at=_timestamp(every, given_every))
    return per_stream


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
    starting_time: TimeSpec | None = None  # beats starting when given
    ending_time: TimeSpec | None = None  # beats ending when given
    no_time_match_latest: bool = False  # startingOffsetsByTimestampStrategy=latest
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
        starting_time=parse_times(options, "startingTimestamp", "startingOffsetsByTimestamp"),
        ending_time=parse_times(options, "endingTimestamp", "endingOffsetsByTimestamp"),
        no_time_match_latest=_choice(
            options, "startingOffsetsByTimestampStrategy", ("error", "latest")
        )
        == "latest",
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
    """Kafka's rules for batch queries: no 'latest' start, no 'earliest' end
    (of the offsets options in effect: a timestamp option beats them)."""
    read.require_subscription()
    if read.starting is not None and read.starting_time is None:
        if read.starting.word == "latest" or LATEST in read.starting.as_dict().values():
            raise OptionError(errors.SPARK_BATCH_STARTING_LATEST)
    if read.ending is not None and read.ending_time is None:
        if read.ending.word == "earliest" or EARLIEST in read.ending.as_dict().values():
            raise OptionError(errors.SPARK_BATCH_ENDING_EARLIEST)


def check_streaming_read(read: ReadOptions) -> None:
    read.require_subscription()
    if read.ending_time is not None:
        raise OptionError(errors.spark_streaming_ending(read.ending_time.option))
    if read.ending is not None:
        raise OptionError(errors.spark_streaming_ending("endingOffsets"))


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
    """What load() can check without knowing whether it will read or write,
    nor (PySpark tells a data source neither at load()) whether a read is a
    batch or a streaming query: names, every value, conflicts among options
    of one side, and option sets no query of either kind can take."""
    check_names(options)
    read = parse_read_options(options)
    parse_write_options(options)
    _check_query_kind(options, read)
    _check_start_before_end(read)


def _check_query_kind(options: Mapping[str, str], read: ReadOptions) -> None:
    """Batch-only options with streaming-only ones (startingOffsets=latest
    counts as streaming-only: a batch query cannot start there) make a
    query of neither kind; endingOffsets=earliest fits none either."""
    given = [doc for doc in OPTIONS if _text(options, doc.name) is not None]
    batch = [doc.name for doc in given if doc.applies == "batch read"]
    streaming = [doc.name for doc in given if doc.applies == "streaming read"]
    if read.starting is not None and read.starting_time is None:
        if read.starting.word == "latest" or LATEST in read.starting.as_dict().values():
            streaming.append("startingOffsets=latest")
    if batch and streaming:
        raise OptionError(errors.spark_query_kind_conflict(batch, streaming))
    if read.ending is not None and read.ending_time is None:
        if read.ending.word == "earliest" or EARLIEST in read.ending.as_dict().values():
            raise OptionError(errors.SPARK_BATCH_ENDING_EARLIEST)


def _check_start_before_end(read: ReadOptions) -> None:
    """A start after the end, when both are given as numbers: the options
    alone say so (positions found by TSEEK are checked when planning)."""
    if read.starting_time is None and read.ending_time is None:
        if read.starting is not None and read.ending is not None:
            ends = read.ending.as_dict()
            for stream, start in read.starting.per_stream:
                end = ends.get(stream, LATEST)
                if start >= 0 and end >= 0 and start > end:
                    how = "startingOffsets and endingOffsets"
                    raise OptionError(errors.spark_start_after_end(stream, start, end, how))
    begin, finish = read.starting_time, read.ending_time
    if begin is not None and finish is not None:
        starts = begin.as_dict() if begin.at is None else {}
        ends = finish.as_dict() if finish.at is None else {}
        for stream in sorted(set(starts) | set(ends) | {""}):
            start = begin.at if begin.at is not None else starts.get(stream)
            end = finish.at if finish.at is not None else ends.get(stream)
            if start is not None and end is not None and start > end:
                raise OptionError(
                    errors.spark_start_time_after_end(
                        stream, begin.option, start, finish.option, end
                    )
                )
