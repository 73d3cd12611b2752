"""What Redis operators point at a server, against rcp11-server: SLOWLOG,
LATENCY and ROLE side by side with redis-server 7 (the same commands, the
same reply shapes and errors), INFO memory's used_memory, redis-cli
--bigkeys / --memkeys, and Debian's prometheus-redis-exporter scraping it
cleanly."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    RawClient,
    RedisServer,
    ServerProcess,
    free_port,
    mbulk,
    parse_reply,
    redis_cli,
    require,
    wait_for,
)


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("ours")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """redis-server 7 of this file's own (its slow log and latency settings
    change), DEBUG SLEEP allowed to make latency."""
    require("redis-server")
    server = RedisServer(tmp_path_factory.mktemp("theirs"), enable_debug_command="yes").start()
    yield server
    server.stop()


@pytest.fixture
def both(ours: ServerProcess, theirs: RedisServer) -> Iterator[tuple[RawClient, RawClient]]:
    """Raw clients of both servers, each flushed, slow log and latency data
    emptied and their settings back at the defaults afterwards."""
    pair = (RawClient(ours.port), RawClient(theirs.port))
    for conn in pair:
        conn.call("FLUSHALL")
    yield pair
    for conn in pair:
        conn.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")
        conn.call("CONFIG", "SET", "slowlog-max-len", "128")
        conn.call("CONFIG", "SET", "latency-monitor-threshold", "0")
        conn.call("SLOWLOG", "RESET")
        conn.call("LATENCY", "RESET")
        conn.close()


def on_both(pair: tuple[RawClient, RawClient], *argv: Any) -> tuple[bytes, bytes]:
    mine, real = (conn.call(*argv) for conn in pair)
    return mine, real


def same(pair: tuple[RawClient, RawClient], *argv: Any) -> bytes:
    mine, real = on_both(pair, *argv)
    assert mine == real, f"reply to {argv} differs: {mine!r} != {real!r}"
    return mine


def entry_shape(entry: list[Any]) -> list[Any]:
    """A SLOWLOG GET entry with what differs from server to server (id,
    time, duration, client port) replaced by its kind."""
    _id, when, usec, argv, addr, name = entry
    assert isinstance(_id, int) and isinstance(usec, int)
    assert abs(when - time.time()) < 60
    host = addr.rsplit(b":", 1)[0]
    return ["id", "time", "usec", argv, host, name]


# ---------------------------------------------------------------------- SLOWLOG


def test_slowlog_entries_as_redis_shows_them(both: tuple[RawClient, RawClient]) -> None:
    same(both, "CONFIG", "SET", "slowlog-log-slower-than", "0")
    same(both, "SLOWLOG", "RESET")
    same(both, "SET", "k", "v")
    same(both, "MSET", *[f"key{i}" for i in range(40)])  # 41 arguments: cut at 32
    same(both, "SET", "long", "x" * 300)  # cut at 128 bytes
    same(both, "CLIENT", "SETNAME", "operator")
    same(both, "GET", "k")
    mine, real = on_both(both, "SLOWLOG", "GET", "-1")
    assert [entry_shape(e) for e in parse_reply(mine)] == [
        entry_shape(e) for e in parse_reply(real)
    ]
    newest = parse_reply(mine)[0]
    assert newest[3] == [b"GET", b"k"] and newest[5] == b"operator"
    ids = [e[0] for e in parse_reply(mine)]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    # LEN counts the GETs logged since; GET's default count is 10.
    same(both, "SLOWLOG", "LEN")
    mine, real = on_both(both, "SLOWLOG", "GET")
    assert len(parse_reply(mine)) == len(parse_reply(real))
    same(both, "SLOWLOG", "GET", "0")
    same(both, "SLOWLOG", "RESET")
    same(both, "SLOWLOG", "LEN")  # the RESET itself, logged after it ran


def test_slowlog_hides_passwords_as_redis(both: tuple[RawClient, RawClient]) -> None:
    """A password given to CONFIG SET (alone or among other directives, in
    any case), AUTH or HELLO never shows in the slow log: an operator may
    read it who must not learn the password."""
    same(both, "CONFIG", "SET", "slowlog-log-slower-than", "0")
    same(both, "SLOWLOG", "RESET")
    same(both, "CONFIG", "SET", "requirepass", "s3cret-one")
    same(both, "AUTH", "s3cret-one")
    same(both, "CONFIG", "SET", "maxmemory", "0", "REQUIREPASS", "s3cret-two")
    same(both, "AUTH", "default", "s3cret-two")
    on_both(both, "HELLO", "2", "AUTH", "default", "s3cret-two")
    same(both, "CONFIG", "SET", "requirepass", "")
    mine, real = on_both(both, "SLOWLOG", "GET", "-1")
    assert b"s3cret" not in mine
    assert [entry_shape(e) for e in parse_reply(mine)] == [
        entry_shape(e) for e in parse_reply(real)
    ]


def test_slowlog_bounds_and_thresholds_as_redis(both: tuple[RawClient, RawClient]) -> None:
    same(both, "CONFIG", "SET", "slowlog-log-slower-than", "0")
    same(both, "CONFIG", "SET", "slowlog-max-len", "3")
    for i in range(6):
        same(both, "SET", f"k{i}", "v")
    same(both, "SLOWLOG", "LEN")
    same(both, "CONFIG", "SET", "slowlog-log-slower-than", "-1")  # off
    same(both, "SLOWLOG", "RESET")
    same(both, "SET", "k", "v")
    same(both, "SLOWLOG", "LEN")
    same(both, "CONFIG", "SET", "slowlog-log-slower-than", "1000000000")
    same(both, "SET", "k", "v")
    same(both, "SLOWLOG", "LEN")
    for name in ("slowlog-log-slower-than", "slowlog-max-len", "latency-monitor-threshold"):
        same(both, "CONFIG", "SET", name, "-2")
        same(both, "CONFIG", "SET", name, "x")
    # EXEC is not logged, the commands it ran are.
    same(both, "CONFIG", "SET", "slowlog-log-slower-than", "0")
    same(both, "CONFIG", "SET", "slowlog-max-len", "128")
    same(both, "SLOWLOG", "RESET")
    for argv in (["MULTI"], ["SET", "t", "1"], ["EXEC"]):
        same(both, *argv)
    mine, real = on_both(both, "SLOWLOG", "GET", "-1")
    commands = [e[3][0].lower() for e in parse_reply(mine)]
    assert commands == [e[3][0].lower() for e in parse_reply(real)]
    assert b"exec" not in commands and b"set" in commands


@pytest.mark.parametrize(
    "argv",
    [
        ["SLOWLOG"],
        ["SLOWLOG", "NOSUCH"],
        ["SLOWLOG", "GET", "-2"],
        ["SLOWLOG", "GET", "abc"],
        ["SLOWLOG", "GET", "99999999999999999999"],
        ["SLOWLOG", "GET", "1", "2"],
        ["SLOWLOG", "LEN", "x"],
        ["SLOWLOG", "RESET", "x"],
        ["SLOWLOG", "HELP"],
        ["LATENCY"],
        ["LATENCY", "NOSUCH"],
        ["LATENCY", "LATEST", "x"],
        ["LATENCY", "HISTORY"],
        ["LATENCY", "HISTORY", "nosuch"],
        ["LATENCY", "DOCTOR", "x"],
        ["LATENCY", "RESET", "a", "b"],
        ["LATENCY", "LATEST"],
        ["ROLE"],
        ["ROLE", "x"],
        ["CONFIG", "GET", "slowlog*"],
        ["CONFIG", "GET", "latency-monitor-threshold"],
    ],
)
def test_replies_and_errors_as_redis(both: tuple[RawClient, RawClient], argv: list[str]) -> None:
    if argv[0] == "CONFIG":
        mine, real = on_both(both, *argv)
        assert dict(zip(*[iter(parse_reply(mine))] * 2, strict=True)) == dict(
            zip(*[iter(parse_reply(real))] * 2, strict=True)
        )
        return
    same(both, *argv)


def test_the_c_lane_logs_its_slow_commands_with_their_arguments(ours: ServerProcess) -> None:
    """TWRITE and TREAD pipelined run in the C lane: each is in the slow log
    all the same, in order, with its arguments."""
    conn = RawClient(ours.port)
    try:
        conn.call("FLUSHALL")
        conn.call("TWRITE", "s", "first")  # the stream exists: the lane runs
        conn.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
        conn.call("SLOWLOG", "RESET")
        requests = [["TWRITE", "s", f"m{i}"] for i in range(20)] + [["TREAD", "s", "0", "3"]]
        conn.send(b"".join(mbulk(*argv) for argv in requests))
        replies = [conn.reply_bytes() for _ in requests]
        assert replies[-1] == b"*3\r\n$5\r\nfirst\r\n$2\r\nm0\r\n$2\r\nm1\r\n"
        logged = [e[3] for e in reversed(parse_reply(conn.call("SLOWLOG", "GET", "-1")))]
        assert logged[1:] == [[a.encode() for a in argv] for argv in requests]
        assert int(ours.client().info("commandstats")["cmdstat_twrite"]["calls"]) >= 21
    finally:
        conn.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")
        conn.close()


# ---------------------------------------------------------------------- LATENCY


def test_latency_events_as_redis_keeps_them(both: tuple[RawClient, RawClient]) -> None:
    same(both, "CONFIG", "SET", "latency-monitor-threshold", "1")
    ours, theirs = both
    # A command of 20 ms or more on each: redis-server sleeps, rcp11-server
    # appends half a million messages.
    theirs.call("DEBUG", "SLEEP", "0.02")
    ours.call("TWRITE", "big", "ENTRIES", *[b"x"] * 500_000)
    mine, real = on_both(both, "LATENCY", "LATEST")
    (event,) = parse_reply(mine)
    (redis_event,) = parse_reply(real)
    assert event[0] in (b"command", b"fast-command") and redis_event[0] == b"command"
    name, when, latest, highest = event
    assert abs(when - time.time()) < 60 and latest >= 1 and highest >= latest
    assert [type(v) for v in event] == [type(v) for v in redis_event]
    history = parse_reply(ours.call("LATENCY", "HISTORY", name))
    assert history == [[when, latest]]
    assert [
        [type(v) for v in s] for s in parse_reply(theirs.call("LATENCY", "HISTORY", "command"))
    ] == [[int, int]]
    doctor = ours.call("LATENCY", "DOCTOR")
    assert doctor.startswith(b"$") and name in doctor
    assert theirs.call("LATENCY", "DOCTOR").startswith(b"$")
    mine, real = on_both(both, "LATENCY", "RESET", name.decode(), "command", "nosuch")
    assert mine == real == b":1\r\n"
    same(both, "LATENCY", "LATEST")


def test_latency_history_keeps_one_sample_per_second_the_highest() -> None:
    from rcp11.diagnostics import LATENCY_SAMPLES, LatencyMonitor

    monitor = LatencyMonitor()
    monitor.add("command", 5, now=100)
    monitor.add("command", 9, now=100)
    monitor.add("command", 7, now=100)
    monitor.add("command", 3, now=101)
    assert monitor.history("command") == [[100, 9], [101, 3]]
    assert monitor.latest() == [["command", 101, 3, 9]]
    for second in range(200, 200 + LATENCY_SAMPLES + 10):
        monitor.add("command", 1, now=second)
    assert len(monitor.history("command")) == LATENCY_SAMPLES
    assert monitor.latest()[0][3] == 9  # the highest ever outlives its sample


# ---------------------------------------------------------------------- memory


@pytest.mark.slow
def test_used_memory_counts_what_the_process_allocated(server_factory: Any) -> None:
    """INFO's used_memory is all the process allocated: the interpreter's
    own memory, and every stream's nodes on top."""
    srv = server_factory()
    client = srv.client()
    try:
        empty = client.info("memory")
        assert empty["used_memory"] > 5_000_000  # an interpreter, not 1 KB
        assert empty["used_memory"] <= empty["used_memory_rss"] * 1.2
        assert empty["used_memory_dataset"] == 0
        payload = b"p" * 1000
        for i in range(20):
            client.execute_command("TWRITE", f"s{i}", "ENTRIES", *[payload] * 1000)
        full = client.info("memory")
        streams = client.info("streams")["stream_memory_bytes"]
        assert streams > 20_000_000
        assert full["used_memory"] >= empty["used_memory"] + 0.9 * streams
        assert full["used_memory_dataset"] >= streams
        assert full["used_memory_peak"] >= full["used_memory"]
        usage = client.memory_usage("s0")
        assert 1_000_000 < usage < 1_300_000  # its thousand messages of 1000 bytes
        assert client.memory_usage("nosuch") is None
    finally:
        client.close()


