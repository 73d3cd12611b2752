"""Append times survive the AOF (docs/PERSISTENCE.md, append times): the
writes of the C lane and of the command handlers are dated in the AOF, so
after a restart (clean, kill -9, after a rewrite) TSEEK answers what it did
before and retention by age evicts what it would have. Damaged annotations
are handled as any damaged record."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import persistence_in_process, serve_reads, wait_for
from core_recipes import unpack_blobs

from rcp11.commands import execute, serve_ready
from rcp11.errors import PersistenceError
from rcp11.resp import encode_command
from rcp11.retention import Retention
from rcp11.state import ClientState, ServerState
from rcp11.storage import Stream


def next_ms(after: int) -> int:
    """Wait until the wall clock (the server's: same machine) is past
    `after`; the time then. At most a millisecond or two."""
    wait_for(lambda: time.time_ns() // 1_000_000 > after, timeout=5)
    return time.time_ns() // 1_000_000


def write_in_distinct_ms(write: Any, batches: int) -> tuple[int, int]:
    """Call write(i) for i in range(batches), each in a later millisecond
    than the one before. Returns the clock read before the first and
    before the last write (the last is dated at or after it)."""
    first = last = ended = next_ms(time.time_ns() // 1_000_000)
    for i in range(batches):
        # Past the millisecond the previous batch *ended* in: on a busy
        # machine one batch can span several milliseconds.
        last = next_ms(ended) if i else last
        write(i)
        ended = time.time_ns() // 1_000_000
    return first, last


def tseek_answers(seek: Any, keys: list[bytes], span: tuple[int, int]) -> dict[bytes, list[int]]:
    """TSEEK of every millisecond of span (and the one before), per key:
    each answer is a message's offset (the next offset, which a kill -9
    raises to its reservation, is never asked for)."""
    first, last = span
    return {key: [seek(key, ms) for ms in range(first - 1, last + 1)] for key in keys}


# -- in process: a "restart" is a second state loading the same files --------


def open_state(directory: Path, **directives: str) -> tuple[ServerState, Any]:
    state, persistence = persistence_in_process(
        directory,
        appendonly="yes",
        appendfsync="always",
        stream_node_max_entries="8",
        **directives,
    )
    persistence.load()
    state.retention = Retention(state, lambda: serve_ready(state))
    return state, persistence


def seek_in(state: ServerState) -> Any:
    client = ClientState(authenticated=True)
    return lambda key, ms: execute(state, client, [b"TSEEK", key, b"%d" % ms])


def write_both_paths(state: ServerState, i: int) -> None:
    """Batch i: TWRITEs through the C lane (a pipeline of them, one read),
    and through the handlers (a transaction: EXEC runs them)."""
    client = ClientState(authenticated=True)
    pipeline = b"".join(
        encode_command([b"TWRITE", b"lane", b"m%d.%d" % (i, j)]) for j in range(i % 3 + 1)
    )
    pipeline += encode_command([b"TWRITE", b"lane", b"ENTRIES", b"a%d" % i, b"b%d" % i])
    serve_reads(state, client, [pipeline])
    execute(state, client, [b"MULTI"])
    execute(state, client, [b"TWRITE", b"handler", b"h%d" % i])
    execute(state, client, [b"TWRITE", b"handler", b"ENTRIES", b"x%d" % i, b"y%d" % i])
    execute(state, client, [b"EXEC"])
    state.persistence.flush()  # as the server does before it replies


KEYS = [b"lane", b"handler"]


def test_tseek_answers_the_same_after_a_crash_for_lane_and_handler_writes(
    tmp_path: Path,
) -> None:
    state, _ = open_state(tmp_path)
    span = write_in_distinct_ms(lambda i: write_both_paths(state, i), 40)
    before = tseek_answers(seek_in(state), KEYS, span)
    # Sanity: the answers change along the span (the writes are dated).
    assert len(set(before[b"lane"])) > 5 and len(set(before[b"handler"])) > 15
    next_ms(span[1] + 5)  # the replay runs in a later millisecond than any write
    restarted, _ = open_state(tmp_path)
    assert tseek_answers(seek_in(restarted), KEYS, span) == before


def test_the_aof_holds_one_date_per_millisecond_of_writes_not_per_message(
    tmp_path: Path,
) -> None:
    state, _ = open_state(tmp_path)
    write_in_distinct_ms(lambda i: write_both_paths(state, i), 10)
    aof = (tmp_path / "appendonly.aof").read_bytes()
    # Each batch is one millisecond: one date for its lane writes, and the
    # transaction's own (pinned at EXEC, so maybe the same millisecond).
    dates = aof.count(b"#RCP11-MS:")
    assert 10 <= dates <= 20
    assert aof.count(b"TWRITE") == 10 * 2 + sum(i % 3 + 1 for i in range(10)) + 10


def test_retention_by_age_after_a_crash_evicts_what_it_would_have(tmp_path: Path) -> None:
    state, _ = open_state(tmp_path)
    span = write_in_distinct_ms(lambda i: write_both_paths(state, i), 40)
    restarted, _ = open_state(tmp_path)
    middle = (span[0] + span[1]) // 2
    cuts = {}
    for server in (state, restarted):
        server.config.set("stream-retention-ms", "1000")
        while server.retention.step(now_ms=middle + 1000):
            pass
        cuts[id(server)] = [server.keyspace.get(key).first_offset for key in KEYS]
    assert cuts[id(state)] == cuts[id(restarted)]
    assert min(cuts[id(state)]) > 0  # retention did evict


def test_a_clock_behind_the_stream_replays_clamped_as_it_was_appended(tmp_path: Path) -> None:
    # A transaction pinned to a time before the stream's clock: the append
    # counts at the stream's clock, and so does its replay.
    state, _ = open_state(tmp_path)
    client = ClientState(authenticated=True)
    execute(state, client, [b"TWRITE", b"s", b"a"])
    clock = state.keyspace.get(b"s").last_append_ms
    state.append_ms = clock - 5000
    with state.transaction_log():
        execute(state, client, [b"TWRITE", b"s", b"late"])
    state.append_ms = None
    state.persistence.flush()
    assert state.keyspace.get(b"s").last_append_ms == clock
    restarted, _ = open_state(tmp_path)
    stream = restarted.keyspace.get(b"s")
    assert stream.last_append_ms == clock
    assert execute(restarted, client, [b"TSEEK", b"s", b"%d" % clock]) == 0
    assert execute(restarted, client, [b"TSEEK", b"s", b"%d" % (clock + 1)]) == (stream.next_offset)


def write_aof(directory: Path, *records: bytes) -> Path:
    path = directory / "appendonly.aof"
    path.write_bytes(b"".join(records))
    return path


def twrite(key: bytes, *entries: bytes) -> bytes:
    return encode_command([b"TWRITE", key, *entries])


def test_an_aof_written_by_hand_with_dates_replays_them(tmp_path: Path) -> None:
    t = 1_700_000_000_000
    write_aof(
        tmp_path,
        b"#RCP11-MS:%d\r\n" % t,
        twrite(b"s", b"a"),
        twrite(b"s", b"b"),
        b"#TS:1700000001\r\n",  # Redis's own annotation: skipped
        b"#RCP11-MS:%d\r\n" % (t + 10),
        twrite(b"s", b"c"),
        b"#RCP11-MS:%d\r\n" % (t + 5),  # backwards: clamped to the clock
        encode_command([b"MULTI"]),
        twrite(b"s", b"d"),
        b"#RCP11-MS:%d\r\n" % (t + 20),
        twrite(b"t", b"e"),
        encode_command([b"EXEC"]),
    )
    state, _ = open_state(tmp_path)
    # What appending at those times gives (the transaction: at its last).
    s, t_ = Stream(max_entries=8), Stream(max_entries=8)
    for entry, ms in ((b"a", t), (b"b", t), (b"c", t + 10), (b"d", t + 20)):
        s.append([entry], now_ms=ms)
    t_.append([b"e"], now_ms=t + 20)
    seek = seek_in(state)
    times = range(t - 1, t + 22)
    assert [seek(b"s", ms) for ms in times] == [s.seek_time(ms) for ms in times]
    assert [seek(b"t", ms) for ms in times] == [t_.seek_time(ms) for ms in times]
    assert state.keyspace.get(b"s").last_append_ms == t + 20


@pytest.mark.parametrize(
    "value",
    [b"-5", b"12x", b"", b" 12", b"+12", b"9" * 20, b"%d" % 2**63, b"1.5"],
    ids=["negative", "not-digits", "empty", "space", "plus", "huge", "2^63", "decimal"],
)
def test_a_damaged_date_refuses_the_start_as_a_corrupt_record(tmp_path: Path, value: bytes) -> None:
    path = write_aof(
        tmp_path, twrite(b"s", b"a"), b"#RCP11-MS:" + value + b"\r\n", twrite(b"s", b"b")
    )
    with pytest.raises(PersistenceError, match=r"corrupt AOF at byte offset \d+ .*append time"):
        open_state(tmp_path)
    assert path.read_bytes().endswith(twrite(b"s", b"b"))  # nothing was cut


def test_a_torn_date_at_the_end_is_a_torn_tail(tmp_path: Path) -> None:
    t = 1_700_000_000_000
    records = [b"#RCP11-MS:%d\r\n" % t, twrite(b"s", b"a")]
    path = write_aof(tmp_path, *records, b"#RCP11-MS:17000")
    state, _ = open_state(tmp_path)
    assert path.read_bytes() == b"".join(records)
    stream = state.keyspace.get(b"s")
    assert stream.last_append_ms == t and stream.next_offset >= 1
    # New writes go on after the cut, with their own date, at new offsets.
    assert execute(state, ClientState(authenticated=True), [b"TWRITE", b"s", b"b"]) >= 1
    state.persistence.flush()
    assert path.read_bytes().count(b"#RCP11-MS:") == 2


@pytest.mark.parametrize(
    "lines",
    [
        [b"#TS:1700000001\n", b"#RCP11-MS:%d\r\n"],  # another tool's LF line before ours
        [b"#RCP11-MS:%d\n"],  # ours ended by a bare LF, as Redis's loader reads lines
        [b"#note\n", b"#RCP11-MS:%d\n", b"#TS:1700000001\r\n"],
    ],
    ids=["lf-line-then-date", "date-ended-by-lf", "mixed"],
)
def test_an_annotation_line_ends_at_its_lf_and_loses_no_date(
    tmp_path: Path, lines: list[bytes]
) -> None:
    # A line ended by a bare LF must not swallow the next line (the date
    # would be skipped with it and the write replayed at replay time).
    t = 1_700_000_000_000
    records = [line % t if b"%d" in line else line for line in lines]
    path = write_aof(tmp_path, *records, twrite(b"s", b"a"), twrite(b"s", b"b"))
    state, _ = open_state(tmp_path)
    stream = state.keyspace.get(b"s")
    assert stream.next_offset == 2 and stream.last_append_ms == t
    assert path.read_bytes().startswith(b"".join(records))  # nothing was cut


def test_a_date_of_2_63_minus_1_leaves_the_stream_evictable_by_streams_oldest(
    tmp_path: Path,
) -> None:
    # 2^63-1 is the core's "no message" time: a stream whose messages got
    # it was never the oldest, and writes were refused with -OOM instead.
    write_aof(tmp_path, b"#RCP11-MS:%d\r\n" % (2**63 - 1), twrite(b"s", b"ENTRIES", b"a", b"b"))
    state, _ = open_state(tmp_path)
    assert state.keyspace.get(b"s").oldest_append_ms == 2**63 - 2
    state.config.set("maxmemory-policy", "streams-oldest")
    state.config.set("maxmemory", "1")
    client = ClientState(authenticated=True)
    execute(state, client, [b"TWRITE", b"t", b"c"])
    assert state.keyspace.get(b"s").length == 0  # evicted, as every stream's nodes


def test_a_line_too_long_for_an_annotation_is_corrupt(tmp_path: Path) -> None:
    write_aof(tmp_path, twrite(b"s", b"a"), b"#" + b"x" * 300 + b"\r\n")
    with pytest.raises(PersistenceError, match="annotation line too long"):
        open_state(tmp_path)


# -- a real server ----------------------------------------------------------


def write_over_the_network(client: Any, i: int) -> None:
    pipe = client.pipeline(transaction=False)
    for j in range(i % 3 + 1):
        pipe.execute_command("TWRITE", "lane", f"m{i}.{j}")
    pipe.execute()
    tx = client.pipeline(transaction=True)
    tx.execute_command("TWRITE", "handler", "ENTRIES", f"x{i}", f"y{i}")
    tx.execute()


def seek_on(client: Any) -> Any:
    return lambda key, ms: client.execute_command("TSEEK", key, ms)


@pytest.mark.slow
def test_tseek_answers_the_same_after_kill9_and_after_a_clean_restart(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always", stream_node_max_entries=8)
    client = srv.client()
    span = write_in_distinct_ms(lambda i: write_over_the_network(client, i), 40)
    before = tseek_answers(seek_on(client), KEYS, span)
    assert len(set(before[b"lane"])) > 5
    srv.kill9()
    srv.start()
    assert tseek_answers(seek_on(srv.client()), KEYS, span) == before
    srv.restart()
    assert tseek_answers(seek_on(srv.client()), KEYS, span) == before


@pytest.mark.slow
def test_tseek_answers_the_same_after_a_rewrite_more_writes_and_a_restart(
    server_factory,
) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always", stream_node_max_entries=8)
    client = srv.client()
    first = write_in_distinct_ms(lambda i: write_over_the_network(client, i), 20)
    assert client.bgrewriteaof()
    wait_for(
        lambda: (
            client.info("persistence")["aof_rewrite_in_progress"] == 0
            and client.info("persistence")["aof_rewrite_scheduled"] == 0
        )
    )
    second = write_in_distinct_ms(lambda i: write_over_the_network(client, 100 + i), 20)
    span = (first[0], second[1])
    before = tseek_answers(seek_on(client), KEYS, span)
    assert len(set(before[b"lane"])) > 5
    srv.kill9()
    srv.start()
    assert tseek_answers(seek_on(srv.client()), KEYS, span) == before


def times_on(client: Any, keys: list[bytes]) -> dict[bytes, list[Any]]:
    """Every readable message of each key with its append time (the
    offsets a kill -9 skips read as null: left out)."""
    out = {}
    for key in keys:
        info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
        reply = client.execute_command("TREAD", key, info[0], info[1] + 1, "WITHTIMES")
        out[key] = [(m, t) for m, t in zip(reply[0::2], reply[1::2], strict=True) if m is not None]
    return out


@pytest.mark.slow
def test_every_message_keeps_its_time_through_a_snapshot_and_the_aof(server_factory) -> None:
    srv = server_factory(appendonly="yes", appendfsync="always", stream_node_max_entries=8)
    client = srv.client()
    write_in_distinct_ms(lambda i: write_over_the_network(client, i), 20)
    before = times_on(client, KEYS)
    assert len({t for _, t in before[b"lane"]}) > 10  # a time per write, within nodes
    srv.kill9()
    srv.start()  # the AOF
    assert times_on(srv.client(), KEYS) == before
    srv.client().save()
    srv.restart(appendonly="no")  # the snapshot
    assert times_on(srv.client(), KEYS) == before


def snapshot_file(streams: dict[bytes, list[bytes]]) -> bytes:
    """A snapshot (rcp11/persistence/snapshot.py's format) holding these
    streams as the given blobs, whatever their format version. Its CRC32
    covers everything but the blobs, which carry their own."""
    parts: list[tuple[bytes, bool]] = [(b"RCP11SNAP" + struct.pack("<HQ", 1, 0), True)]
    for key, blobs in streams.items():
        parts.append((b"T" + struct.pack("<I", len(key)) + key, True))
        for blob in blobs:
            parts += [(struct.pack("<Q", len(blob)), True), (blob, False)]
        parts.append((struct.pack("<Q", 2**64 - 1), True))
    parts.append((b"E", True))
    crc = 0
    for data, checked in parts:
        crc = zlib.crc32(data, crc) if checked else crc
    return b"".join(data for data, _ in parts) + struct.pack("<I", crc)


@pytest.mark.slow
def test_a_snapshot_from_before_per_message_times_loads(server_factory) -> None:
    """Format-3 streams (every 64th time of a node kept) load with the times
    the core gives them (tests/test_core_time.py); saved again, they keep
    them; new messages are exact."""
    v3 = Path(__file__).resolve().parent / "data" / "macronode-v3"
    dumps = {name: unpack_blobs((v3 / f"{name.decode()}.bin").read_bytes()) for name in KEYS_V3}
    srv = server_factory(start=False)
    (srv.dir / "dump.rcp").write_bytes(snapshot_file(dumps))
    srv.start()
    expected = {}
    for key, blobs in dumps.items():
        s = Stream.load(blobs)
        start, n = s.first_offset, s.next_offset - s.first_offset
        expected[key] = list(zip(s.read(start, n), s.read_times(start, n), strict=True))
    assert times_on(srv.client(), list(KEYS_V3)) == expected
    srv.client().save()
    srv.restart()
    client = srv.client()
    assert times_on(client, list(KEYS_V3)) == expected
    before = time.time_ns() // 1_000_000
    offset = client.execute_command("TWRITE", "timed", "new")
    assert before <= client.execute_command("TREAD", "timed", offset, 1, "WITHTIMES")[1]


KEYS_V3 = (b"timed", b"zlib_nodes")
