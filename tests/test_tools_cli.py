"""The rcp11 command line as a user runs it: python -m rcp11 ... with pipes.
Against both servers: rcp11-server and redis-server with the rcp11 module."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import (
    REPO,
    RedisServer,
    ServerProcess,
    free_port,
    in_thread,
    start_with_gaps,
    tr,
    tread_calls,
    wait_blocked,
    wait_for,
)

from rcp11.cli import Progress, build_parser, split_messages
from rcp11.cli import main as cli_main
from rcp11.cli.args import Since, parse_args
from rcp11.client import Client


def rcp11(
    *args: str, input: bytes = b"", timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "rcp11", *args],
        cwd=REPO,
        input=input,
        capture_output=True,
        timeout=timeout,
    )


@pytest.fixture
def rcp11_client(stream_server: ServerProcess) -> Iterator[Client]:
    """An rcp11.client.Client of stream_server; the database is flushed first."""
    c = Client(host="127.0.0.1", port=stream_server.port)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def port(stream_server: ServerProcess) -> str:
    return str(stream_server.port)


# ---------------------------------------------------------------------------
# Help and usage
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, expected",
    [
        ([], [b"produce", b"consume", b"info", b"streams", b"groups", b"evict", b"rcp11 server"]),
        (["produce"], [b"--batch", b"--backlog", b"--null", b"KEY", b"stdin"]),
        (["consume"], [b"--from", b"--group", b"--groupnew", b"--follow", b"--count", b"--block"]),
        (["info"], [b"KEY", b"--json"]),
        (["streams"], [b"PATTERN", b"--long", b"kafka-topics --list"]),
        (["groups"], [b"GROUPKEY", b"LAG", b"kafka-consumer-groups --describe"]),
        (["evict"], [b"KEY", b"OFFSET"]),
    ],
)
def test_help_describes_each_command(command: list[str], expected: list[bytes]) -> None:
    result = rcp11(*command, "--help")
    assert result.returncode == 0, result.stderr
    for word in expected:
        assert word in result.stdout


@pytest.mark.slow
def test_bad_usage_exits_2_with_a_message() -> None:
    result = rcp11("consume")
    assert result.returncode == 2
    assert b"KEY" in result.stderr
    assert rcp11("consume", "k", "--group", "g", "--groupnew", "h").returncode == 2
    assert rcp11("produce", "k", "--batch", "0").returncode == 2
    mixed = rcp11("consume", "k", "--from", "3", "--group", "g")
    assert mixed.returncode == 2 and b"group key holds the offset" in mixed.stderr


# ---------------------------------------------------------------------------
# produce / consume
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_produce_stdin_then_consume_to_stdout(rcp11_client: Client, port: str) -> None:
    lines = [b"alpha", b"", "gr\u00fc\u00df".encode(), b"tab\there", b"last without newline"]
    produced = rcp11("-p", port, "produce", "events", input=b"\n".join(lines))
    assert produced.returncode == 0, produced.stderr
    assert b"5 messages" in produced.stderr and b"offsets 0..4" in produced.stderr
    assert rcp11_client.tread("events", 0, 10) == lines

    consumed = rcp11("consume", "events", "-p", port)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == b"".join(line + b"\n" for line in lines)


@pytest.mark.slow
def test_produce_many_lines_in_small_batches_keeps_order(rcp11_client: Client, port: str) -> None:
    data = b"".join(b"%d\n" % i for i in range(5000))
    produced = rcp11("-p", port, "produce", "big", "--batch", "7", input=data)
    assert produced.returncode == 0, produced.stderr
    assert b"offsets 0..4999" in produced.stderr
    assert rcp11_client.tread("big", 0, 10000) == [b"%d" % i for i in range(5000)]
    consumed = rcp11("-p", port, "consume", "big", "--batch", "333")
    assert consumed.stdout == data


def test_produce_appends_after_existing_offsets_and_honours_backlog(
    rcp11_client: Client, port: str
) -> None:
    rcp11_client.twrite("s", b"x", b"y")
    produced = rcp11("-p", port, "produce", "s", "--backlog", "3", input=b"a\nb\nc\nd\n")
    assert b"offsets 2..5" in produced.stderr
    info = rcp11_client.tread("s", 0, 0, withinfo=True)
    assert (info.first_offset, info.last_offset) == (3, 5)


@pytest.mark.slow
def test_produce_null_separated_messages_may_contain_newlines(
    rcp11_client: Client, port: str
) -> None:
    produced = rcp11("-p", port, "produce", "s", "--null", input=b"one\nline\0two\0")
    assert produced.returncode == 0
    assert rcp11_client.tread("s", 0, 10) == [b"one\nline", b"two"]
    consumed = rcp11("-p", port, "consume", "s", "--null")
    assert consumed.stdout == b"one\nline\0two\0"


def test_produce_with_empty_input_writes_nothing(rcp11_client: Client, port: str) -> None:
    produced = rcp11("-p", port, "produce", "s")
    assert produced.returncode == 0
    assert b"nothing written" in produced.stderr
    assert rcp11_client.exists("s") == 0


@pytest.mark.slow
def test_consume_from_count_and_offsets(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", *[b"m%d" % i for i in range(10)])
    assert rcp11("-p", port, "consume", "s", "--from", "-3").stdout == b"m7\nm8\nm9\n"
    assert rcp11("-p", port, "consume", "s", "--from", "4", "-n", "2").stdout == b"m4\nm5\n"
    assert rcp11("-p", port, "consume", "s", "--from", "8", "--offsets").stdout == b"8\tm8\n9\tm9\n"


@pytest.mark.slow
def test_consume_prints_each_messages_append_time(rcp11_client: Client, port: str) -> None:
    """--times, as kcat's %T: the time before the message (after the offset
    with --offsets), the time of its own write."""
    times = []
    for i in range(3):
        start = time.time_ns() // 1_000_000
        wait_for(lambda start=start: time.time_ns() // 1_000_000 > start, 5)
        rcp11_client.twrite("s", b"m%d" % i)
        times.append(rcp11_client.tread("s", i, 1, withtimes=True)[0][1])
    rcp11_client.tevict("s", 0)
    assert len(set(times)) == 3
    out = rcp11("-p", port, "consume", "s", "--times").stdout
    assert out == b"%d\tm1\n%d\tm2\n" % (times[1], times[2])
    out = rcp11("-p", port, "consume", "s", "--times", "--offsets", "--null").stdout
    assert out == b"1\t%d\tm1\x002\t%d\tm2\x00" % (times[1], times[2])


def test_consume_skips_evicted_messages(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", *[b"m%d" % i for i in range(6)])
    rcp11_client.tevict("s", 3)
    assert rcp11("-p", port, "consume", "s", "--offsets").stdout == b"4\tm4\n5\tm5\n"


@pytest.mark.slow
def test_consume_group_members_share_the_stream(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", *[b"m%d" % i for i in range(5)])
    first = rcp11("-p", port, "consume", "s", "--group", "s:g", "--count", "3")
    second = rcp11("-p", port, "consume", "s", "--group", "s:g")
    assert first.stdout == b"m0\nm1\nm2\n"
    assert second.stdout == b"m3\nm4\n"
    assert rcp11_client.get("s:g") == b"5"


@pytest.mark.slow
def test_consume_groupnew_with_block_gets_messages_written_later(
    rcp11_client: Client, port: str
) -> None:
    rcp11_client.twrite("s", b"before")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcp11", "-p", port, "consume", "s"]
        + ["--groupnew", "s:new", "--block", "20000", "--count", "2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_blocked(rcp11_client, 1)
        rcp11_client.twrite("s", b"after1", b"after2")
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == b"after1\nafter2\n"


@pytest.mark.slow
def test_consume_block_exits_after_waiting_in_vain(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", b"only")
    result = rcp11("-p", port, "consume", "s", "--block", "100")
    assert result.returncode == 0
    assert result.stdout == b"only\n"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_consume_follow_streams_until_interrupted(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", b"a", b"b")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcp11", "-p", port, "consume", "s", "--follow"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # A CI runner may start us with SIGINT ignored (a background job), and
        # Python then keeps it ignored in the child: give the follower the
        # default a user at a terminal has, so Ctrl-C means KeyboardInterrupt.
        preexec_fn=_default_sigint,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"a\n"
        assert proc.stdout.readline() == b"b\n"
        rcp11_client.twrite("s", b"c")
        assert proc.stdout.readline() == b"c\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert b"Traceback" not in err


@pytest.mark.slow
def test_consume_into_a_closed_pipe_is_quiet(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", *[b"x" * 100] * 5000)
    pipeline = subprocess.run(
        f"{sys.executable} -m rcp11 -p {port} consume s | head -n 1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert pipeline.stdout == b"x" * 100 + b"\n"
    assert b"Traceback" not in pipeline.stderr


# ---------------------------------------------------------------------------
# info / evict
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_info_shows_offsets(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", *[b"m%d" % i for i in range(10)])
    rcp11_client.tevict("s", 2)
    text = rcp11("-p", port, "info", "s").stdout.decode()
    assert "first_offset: 3" in text and "last_offset: 9" in text
    assert "next_offset: 10" in text and "length: 7" in text
    fields = json.loads(rcp11("-p", port, "info", "s", "--json").stdout)
    assert fields == {
        "key": "s",
        "first_offset": 3,
        "last_offset": 9,
        "next_offset": 10,
        "length": 7,
    }
    assert b"never written" in rcp11("-p", port, "info", "nothing").stdout


@pytest.mark.slow
def test_evict_reports_what_remains(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", *[b"m%d" % i for i in range(10)])
    result = rcp11("-p", port, "evict", "s", "4")
    assert result.returncode == 0
    assert b"evicted 5 messages" in result.stdout and b"5..9" in result.stdout
    result = rcp11("-p", port, "evict", "s", "-2")
    assert b"evicted 3 messages" in result.stdout and b"8..9" in result.stdout
    assert rcp11_client.tread("s", 7, 5) == [None, b"m8", b"m9"]


# ---------------------------------------------------------------------------
# In process: main() with the test's stdin, stdout and stderr
# ---------------------------------------------------------------------------


def run_cli(port: str, *args: str, input: bytes = b"") -> tuple[int, bytes, str]:
    """(exit status, stdout, stderr) of `rcp11 -p PORT ARGS`, in process."""
    out, err = io.BytesIO(), io.StringIO()
    status = cli_main(["-p", port, *args], stdin=io.BytesIO(input), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def test_consume_help_says_a_group_read_is_the_acknowledgement() -> None:
    text = " ".join(
        build_parser()._subparsers._group_actions[0].choices["consume"].format_help().split()
    )
    assert "A group read is its own acknowledgement" in text
    assert "at most once" in text


def test_one_message_is_one_message(rcp11_client: Client, port: str) -> None:
    status, _, err = run_cli(port, "produce", "s", input=b"x\n")
    assert status == 0
    assert err == "rcp11 produce: 1 message written to 's', offsets 0..0\n"


def test_produce_to_a_string_key_says_so_and_writes_nothing(
    rcp11_client: Client, port: str
) -> None:
    rcp11_client.set("strk", "v")
    status, _, err = run_cli(port, "produce", "strk", input=b"x\ny\n")
    assert status == 1
    assert err == (
        "rcp11 produce: key 'strk' holds a string, not a stream; "
        "rcp11 produce needs a stream key: use another key name\n"
    )
    assert rcp11_client.get("strk") == b"v"


def test_a_group_key_holding_a_stream_is_named(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", b"x")
    rcp11_client.twrite("g", b"y")
    status, _, err = run_cli(port, "consume", "s", "--group", "g")
    assert status == 1
    assert "group key 'g' holds a stream; a consumer group's offset is kept in a string key" in err


def test_produce_reports_what_was_written_before_a_failure(rcp11_client: Client, port: str) -> None:
    """Input that arrives in two pieces: the first is written, then the key
    becomes a string: the user learns both."""
    reader, writer = os.pipe()
    os.write(writer, b"a\nb\n")
    out, err = io.BytesIO(), io.StringIO()
    stdin = os.fdopen(reader, "rb")

    def replace_then_close() -> None:
        wait_for(lambda: rcp11_client.exists("s"), timeout=10)
        rcp11_client.delete("s")
        rcp11_client.set("s", "now a string")
        os.write(writer, b"c\n")
        os.close(writer)

    thread, _ = in_thread(replace_then_close)
    status = cli_main(["-p", port, "produce", "s"], stdin=stdin, stdout=out, stderr=err)
    thread.join(10)
    stdin.close()
    assert status == 1
    lines = err.getvalue().splitlines()
    assert lines[0] == "rcp11 produce: 2 messages written to 's', offsets 0..1, then:"
    assert "key 's' holds a string" in lines[1]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["consume", "--topic", "s", "--from-beginning"], b"m0\nm1\nm2\nm3\nm4\n"),
        (["consume", "s", "--topic", "s", "--max-messages", "2"], b"m0\nm1\n"),
        (["consume", "s", "-o", "beginning", "-c", "1"], b"m0\n"),
        (["consume", "s", "-o", "-2"], b"m3\nm4\n"),
        (["consume", "s", "-o", "end"], b""),
        (["consume", "s", "--from", "earliest", "-n", "1"], b"m0\n"),
        (["consume", "s", "--from", "latest", "--block", "1"], b""),
    ],
)
def test_kafka_and_kcat_spellings_are_understood(
    rcp11_client: Client, port: str, args: list[str], expected: bytes
) -> None:
    rcp11_client.twrite("s", *[b"m%d" % i for i in range(5)])
    status, out, err = run_cli(port, *args)
    assert (status, out) == (0, expected), err


def test_consume_from_end_gets_only_what_is_written_afterwards(
    rcp11_client: Client, port: str
) -> None:
    rcp11_client.twrite("s", b"old")

    def write_later() -> None:
        wait_blocked(rcp11_client, 1)
        rcp11_client.twrite("s", b"new")

    thread, _ = in_thread(write_later)
    status, out, _ = run_cli(port, "consume", "s", "-o", "end", "--block", "20000", "-n", "1")
    thread.join(10)
    assert (status, out) == (0, b"new\n")


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["consume", "s", "--bootstrap-server", "localhost:9092"], "here: -h HOST -p PORT"),
        (["-b", "localhost:9092", "consume", "s"], "here: -h HOST -p PORT"),
        (["consume", "-t", "s"], "or --topic KEY"),
        (["consume", "s", "--partition", "0"], "a stream has no partitions"),
        (["--list"], "rcp11 streams"),
        (["consume", "s", "--timeout-ms", "100"], "--block MS"),
        (["consume", "s", "-e"], "exits when it has caught up"),
        (["consume", "-G", "g", "s"], "--group GROUPKEY"),
        (["consume", "s", "-K:"], "messages have no key"),
        (["consume", "s", "-J"], "--offsets"),
        (["consume", "s", "-X", "fetch.wait.max.ms=10"], "no client properties"),
        (["consume", "s", "--consumer-property", "a=b"], "no client properties"),
        (["produce", "s", "--producer-property", "acks=all"], "no client properties"),
        (["consume", "s", "-o", "e@1700000000000"], "no end time"),
    ],
)
def test_other_kafka_spellings_name_the_rcp11_option(
    capsys: pytest.CaptureFixture[str], args: list[str], hint: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(args)
    assert exit_.value.code == 2
    assert hint in capsys.readouterr().err


def test_kcat_offset_at_a_time_is_since() -> None:
    """kcat's -o s@TS starts at the first message appended at or after TS
    (unix ms): --since TS."""
    args = parse_args(["consume", "s", "-o", "s@1700000000000"])
    assert args.since == Since(unix_ms=1700000000000) and args.from_offset is None
    with pytest.raises(SystemExit):
        parse_args(["consume", "s", "-o", "s@1700000000000", "--since", "1h"])


def test_a_key_and_a_different_topic_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["consume", "a", "--topic", "b"])
    assert "KEY 'a' and --topic 'b' differ" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["consume"])
    assert "the stream KEY is missing" in capsys.readouterr().err


def test_streams_lists_the_streams_only(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("b", b"x", b"y")
    rcp11_client.twrite("a", b"x")
    rcp11_client.tevict("a", 0)
    rcp11_client.set("a-string", "x")
    assert run_cli(port, "streams") == (0, b"a\nb\n", "")
    assert run_cli(port, "streams", "b*")[1] == b"b\n"
    status, out, _ = run_cli(port, "streams", "-l")
    assert out.decode().splitlines() == [
        "STREAM  FIRST-OFFSET  LAST-OFFSET  NEXT-OFFSET  LENGTH",
        "a       1             0            1            0",
        "b       0             1            2            2",
    ]
    rows = [json.loads(line) for line in run_cli(port, "streams", "--json")[1].splitlines()]
    assert rows[1] == {
        "key": "b",
        "first_offset": 0,
        "last_offset": 1,
        "next_offset": 2,
        "length": 2,
    }
    assert run_cli(port, "streams", "nothing*") == (0, b"", "")


def test_groups_shows_each_groups_lag(rcp11_client: Client, port: str) -> None:
    rcp11_client.twrite("s", *[b"m%d" % i for i in range(10)])
    rcp11_client.tread("s", 0, 3, group="s:g1")
    rcp11_client.tread("s", 0, 10, group="s:g2")
    rcp11_client.set("s:not-a-group", "text")
    status, out, _ = run_cli(port, "groups", "s", "s:*", "s:new")
    assert status == 0
    assert out.decode().splitlines() == [
        "GROUP  STREAM  CURRENT-OFFSET  LOG-END-OFFSET  LAG",
        "s:g1   s       3               10              7",
        "s:g2   s       10              10              0",
        "s:new  s       -               10              10",
    ]
    # A key named as a group that holds no offset is an error, not a row.
    assert run_cli(port, "groups", "s", "s:not-a-group")[0:1] == (1,)
    assert (
        "key 's:not-a-group' holds b'text', not an offset"
        in run_cli(port, "groups", "s", "s:not-a-group")[2]
    )
    assert "key 's' holds a stream" in run_cli(port, "groups", "s", "s")[2]
    # Evicted messages are no lag: nobody can be handed them.
    rcp11_client.tevict("s", 5)
    rows = [
        json.loads(line) for line in run_cli(port, "groups", "s", "s:g1", "--json")[1].splitlines()
    ]
    assert rows == [
        {"group": "s:g1", "stream": "s", "current_offset": 3, "next_offset": 10, "lag": 4}
    ]


# ---------------------------------------------------------------------------
# Errors a user can act on
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_no_server_says_how_to_start_one() -> None:
    port = str(free_port())
    result = rcp11("-p", port, "produce", "s", input=b"x\n")
    assert result.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}".encode() in result.stderr
    assert b"rcp11-server" in result.stderr
    assert b"Traceback" not in result.stderr


@pytest.mark.slow
def test_server_going_away_mid_follow_is_explained(server_factory) -> None:
    doomed = server_factory()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcp11", "-p", str(doomed.port), "consume", "s", "--follow"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        watcher = Client(host="127.0.0.1", port=doomed.port)
        wait_blocked(watcher, 1)
        watcher.close()
        doomed.kill9()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert b"lost the connection" in err
    assert b"Traceback" not in err


@pytest.mark.slow
def test_wrong_type_key_is_explained(rcp11_client: Client, port: str) -> None:
    rcp11_client.set("plain", "1")
    result = rcp11("-p", port, "consume", "plain")
    assert result.returncode == 1
    assert b"holds a string, not a stream" in result.stderr


@pytest.mark.slow
def test_password_protected_server(server_factory) -> None:
    protected = server_factory(requirepass="s3cret")
    port = str(protected.port)
    refused = rcp11("-p", port, "info", "s")
    assert refused.returncode == 1
    assert b"-a PASSWORD" in refused.stderr
    wrong = rcp11("-p", port, "-a", "nope", "info", "s")
    assert wrong.returncode == 1 and b"refused the password" in wrong.stderr
    produced = rcp11("-p", port, "-a", "s3cret", "produce", "s", input=b"x\n")
    assert produced.returncode == 0, produced.stderr
    consumed = rcp11("-u", f"redis://:s3cret@127.0.0.1:{port}", "consume", "s")
    assert consumed.stdout == b"x\n"


@pytest.mark.slow
def test_plain_redis_server_is_recognised(redis_reference: RedisServer) -> None:
    result = rcp11("-p", str(redis_reference.port), "produce", "s", input=b"x\n")
    assert result.returncode == 1
    assert b"not an rcp11 server" in result.stderr


# ---------------------------------------------------------------------------
# Pieces that need no server
# ---------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_reports_rate_once_per_interval() -> None:
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("produce", out, enabled=True, interval=1.0, clock=clock)
    clock.now += 0.5
    progress.add(500)
    assert out.getvalue() == ""
    clock.now += 0.5
    progress.add(500)
    assert out.getvalue() == "produce: 1,000 messages, 1,000 msg/s\n"
    clock.now += 2.0
    progress.add(1000)
    assert out.getvalue().splitlines()[-1] == "produce: 2,000 messages, 500 msg/s"
    progress.finish()
    assert out.getvalue().splitlines()[-1] == "produce: 2,000 messages in 3.0 s, 667 msg/s average"


def test_progress_disabled_prints_nothing() -> None:
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("consume", out, enabled=False, clock=clock)
    clock.now += 5
    progress.add(10)
    progress.finish()
    assert out.getvalue() == "" and progress.total == 10


def test_split_messages_joins_lines_across_chunks() -> None:
    chunks = iter([b"ab", b"c\nd", b"e\n\nf"])
    assert list(split_messages(chunks, b"\n")) == [[b"abc"], [b"de", b""], [b"f"]]


@pytest.mark.slow
def test_cli_produce_consume_as_in_the_readme(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    base = [sys.executable, "-m", "rcp11", "-p", str(shared_server.port)]
    lines = "".join(f"{n}\n" for n in range(1, 5001))
    prod = subprocess.run([*base, "produce", "nums"], input=lines, capture_output=True, text=True)
    assert prod.returncode == 0
    assert tr(shared_client, "nums", 0, 0, "WITHINFO") == [[0, 4999, 0, 0]]
    tail = subprocess.run(
        [*base, "consume", "nums", "--from", "-10"], capture_output=True, text=True
    )
    assert tail.stdout.split() == [str(n) for n in range(4991, 5001)]
    group = subprocess.run(
        [*base, "consume", "nums", "--group", "g", "-n", "3"], capture_output=True, text=True
    )
    assert group.stdout.split() == ["1", "2", "3"]
    assert shared_client.get("g") == b"3"


@pytest.mark.slow
def test_consume_steps_over_a_crash_gap_in_one_request(server_factory: Any) -> None:
    """The gap a crash may leave (null offsets up to a reservation mark) is
    stepped over in one TREAD, by a reader that catches up and by one that
    follows a stream ending in a gap."""
    srv = server_factory(appendonly="yes", start=False)
    start_with_gaps(srv, {b"s": (3, 200_000, 2), b"ends-in-a-gap": (2, 300_000, 0)})
    port = str(srv.port)
    client = srv.client()
    before = tread_calls(client)
    result = rcp11("-p", port, "consume", "s", "--offsets", "--batch", "100")
    assert result.stdout == b"0\ta0\n1\ta1\n2\ta2\n200000\tb0\n200001\tb1\n"
    assert tread_calls(client) - before <= 3
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcp11", "-p", port, "consume", "ends-in-a-gap"]
        + ["--follow", "--offsets", "--batch", "100"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"0\ta0\n"
        assert proc.stdout.readline() == b"1\ta1\n"
        wait_blocked(client, 1)  # over the gap, waiting for the next write
        assert client.execute_command("TWRITE", "ends-in-a-gap", "next") == 300_000
        assert proc.stdout.readline() == b"300000\tnext\n"
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert tread_calls(client) - before <= 6
