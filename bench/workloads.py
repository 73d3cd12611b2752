"""Jobs for the common stream workloads: batched producers and consumers."""

from __future__ import annotations

import random

from bench.loadgen import Job, chunked, group
from bench.resp import bulk_element_size, encode_batch_write, encode_command
from bench.servers import Server

# A send buffer of about this size amortises the syscalls without making the
# pipeline window coarse.
SEND_BUFFER = 256 * 1024


def payload(size: int, seed: int = 11) -> bytes:
    """Deterministic incompressible bytes, so no server gets a free ride."""
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def batch_writer(
    port: int,
    key: bytes,
    records: int,
    batch: int,
    size: int,
    command: bytes = b"TWRITE",
    window: int = 16,
) -> Job:
    """`records` messages as `TWRITE key ENTRIES <batch x size>` (or RPUSH).

    `records` is rounded down to whole batches; the job's `entries` says
    how many are really written.
    """
    cmd = encode_batch_write(command, key, payload(size), batch)
    commands = max(1, records // batch)
    per_chunk = max(1, SEND_BUFFER // len(cmd))
    return Job(
        port,
        chunked(cmd, commands, per_chunk),
        ("lines", 1),
        entries=commands * batch,
        window=max(window, per_chunk),
    )


def single_writer(port: int, args: list[bytes], records: int, lines_per_reply: int = 1) -> Job:
    """One message per command (XADD or single-entry TWRITE), pipelined."""
    cmd = encode_command(*args)
    per_chunk = max(1, min(1000, SEND_BUFFER // len(cmd)))
    return Job(
        port,
        chunked(cmd, records, per_chunk),
        ("lines", lines_per_reply),
        entries=records,
        window=max(256, per_chunk),
    )


def range_reader(
    port: int,
    key: bytes,
    start: int,
    records: int,
    size: int,
    count: int = 1000,
    window: int = 32,
    style: str = "tread",
) -> Job:
    """Read offsets start..start+records-1 with `count`-sized pipelined reads.

    style "tread": `TREAD key off n`; style "lrange": `LRANGE key off off+n-1`
    (a Redis list as the reference for the same data).
    """
    commands = []
    for off in range(start, start + records, count):
        n = min(count, start + records - off)
        if style == "tread":
            commands.append(encode_command(b"TREAD", key, off, n))
        else:
            commands.append(encode_command(b"LRANGE", key, off, off + n - 1))
    return Job(
        port,
        group(commands, 4),
        ("array", bulk_element_size(size)),
        entries=records,
        window=window,
    )


def follower(port: int, key: bytes, records: int, size: int, count: int = 1000) -> Job:
    """A consumer that follows a growing stream with TREAD ... BLOCK 0."""
    return Job(
        port,
        reply=("array", bulk_element_size(size)),
        entries=records,
        mode="follow",
        follow_key=key,
        follow_start=0,
        follow_count=count,
    )


def stream_info(server: Server, key: bytes) -> tuple[int, int]:
    """(first_offset, next_offset) of an rcp11 stream, via TREAD WITHINFO."""
    reply = server.call(b"TREAD", key, 0, 0, b"WITHINFO")
    assert isinstance(reply, list) and reply, f"unexpected TREAD WITHINFO reply {reply!r}"
    first, last = reply[0][0], reply[0][1]
    return int(first), int(last) + 1


def check_written(server: Server, key: bytes, expected_next: int) -> None:
    """Fail loudly when the server acknowledged writes it does not hold."""
    _, next_offset = stream_info(server, key)
    if next_offset != expected_next:
        raise RuntimeError(f"{key!r}: next offset {next_offset}, expected {expected_next}")
