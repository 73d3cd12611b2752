"""Failure behaviour of the Spark data source's parts, without a Spark
session: the sink's commit protocol (replayed batches, staging left by a
dead driver, a server that lost staged rows), reconnecting tasks, and the
error after retryTimeoutMs. The same code runs inside Spark in
test_spark.py and test_spark_recovery.py."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest
from conftest import ServerProcess, free_port, start_with_gaps
from helpers_crash import as_if_rebooted
from redis.crc import key_slot

from rcp11.client import Client
from rcp11.spark import columns
from rcp11.spark import commit as commit_module
from rcp11.spark.columns import Projection, WriteLayout
from rcp11.spark.commit import Staged, StagedWrite, commit, commit_target, hash_tag, sink_key
from rcp11.spark.connection import ServerUnreachableError, Session
from rcp11.spark.options import Endpoint, WriteOptions, parse_read_options
from rcp11.spark.planning import ReadRange
from rcp11.spark.sink import TaskWriter
from rcp11.spark.source import read_range

QUERY = "query-1"
NONCES = itertools.count()


@pytest.fixture
def client(shared_server: ServerProcess) -> Client:
    c = Client(port=shared_server.port)
    c.flushall()
    yield c
    c.close()


def stage(client: Client, target: str, batch: int, partition: int, values: list[bytes]) -> Staged:
    """What a task does: register a staging stream, then write it."""
    key = sink_key(target, QUERY, f"{batch}:{partition}:0:{next(NONCES):08x}")
    client.twrite(sink_key(target, QUERY, "staged"), f"{batch} {key}")
    if values:
        client.twrite(key, *values)
    return Staged(target, key, len(values))


def staging_left(client: Client) -> list[bytes]:
    """Sink keys other than progress keys and registries."""
    return [k for k in client.keys("rcp11-sink:*") if not k.endswith((b":progress", b":staged"))]


def registered(client: Client, target: str) -> list[bytes]:
    registry = sink_key(target, QUERY, "staged")
    return [m for m in client.tread(registry, 0, 100) if m is not None]


def stream(client: Client, key: str) -> list[bytes]:
    return [m for m in client.tread(key, 0, 100_000) if m is not None]


def test_keys_share_the_target_hash_slot() -> None:
    assert hash_tag("events") == "events"
    assert hash_tag("user:{42}:events") == "42"
    assert hash_tag("a{}b") == "a{}b" and hash_tag("a{b") == "a{b"
    assert sink_key("events", "q", "progress") == "rcp11-sink:{events}:q:progress"
    key = sink_key("user:{42}:events", "q", "staged")
    assert key == "rcp11-sink:{42}:user:{42}:events:q:staged" and hash_tag(key) == "42"
    # Every sink key lands in its target's Redis Cluster slot, whatever the
    # braces in the target's name (a '}' would end a {whole name} early).
    for target in ("events", "u:{42}:e", "a{}b", "a}b", "{}x", "{{a}", "x{y", "}", "{", "é}"):
        for suffix in ("progress", "staged", "3:0:0:ab12cd34"):
            assert key_slot(sink_key(target, "q", suffix).encode()) == key_slot(target.encode())


def test_commit_then_replay_of_the_same_batch(client: Client) -> None:
    client.twrite("target", b"before")
    first = [stage(client, "target", 3, p, [b"p%d-%d" % (p, i) for i in range(3)]) for p in (1, 0)]
    commit_target(client, "target", QUERY, 3, first)
    expected = [b"before"] + [b"p1-%d" % i for i in range(3)] + [b"p0-%d" % i for i in range(3)]
    assert stream(client, "target") == expected
    assert client.get(sink_key("target", QUERY, "progress")) == f"3 {first[0].key}".encode()
    assert staging_left(client) == []
    # The driver died before Spark recorded the commit: batch 3 runs again.
    again = [stage(client, "target", 3, p, [b"p%d-%d" % (p, i) for i in range(3)]) for p in (0, 1)]
    commit_target(client, "target", QUERY, 3, again)
    assert stream(client, "target") == expected
    assert staging_left(client) == []


def test_commit_drops_staging_of_failed_attempts_and_dead_drivers(client: Client) -> None:
    dead_driver = stage(client, "t", 5, 0, [b"x", b"y"])  # batch 5 of a driver that died
    older = stage(client, "t", 4, 1, [b"old"])  # left by an even earlier run
    retried = stage(client, "t", 5, 1, [b"half"])  # a failed task attempt
    kept = stage(client, "t", 6, 0, [b"next"])  # a later batch already staging
    good = [stage(client, "t", 5, 0, [b"a"]), stage(client, "t", 5, 1, [b"b"])]
    commit_target(client, "t", QUERY, 5, good)
    assert stream(client, "t") == [b"a", b"b"]
    assert client.exists(dead_driver.key, older.key, retried.key) == 0
    assert stream(client, kept.key) == [b"next"]
    # Batch 6's staging stays registered; batch 5's committed ones until the
    # next commit (they are gone already: TCONCAT deleted them).
    assert registered(client, "t") == [f"6 {kept.key}".encode()] + [
        f"5 {s.key}".encode() for s in good
    ]
    assert client.exists(*(s.key for s in good)) == 0


def test_commit_refuses_staging_that_lost_rows(client: Client) -> None:
    short = stage(client, "t", 0, 0, [b"a", b"b"])
    claimed = Staged("t", short.key, 3)  # the task wrote 3; the server has 2
    with pytest.raises(RuntimeError, match="holds 2 messages, the task wrote 3"):
        commit_target(client, "t", QUERY, 0, [claimed])
    assert client.exists("t") == 0
    client.tevict(short.key, 0)  # the first message is gone
    with pytest.raises(RuntimeError, match="the server lost data"):
        commit_target(client, "t", QUERY, 0, [short])


def test_a_batch_too_large_for_one_tconcat_is_refused(client: Client, monkeypatch) -> None:
    monkeypatch.setattr(commit_module, "TCONCAT_MAX_MESSAGES", 5)
    staged = [stage(client, "t", 0, p, [b"%d-%d" % (p, i) for i in range(3)]) for p in range(2)]
    with pytest.raises(RuntimeError, match="a commit moves at most 5 rows"):
        commit_target(client, "t", QUERY, 0, staged)
    assert client.exists("t") == 0 and client.exists(*(s.key for s in staged)) == 2


def test_a_target_holding_a_string_is_refused_before_anything_changes(client: Client) -> None:
    client.set("t", "text")
    staged = [stage(client, "t", 0, 0, [b"a"])]
    with pytest.raises(RuntimeError, match="holds a string, not a stream"):
        commit_target(client, "t", QUERY, 0, staged)
    assert client.exists(sink_key("t", QUERY, "progress")) == 0


def test_a_tconcat_failing_inside_exec_is_not_taken_for_a_commit(
    client: Client, shared_server: ServerProcess, monkeypatch
) -> None:
    """TCONCAT can fail at run time inside EXEC (MISCONF when the offsets file
    cannot be written) while SET progress still runs: the marker in the
    progress key tells the replay that the batch is not in the target."""
    client.twrite("t", b"old")
    first = [stage(client, "t", 7, 0, [b"a", b"b"])]
    # The target turns into a string between the checks and EXEC.
    monkeypatch.setattr(commit_module, "_check_target", lambda c, t, s: c.set("t", "x"))
    with pytest.raises(RuntimeError, match="the commit of batch 7 to 't' failed"):
        commit_target(client, "t", QUERY, 7, first)
    assert client.get(sink_key("t", QUERY, "progress")) == f"7 {first[0].key}".encode()
    assert not commit_module.committed(client, sink_key("t", QUERY, "progress"), 7)
    # Spark aborts the batch: the marker stays.
    options = WriteOptions(Endpoint(port=shared_server.port), "t")
    commit_module.abort(options, [StagedWrite(QUERY, 7, 0, first)], 7)
    assert client.exists(first[0].key) == 1
    # Fixed and run again: the batch lands once, the first attempt's staging goes.
    monkeypatch.undo()
    client.delete("t")
    client.twrite("t", b"old")
    again = [stage(client, "t", 7, 0, [b"a", b"b"])]
    commit_target(client, "t", QUERY, 7, again)
    assert stream(client, "t") == [b"old", b"a", b"b"]
    assert staging_left(client) == []
    commit_target(client, "t", QUERY, 7, [stage(client, "t", 7, 0, [b"a", b"b"])])
    assert stream(client, "t") == [b"old", b"a", b"b"]


def test_batch_write_commit_without_progress_key(
    client: Client, shared_server: ServerProcess
) -> None:
    staged = stage(client, "t", 0, 0, [b"a"])
    options = WriteOptions(Endpoint(port=shared_server.port), "t")
    commit(options, [StagedWrite(QUERY, 0, 0, [staged]), None], None)
    assert stream(client, "t") == [b"a"]
    assert client.keys("rcp11-sink:*") == []


# ---------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------


def kill_other_clients(client: Client) -> int:
    mine = client.client_id()
    killed = 0
    for entry in client.client_list():
        if int(entry["id"]) != mine:
            client.client_kill_filter(_id=entry["id"])
            killed += 1
    return killed


def write_rounds(writer: TaskWriter, after_round: Any) -> list[bytes]:
    """Five rounds of 40 rows through a task writer (7 rows per TWRITE),
    after_round(n) after each; returns the rows in order."""
    expected = []
    for round_ in range(5):
        values = [b"r%d-%d" % (round_, i) for i in range(40)]
        expected += values
        writer.add(pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"]))
        after_round(round_)
    return expected


def test_task_writer_resends_only_what_the_server_did_not_get(client, shared_server) -> None:
    options = WriteOptions(Endpoint(port=shared_server.port, retry_backoff_ms=1), "t", batch_size=7)
    writer = TaskWriter(options, WriteLayout(0, None, None), QUERY)

    def break_connection(round_: int) -> None:
        if round_ == 0:
            assert writer.in_flight  # TWRITEs whose replies were not read yet
            assert kill_other_clients(client) == 1
        else:
            # The connection may already be dead (a send into a closed
            # socket can succeed): kill it if it is not.
            kill_other_clients(client)

    expected = write_rounds(writer, break_connection)
    result = writer.finish()
    (staged,) = result.staged
    assert staged.rows == 200
    assert stream(client, staged.key) == expected


def test_a_range_read_reconnects_and_reads_every_message_once(
    client, shared_server, monkeypatch
) -> None:
    monkeypatch.setattr(columns, "ARROW_BATCH_ROWS", 100)  # a batch per reply
    client.twrite("s", *[b"%d" % i for i in range(5000)])
    read = parse_read_options(
        {"port": str(shared_server.port), "subscribe": "s", "batchSize": "100"}
    )
    batches = read_range(read, Projection(), ReadRange("s", 0, 5000, 0))
    offsets = next(batches).column(1).to_pylist()
    assert kill_other_clients(client) == 1
    for batch in batches:
        offsets += batch.column(1).to_pylist()
    assert offsets == list(range(5000))


def test_a_short_outage_is_ridden_out(server_factory, monkeypatch) -> None:
    monkeypatch.setattr(columns, "ARROW_BATCH_ROWS", 50)
    server = server_factory(appendonly="yes")
    Client(port=server.port).twrite("s", *[b"%d" % i for i in range(300)])
    read = parse_read_options({"port": str(server.port), "subscribe": "s", "batchSize": "50"})
    batches = read_range(read, Projection(), ReadRange("s", 0, 300, 0))
    first = next(batches)
    server.kill9()
    server.start()
    rest = [b.num_rows for b in batches]
    assert first.num_rows + sum(rest) == 300


def test_an_outage_longer_than_retry_timeout_fails_clearly() -> None:
    port = free_port()  # nothing listens here
    session = Session(Endpoint(port=port, retry_timeout_ms=300, retry_backoff_ms=50))
    with pytest.raises(ServerUnreachableError) as info:
        session.call("planning a micro-batch", lambda c: c.ping())
    text = str(info.value)
    assert f"cannot reach the server at 127.0.0.1:{port}" in text
    assert "while planning a micro-batch (retryTimeoutMs)" in text


# ----------------------------------------- a gap after a server restart is no loss


def test_commit_counts_what_a_staging_stream_holds_not_its_next_offset(server_factory) -> None:
    """A server restart that could not trust its AOF raises each stream to
    its reservation mark: a staging stream then has a gap of nulls after
    its rows (or between two runs of them, when the task wrote on after
    the restart). Nothing is lost: the commit moves every row once."""
    srv = server_factory(appendonly="yes", start=False)
    tail_gap = sink_key("t", QUERY, "0:0:0:aaaa")
    middle_gap = sink_key("t", QUERY, "0:1:0:bbbb")
    start_with_gaps(srv, {tail_gap.encode(): (3, 1024, 0), middle_gap.encode(): (2, 5000, 2)})
    client = Client(port=srv.port)
    for key in (tail_gap, middle_gap):
        client.twrite(sink_key("t", QUERY, "staged"), f"0 {key}")
    lost_row = Staged("t", middle_gap, 5, ((0, 2), (5000, 3)))  # claims a row that is not there
    with pytest.raises(RuntimeError, match="holds 4 messages, the task wrote 5"):
        commit_target(client, "t", QUERY, 0, [lost_row])
    staged = [Staged("t", tail_gap, 3), Staged("t", middle_gap, 4, ((0, 2), (5000, 2)))]
    commit_target(client, "t", QUERY, 0, staged)
    assert stream(client, "t") == [b"a0", b"a1", b"a2", b"a0", b"a1", b"b0", b"b1"]
    assert staging_left(client) == []
    client.close()


def test_task_writer_rides_out_a_restart_that_leaves_a_gap(server_factory) -> None:
    """kill -9 while TWRITEs are in flight, and a restart that raises the
    staging stream to its mark (as after a reboot under everysec): the task
    counts the in-flight TWRITEs the server kept, sends the others again
    (they land after the gap) and reports both runs; the commit moves every
    row exactly once."""
    srv = server_factory(appendonly="yes", appendfsync="everysec")
    options = WriteOptions(Endpoint(port=srv.port, retry_backoff_ms=20), "t", batch_size=7)
    writer = TaskWriter(options, WriteLayout(0, None, None), QUERY)

    def restart_as_after_a_reboot(round_: int) -> None:
        if round_ == 1:
            assert writer.in_flight
            srv.kill9()
            as_if_rebooted(srv.dir)
            srv.start()

    expected = write_rounds(writer, restart_as_after_a_reboot)
    result = writer.finish()
    (staged,) = result.staged
    assert staged.rows == 200
    assert len(staged.runs) == 2  # before the gap, and after it
    client = Client(port=srv.port)
    assert stream(client, staged.key) == expected
    commit_target(client, "t", QUERY, 0, [staged])
    assert stream(client, "t") == expected
    client.close()


def _micro_batches(source: Any, start: dict, limit: Any) -> list[list[tuple[str, int]]]:
    """What Spark does with a source: latestOffset() from the last end, and
    a micro-batch (partitions() read) whenever the end moved; each batch's
    (stream, offset) rows."""
    batches = []
    for _ in range(50):
        end = source.latestOffset(start, limit)
        if end == start:
            return batches
        rows: list[tuple[str, int]] = []
        for part in source.partitions(start, end):
            assert part.start >= start[part.stream]
            for batch in source.read(part):
                rows += zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
        batches.append(rows)
        start = end
    raise AssertionError("still planning micro-batches after 50")


def test_micro_batches_step_over_a_gap_a_crash_left(server_factory) -> None:
    """A restart that raised a stream to its reservation mark leaves a gap
    of nulls (here 997 offsets): with maxOffsetsPerTrigger 10 the source
    used to plan ~100 micro-batches of no rows through it, and one more
    for a gap at a stream's end. It plans from the next readable offset
    (TREAD ... NONULLS): no micro-batch without a row."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from rcp11.spark.source import StreamReader

    srv = server_factory(appendonly="yes", start=False)
    start_with_gaps(srv, {b"mid": (3, 1000, 3), b"tail": (3, 1000, 0)})
    options = {
        "port": str(srv.port),
        "subscribe": "mid,tail",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "10",
    }
    mid = [("mid", o) for o in (0, 1, 2, 1000, 1001, 1002)]
    tail = [("tail", o) for o in (0, 1, 2)]

    source = StreamReader(parse_read_options(options), None)
    start = source.initialOffset()
    assert start == {"mid": 0, "tail": 0}
    batches = _micro_batches(source, start, ReadMaxRows(10))
    assert all(batches) and sorted(sum(batches, [])) == mid + tail
    assert len(batches) == 2  # 10 offsets of each stream; then the rest of mid
    # The gap at tail's end made no batch; a message after it makes one,
    # whose read starts after the gap.
    end = source.latestOffset({"mid": 1003, "tail": 5}, ReadMaxRows(10))
    assert end == {"mid": 1003, "tail": 5}
    client = Client(port=srv.port)
    client.twrite("tail", b"late")
    end = source.latestOffset({"mid": 1003, "tail": 5}, ReadMaxRows(10))
    assert end == {"mid": 1003, "tail": 1001}
    (part,) = source.partitions({"mid": 1003, "tail": 5}, end)
    assert (part.stream, part.start, part.end) == ("tail", 1000, 1001)

    # Trigger.AvailableNow: a message written after the run started, past
    # a gap that reaches the run's end, makes no batch of no rows either.
    source = StreamReader(parse_read_options(options), None)
    source.prepareForTriggerAvailableNow()
    client.twrite("tail", b"later")
    batches = _micro_batches(source, {"mid": 0, "tail": 5}, ReadMaxRows(10))
    assert all(batches) and sorted(sum(batches, [])) == mid + [("tail", 1000)]
    client.close()


