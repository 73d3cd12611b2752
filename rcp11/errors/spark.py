"""The Spark data source's texts (rcp11.spark): raised in the Spark driver
or its tasks, never sent by the server. Each starts with SPARK_PREFIX so a
user reading a Spark stack trace knows which component speaks, and says
which option or column to change.

This file is shipped to executors with the rest of the package (ship.py):
it imports nothing.
"""

SPARK_PREFIX = "rcp11 data source: "
SPARK_NO_SUBSCRIPTION = (
    SPARK_PREFIX + "say which streams to read: option 'subscribe' (comma-separated stream "
    "keys), 'subscribePattern' (a glob) or .load('a,b')"
)
SPARK_BATCH_STARTING_LATEST = (
    SPARK_PREFIX + "startingOffsets cannot be 'latest' (or -1) in a batch query: it would "
    "read nothing"
)
SPARK_BATCH_ENDING_EARLIEST = (
    SPARK_PREFIX + "endingOffsets cannot be 'earliest' (or -2) in a batch query: it would "
    "read nothing"
)
SPARK_KEY_COLUMN = (
    SPARK_PREFIX + "the DataFrame has a 'key' column, but rcp11 messages have no key; "
    "drop it, or put it into the value (e.g. to_json(struct(key, value)) AS value)"
)
SPARK_HEADERS_COLUMN = (
    SPARK_PREFIX + "the DataFrame has a 'headers' column, but rcp11 messages have no "
    "headers; drop it, or put them into the value (e.g. to_json(struct(headers, value)) "
    "AS value)"
)
SPARK_PARTITION_COLUMN = (
    SPARK_PREFIX + "the DataFrame has a 'partition' column, but an rcp11 stream is one "
    "ordered log with no partitions; drop it, or write each partition to a stream of its "
    "own with a 'stream' column (e.g. concat('events:', partition) AS stream)"
)
SPARK_NO_TARGET = (
    SPARK_PREFIX + "say which stream to write to: option 'stream' (or 'topic'), "
    ".save('stream'), or a 'stream' (or 'topic') string column"
)
SPARK_OVERWRITE = SPARK_PREFIX + "streams are append-only logs; write with mode('append')"


def spark_unknown_option(name: str, hint: str | None, known: list[str]) -> str:
    guess = f" (did you mean '{hint}'?)" if hint else ""
    return f"{SPARK_PREFIX}unknown option '{name}'{guess}; the options are: {', '.join(known)}"


def spark_bad_option(name: str, value: str, expected: str) -> str:
    return f"{SPARK_PREFIX}option '{name}' must be {expected}, got {value!r}"


def spark_bad_offsets(name: str, value: str) -> str:
    return (
        f"{SPARK_PREFIX}option '{name}' must be 'earliest', 'latest' or a JSON object "
        f'{{"stream": offset}} with offsets >= 0, -2 (earliest) or -1 (latest); got {value!r}'
    )


def spark_streaming_ending(name: str) -> str:
    return (
        f"{SPARK_PREFIX}{name} applies to batch queries only; a streaming query reads "
        "until it is stopped (use Trigger.AvailableNow to stop at what exists)"
    )


def spark_query_kind_conflict(batch: list[str], streaming: list[str]) -> str:
    return (
        f"{SPARK_PREFIX}{', '.join(batch)} can only be given to a batch query "
        f"(spark.read) and {', '.join(streaming)} only to a streaming one "
        "(spark.readStream): no query takes both"
    )


def spark_start_after_end(stream: str, start: int, end: int, how: str) -> str:
    return (
        f"{SPARK_PREFIX}stream {stream!r} would be read from offset {start} to {end}: the "
        f"start is after the end ({how}); a batch query's start must not pass its end"
    )


def spark_start_time_after_end(
    stream: str, start_option: str, start_ms: int, end_option: str, end_ms: int
) -> str:
    which = f" for stream {stream!r}" if stream else ""
    return (
        f"{SPARK_PREFIX}{start_option} {start_ms} ms is after {end_option} {end_ms} ms"
        f"{which}: a batch query's start must not pass its end"
    )


def spark_bad_times(name: str, value: str) -> str:
    return (
        f"{SPARK_PREFIX}option '{name}' must be a JSON object {{\"stream\": ms}} with times "
        f"in ms since the epoch (>= 0); got {value!r}"
    )


def spark_no_time_match(name: str, stream: str, ms: int, next_offset: int) -> str:
    return (
        f"{SPARK_PREFIX}{name}: stream {stream!r} has no message appended at or after "
        f"{ms} ms (its next offset is {next_offset}); set "
        "startingOffsetsByTimestampStrategy=latest to start there instead"
    )


def spark_not_a_cluster(address: str) -> str:
    return (
        f"{SPARK_PREFIX}option cluster=true, but the server at {address} is not a Redis "
        "Cluster node (CLUSTER SLOTS answered no slots); use cluster=false or auto"
    )


def spark_no_tseek(address: str, name: str, reply: str) -> str:
    return (
        f"{SPARK_PREFIX}{name} needs the server's TSEEK command, which the server at "
        f"{address} does not have ({reply})"
    )