@pytest.mark.slow
def test_used_memory_falls_back_after_a_big_transaction(server_factory: Any) -> None:
    """A transaction whose replies were big (64 reads of 1 MB, read by its
    client) leaves no buffer of their size behind: once the data is gone,
    used_memory is back near where it started, and a maxmemory set above
    that lets writes in (it was refused by the 64 MB the C lane kept)."""
    srv = server_factory()
    client = srv.client()
    try:
        client.execute_command("TWRITE", "big", "ENTRIES", *[b"x" * 1000] * 1000)
        before = client.info("memory")["used_memory"]
        with client.pipeline(transaction=True) as pipe:
            for _ in range(64):
                pipe.execute_command("TREAD", "big", 0, 1000)
            replies = pipe.execute()
        assert len(replies) == 64 and all(len(r) == 1000 for r in replies)
        del replies
        client.delete("big")
        after = client.info("memory")["used_memory"]
        assert after < before + 16 * 2**20, (before, after)
        client.config_set("maxmemory", before + 32 * 2**20)
        assert client.execute_command("TWRITE", "s", "fits") == 0
    finally:
        client.config_set("maxmemory", 0)
        client.close()


@pytest.mark.slow
def test_redis_cli_bigkeys_and_memkeys(ours: ServerProcess) -> None:
    """--memkeys sizes streams by MEMORY USAGE; --bigkeys knows Redis's own
    types only and counts a stream's size as 0 of an unknown unit ("?")."""
    require("redis-cli")
    client = ours.client()
    client.flushall()
    client.execute_command("TWRITE", "big", "ENTRIES", *[b"m" * 100] * 5000)
    client.execute_command("TWRITE", "small", "x")
    client.set("str", "hello")
    usage = client.memory_usage("big")
    memkeys = redis_cli(ours.port, "--memkeys")
    assert f"Biggest rcp11-log found '\"big\"' has {usage} bytes" in memkeys
    assert "2 rcp11-logs with" in memkeys
    bigkeys = redis_cli(ours.port, "--bigkeys")
    assert "Sampled 3 keys in the keyspace!" in bigkeys
    assert "2 rcp11-logs with 0 ?" in bigkeys
    assert "Biggest string found '\"str\"' has 5 bytes" in bigkeys
    client.close()