class _OldServer:
    """A proxy to a real server that answers TREAD ... PACKED (or another
    option) as a server from before it does ("unknown option"), and passes
    everything else through: the shape of a Spark package newer than its
    server."""

    def __init__(self, upstream_port: int, option: bytes = b"PACKED") -> None:
        import socket
        import threading

        self.upstream_port = upstream_port
        self.option = option
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._serve, args=(conn, upstream), daemon=True).start()

    def _serve(self, conn: Any, upstream: Any) -> None:
        import hiredis

        from rcp11.resp import encode_command

        requests, replies = hiredis.Reader(), hiredis.Reader()
        with conn, upstream:
            while data := conn.recv(1 << 16):
                requests.feed(data)
                while (argv := requests.gets()) is not False:
                    if any(arg.upper() == self.option for arg in argv):
                        self.refused += 1
                        conn.sendall(b"-ERR syntax error, unknown option '%b'\r\n" % self.option)
                        continue
                    upstream.sendall(encode_command(argv))
                    raw = b""
                    while True:
                        chunk = upstream.recv(1 << 16)
                        raw += chunk
                        replies.feed(chunk)
                        if replies.gets() is not False:
                            break
                    conn.sendall(raw)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("times", [False, True])
def test_a_server_without_packed_reads_are_read_one_element_per_offset(
    client, shared_server, times
) -> None:
    """The source asks for PACKED replies (docs/PROTOCOL.md); a server from
    before them refuses the option, and the source reads on without it:
    the same rows."""
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType, TimestampType

    client.twrite("s", *[b"m%d" % i for i in range(250)])
    client.tevict("s", 9)
    old = _OldServer(shared_server.port)
    try:
        fields = [StructField("offset", LongType()), StructField("value", BinaryType())]
        if times:
            fields.append(StructField("timestamp", TimestampType()))
        projection = Projection.from_schema(StructType(fields))
        read = parse_read_options({"port": str(old.port), "subscribe": "s", "batchSize": "100"})
        batches = list(read_range(read, projection, ReadRange("s", 0, 250, 10)))
    finally:
        old.close()
    assert old.refused == 3  # the requests in flight at the first reply
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(10, 250))
    assert table.column("value").to_pylist() == [b"m%d" % i for i in range(10, 250)]
    if times:
        expected = client.tread("s", 10, 240, withtimes=True)
        stamps = [t // 1000 for t in table.column("timestamp").cast(pa.int64()).to_pylist()]
        assert stamps == [t for _, t in expected]


def test_a_server_without_nonulls_is_planned_without_it(client, shared_server) -> None:
    """Planning asks for the next readable offset with NONULLS; a server
    from before it refuses the option, and planning goes on without it."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rcp11.spark.source import StreamReader

    client.twrite("s", *[b"m%d" % i for i in range(5)])
    old = _OldServer(shared_server.port, b"NONULLS")
    try:
        read = parse_read_options({"port": str(old.port), "subscribe": "s"})
        source = StreamReader(read, None)
        assert source.latestOffset({"s": 2}, ReadAllAvailable()) == {"s": 5}
        source.stop()
    finally:
        old.close()
    assert old.refused == 1