def spark_offsets_streams(
    name: str, missing: list[str], extra: list[str], hint: str = " (-2 = earliest, -1 = latest)"
) -> str:
    parts = []
    if missing:
        parts.append(f"it does not name {', '.join(map(repr, missing))}")
    if extra:
        parts.append(f"it names {', '.join(map(repr, extra))}, which the query does not read")
    return (
        f"{SPARK_PREFIX}{name} must name every stream the query reads and no other"
        f"{hint}: {'; '.join(parts)}"
    )


def spark_offset_beyond(stream: str, offset: int, next_offset: int) -> str:
    return (
        f"{SPARK_PREFIX}startingOffsets gives stream {stream!r} offset {offset}, beyond its "
        f"next offset {next_offset}"
    )


def spark_option_scope(name: str, side: str, other: str) -> str:
    return f"{SPARK_PREFIX}option '{name}' applies to {other}, not to {side}"


def spark_subscription_conflict(names: list[str]) -> str:
    return f"{SPARK_PREFIX}give only one of subscribe, subscribePattern and load(path); got {names}"


def spark_target_option_conflict(names: list[str]) -> str:
    return f"{SPARK_PREFIX}give only one of stream, topic and save(path); got {names}"


def spark_target_column_conflict(option: str, column: str) -> str:
    return (
        f"{SPARK_PREFIX}both the option '{option}' and a '{column}' column say where rows go; "
        f"drop the column (df.drop('{column}')) or remove the option"
    )


def spark_schema_column(name: str, allowed: str) -> str:
    return f"{SPARK_PREFIX}unknown column {name!r} in the schema; the columns are {allowed}"


def spark_schema_type(name: str, got: str, allowed: list[str]) -> str:
    return f"{SPARK_PREFIX}column {name!r} cannot be {got}; use {' or '.join(allowed)}"


def spark_write_column(name: str, problem: str) -> str:
    return f"{SPARK_PREFIX}column '{name}' {problem}"


# What follows a data loss text: the way out when the query fails on it
# (failOnDataLoss=true), what was done when it does not (a warning).
def _loss_ending(fail: bool, remedy: str, done: str) -> str:
    return f". Set failOnDataLoss=false to {remedy}" if fail else f"; {done} (failOnDataLoss=false)"


def spark_data_loss(stream: str, start: int, end: int | None, why: str, fail: bool = True) -> str:
    span = f"offsets {start} to {end - 1}" if end is not None else f"offsets from {start} on"
    return (
        f"{SPARK_PREFIX}data loss in stream {stream!r}: {span} are no longer readable "
        f"({why}){_loss_ending(fail, 'skip them', 'skipped them')}"
    )


def spark_stream_recreated(
    stream: str, next_offset: int, checkpoint: int, fail: bool = True
) -> str:
    return (
        f"{SPARK_PREFIX}stream {stream!r} was deleted or recreated: its next offset is now "
        f"{next_offset}, below the checkpoint's {checkpoint}; what it held from offset "
        f"{checkpoint} on is lost"
        + _loss_ending(
            fail, "read it again from its earliest", "reading it again from its earliest"
        )
    )


def spark_stream_deleted(stream: str, checkpoint: int, fail: bool = True) -> str:
    return (
        f"{SPARK_PREFIX}stream {stream!r} was deleted; what it held from offset {checkpoint} "
        f"on is lost{_loss_ending(fail, 'go on without it', 'going on without it')}"
    )


def spark_time_out_of_range(stream: str, offset: int, ms: int) -> str:
    return (
        f"{SPARK_PREFIX}the message at offset {offset} of stream {stream!r} has the append "
        f"time {ms} ms, past year 9999, which Spark's TIMESTAMP cannot hold; read a schema "
        "without the timestamp column"
    )


def spark_invalid_utf8(stream: str, offset: int) -> str:
    return (
        f"{SPARK_PREFIX}the message at offset {offset} of stream {stream!r} is not valid "
        "UTF-8; read value as BINARY and decode it yourself"
    )


def spark_not_a_stream(stream: str) -> str:
    return f"{SPARK_PREFIX}key {stream!r} is not a stream (WRONGTYPE)"


def spark_unreachable(address: str, seconds: float, doing: str, cause: str) -> str:
    return (
        f"{SPARK_PREFIX}cannot reach the server at {address} for {seconds:.1f}s while "
        f"{doing} (retryTimeoutMs); last error: {cause}"
    )


def spark_target_not_a_stream(target: str, kind: str) -> str:
    return f"{SPARK_PREFIX}cannot write to {target!r}: the key holds a {kind}, not a stream"


def spark_commit_too_large(target: str, rows: int, limit: int) -> str:
    return (
        f"{SPARK_PREFIX}a commit moves at most {limit} rows into one stream; this batch has "
        f"{rows} for {target!r}: use smaller batches (maxOffsetsPerTrigger, fewer rows per write)"
    )


def spark_commit_failed(target: str, batch: int, cause: str) -> str:
    return (
        f"{SPARK_PREFIX}the commit of batch {batch} to {target!r} failed ({cause}); nothing "
        "was appended, and running the batch again commits it once"
    )


def spark_staging_lost(stream: str, expected: int, found: int) -> str:
    return (
        f"{SPARK_PREFIX}staging stream {stream!r} holds {found} messages, the task wrote "
        f"{expected}: the server lost data; the batch fails so Spark can run it again"
    )