# ---------------------------------------------------------------------- the exporter

EXPORTER = "prometheus-redis-exporter"


@pytest.mark.slow
def test_prometheus_redis_exporter_scrapes_cleanly(ours: ServerProcess, tmp_path: Path) -> None:
    require(EXPORTER)
    client = ours.client()
    client.flushall()
    for i in range(3):
        client.execute_command("TWRITE", f"s{i}", "ENTRIES", *[b"x" * 100] * 10_000)
    client.set("k", "v")
    port = free_port()
    log = tmp_path / "exporter.log"
    with log.open("wb") as out:
        exporter = subprocess.Popen(
            [EXPORTER, "-redis.addr", f"redis://127.0.0.1:{ours.port}"]
            + ["-web.listen-address", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        metrics = scrape(port, exporter)
        # A second scrape: errors logged once only would hide on the first.
        metrics = scrape(port, exporter)
    finally:
        exporter.terminate()
        exporter.wait(10)
    errors = [line for line in log.read_text().splitlines() if "level=error" in line]
    assert errors == []
    value = metric_values(metrics)
    assert value["redis_up"] == 1
    assert value['redis_db_keys{db="db0"}'] == 4
    info = client.info()
    assert value["redis_memory_used_bytes"] >= client.info("streams")["stream_memory_bytes"]
    assert value["redis_memory_used_bytes"] <= info["used_memory_rss"] * 1.2
    assert value["redis_commands_processed_total"] >= 4
    assert value["redis_connected_clients"] >= 1
    assert "redis_slowlog_length" in value and "redis_uptime_in_seconds" in value
    client.close()


def scrape(port: int, exporter: subprocess.Popen[bytes]) -> str:
    """/metrics once the exporter answers (bounded)."""
    body: list[str] = []

    def answered() -> bool:
        assert exporter.poll() is None, "the exporter exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                body.append(r.read().decode())
                return True
        except OSError:
            return False

    assert wait_for(answered, timeout=30)
    return body[-1]


def metric_values(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        found = re.fullmatch(r"(\w+(?:\{[^}]*\})?) (\S+)", line)
        if found and not line.startswith("#"):
            values[found.group(1)] = float(found.group(2))
    return values


def test_role_is_a_primary_without_replicas(ours: ServerProcess) -> None:
    with ours.client() as client:
        assert client.execute_command("ROLE") == [b"master", 0, []]
    conn = RawClient(ours.port)
    try:
        assert conn.call("ROLE") == b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"
    finally:
        conn.close()


def test_redis_py_reads_the_slow_log(ours: ServerProcess) -> None:
    with ours.client() as client:
        client.config_set("slowlog-log-slower-than", 0)
        try:
            client.slowlog_reset()
            client.set("k", "v")
            (entry,) = client.slowlog_get(1)
            assert entry["command"] == b"SET k v" and entry["duration"] >= 0
            assert client.slowlog_len() >= 1
        finally:
            client.config_set("slowlog-log-slower-than", 10000)
