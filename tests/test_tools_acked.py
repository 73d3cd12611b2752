"""Acknowledged groups from the tools (docs/PROTOCOL.md section 9):
rcp11.client's lease reads, tack, tgroup_info / tgroup_pending and
follow_group(lease_ms=); the command line's `consume --group G --ack`
(acknowledged once the reader took a batch: `| head -1` loses nothing) and
`groups KEY`. Against both servers."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, ServerProcess, wait_for

from rcp11.cli import main as cli_main
from rcp11.cli.acked import acked_row
from rcp11.client import AsyncClient, Client, GroupInfo, PendingRange, ReadResult


@pytest.fixture
def client(stream_server: ServerProcess) -> Iterator[Client]:
    c = Client(host="127.0.0.1", port=stream_server.port)
    c.flushall()
    yield c
    c.close()


def rcp11(port: int, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "rcp11", "-p", str(port), *args],
        cwd=REPO,
        capture_output=True,
        timeout=timeout,
    )


def rcp11_here(port: int, *args: str) -> subprocess.CompletedProcess[bytes]:
    """rcp11() in this process (main() with captured output): no start-up."""
    out, err = io.BytesIO(), io.StringIO()
    status = cli_main(["-p", str(port), *args], stdin=io.BytesIO(), stdout=out, stderr=err)
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue().encode())


def shell(command: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """A shell pipeline as a user types it (python -m rcp11 for rcp11)."""
    command = command.replace("rcp11 ", f"{sys.executable} -m rcp11 ")
    return subprocess.run(
        ["sh", "-c", command], cwd=REPO, capture_output=True, timeout=timeout, check=True
    )


# --------------------------------------------------------------- rcp11.client


def test_client_lease_reads_acknowledge_and_inspect(client: Client) -> None:
    client.twrite("jobs", *[b"m%d" % i for i in range(5)])
    first = client.tread("jobs", 0, 3, group="g", lease=60_000, consumer="w1")
    assert isinstance(first, ReadResult)
    assert (first.start, first.count, first.deliveries) == (0, 3, 1)
    assert first.lease_deadline > 0
    assert client.tgroup_pending("jobs", "g") == [
        PendingRange(0, 3, b"w1", 1, first.lease_deadline)
    ]
    second = client.tread("jobs", 0, 3, group="g", lease=60_000, ack=first)
    assert second.messages == [b"m3", b"m4"]
    info = client.tgroup_info("jobs", "g")
    assert isinstance(info, GroupInfo)
    assert (info.mode, info.next_offset, info.pending, info.acknowledged) == (
        "acknowledged",
        5,
        2,
        3,
    )
    assert [c.name for c in info.consumers] == [b""]
    assert client.tack("g", second.start, second.count) == 2
    pipe = client.pipeline(transaction=False)
    pipe.tgroup_info("jobs", "g").tgroup_pending("jobs", "g")
    info, rows = pipe.execute()
    assert (info.pending, info.lag, rows) == (0, 0, [])


def test_follow_group_acknowledges_each_batch_once_asked_past(client: Client) -> None:
    client.twrite("jobs", *[b"%d" % i for i in range(25)])
    seen = []
    for offset, message in client.follow_group("jobs", "g", batch=10, lease_ms=60_000):
        seen.append(int(message))
        if offset == 14:
            # Stops in the middle of the second batch: what it took before
            # offset 14 is acknowledged, 14 itself and the rest are not.
            break
    assert seen == list(range(15))
    info = client.tgroup_info("jobs", "g")
    assert (info.acknowledged, info.pending) == (14, 6)
    assert [(r.start, r.count) for r in client.tgroup_pending("jobs", "g")] == [(14, 6)]


def test_a_dead_consumers_batch_goes_to_the_next_one(
    client: Client, stream_server: ServerProcess
) -> None:
    client.twrite("jobs", *[b"%d" % i for i in range(10)])
    dying = Client(port=stream_server.port)
    dying.tread("jobs", 0, 4, group="g", lease=200, consumer="dies")
    dying.close()  # its connection drops with the batch unacknowledged
    got = []
    for offset, _ in client.follow_group("jobs", "g", batch=4, lease_ms=60_000):
        got.append(offset)
        if sorted(got) == list(range(10)):
            break
    assert sorted(got) == list(range(10))
    assert got[:6] == [4, 5, 6, 7, 8, 9]  # the lease had not run out yet
    info = client.tgroup_info("jobs", "g")
    assert info.redelivered == 4


def test_async_follow_group_acknowledges(stream_server: ServerProcess, client: Client) -> None:
    client.twrite("jobs", *[b"%d" % i for i in range(12)])

    async def consume() -> list[int]:
        c = AsyncClient(port=stream_server.port)
        seen = []
        # An async generator is closed by aclosing(), not by break.
        async with contextlib.aclosing(
            c.follow_group("jobs", "g", batch=5, lease_ms=60_000)
        ) as messages:
            async for offset, _ in messages:
                seen.append(offset)
                if offset == 11:
                    break
        await c.aclose()
        return seen

    assert asyncio.run(consume()) == list(range(12))
    info = client.tgroup_info("jobs", "g")
    assert (info.acknowledged, info.pending) == (11, 1)


# ------------------------------------------------------------ the command line


@pytest.mark.slow
def test_consume_ack_into_head_loses_nothing(client: Client, stream_server: ServerProcess) -> None:
    port = stream_server.port
    shell(f"seq 1 6000 | rcp11 -p {port} produce nums -q")
    head = shell(f"rcp11 -p {port} consume nums --group G --ack --lease 300 | head -1")
    assert head.stdout == b"1\n"
    info = client.tgroup_info("nums", "G")
    # head took a pipe-full and left: none of it counts as used.
    assert info.acknowledged == 0
    assert info.pending >= 1000
    # The rest of the group, once the lease ran out, still gets every line.
    wait_for(lambda: client.tgroup_info("nums", "G").expired == info.pending, timeout=20)
    rest = shell(f"rcp11 -p {port} consume nums --group G --ack | cat")
    assert sorted(int(x) for x in rest.stdout.split()) == list(range(1, 6001))
    info = client.tgroup_info("nums", "G")
    assert (info.acknowledged, info.pending, info.lag) == (6000, 0, 0)
    assert info.redelivered == info.delivered - 6000 > 0


@pytest.mark.slow
@pytest.mark.parametrize("output", ["file", "pipe"])
def test_consume_ack_acknowledges_what_was_taken(
    client: Client, stream_server: ServerProcess, tmp_path: Path, output: str
) -> None:
    client.twrite("nums", *[b"%d" % i for i in range(2500)])
    target = f"> {tmp_path / 'out'}" if output == "file" else "| cat > " + str(tmp_path / "out")
    shell(f"rcp11 -p {stream_server.port} consume nums --group G --ack -n 1200 {target}")
    assert (tmp_path / "out").read_bytes().split() == [b"%d" % i for i in range(1200)]
    info = client.tgroup_info("nums", "G")
    assert (info.acknowledged, info.pending, info.next_offset) == (1200, 0, 1200)
    assert info.consumers == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--ack",), "--ack needs --group or --groupnew"),
        (("--group", "G", "--ack", "--times"), "--times cannot be combined with --ack"),
    ],
)
def test_consume_ack_refuses_what_it_cannot_do(
    stream_server: ServerProcess, args: tuple[str, ...], says: str
) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        rcp11_here(stream_server.port, "consume", "nums", *args)
    assert exited.value.code == 2
    assert says in err.getvalue()


def test_groups_shows_lag_pending_and_consumers(
    client: Client, stream_server: ServerProcess
) -> None:
    client.twrite("jobs", *[b"%d" % i for i in range(100)])
    client.twrite("other", b"x")
    client.tread("jobs", 0, 30, group="acked", lease=60_000, consumer="w1")
    client.tread("jobs", 0, 20, group="acked", lease=60_000, consumer="w2")
    client.tack("acked", 30, 5)  # w2's oldest pending offset is 35 now
    client.tread("other", 0, 1, group="elsewhere", lease=60_000)
    client.tread("jobs", 0, 10, group="plain")
    # Named groups, plain and acknowledged (globs find both kinds of key).
    done = rcp11_here(stream_server.port, "groups", "jobs", "plain", "nope", "ack*")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert [line.split() for line in lines[:4]] == [
        ["GROUP", "STREAM", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
        + ["PENDING", "EXPIRED", "REDELIVERED", "CONSUMERS"],
        ["plain", "jobs", "10", "100", "90", "-", "-", "-", "-"],
        ["nope", "jobs", "-", "100", "100", "-", "-", "-", "-"],
        ["acked", "jobs", "50", "100", "50", "45", "0", "0", "2"],
    ]
    # Each consumer's lag: from its oldest pending offset to the stream's end.
    assert lines[4].startswith("  consumer w1: 30 pending, 0 expired, lag 100 (from offset 0), ")
    assert lines[5].startswith("  consumer w2: 15 pending, 0 expired, lag 65 (from offset 35), ")
    assert "lease until 20" in lines[5]
    assert len(lines) == 6
    # No group named: the acknowledged groups of the stream; the group of
    # stream "other" is not one of them.
    done = rcp11_here(stream_server.port, "groups", "jobs", "--json")
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert (row["group"], row["lag"], row["pending"], row["mode"]) == (
        "acked",
        50,
        45,
        "acknowledged",
    )
    assert [(c["name"], c["lag"], c["oldest_pending"]) for c in row["consumers"]] == [
        ("w1", 100, 0),
        ("w2", 65, 35),
    ]
    # Named outright, it is an error.
    done = rcp11_here(stream_server.port, "groups", "jobs", "elsewhere")
    assert done.returncode == 1
    assert "group key 'elsewhere' belongs to stream 'other'" in done.stderr.decode()
    done = rcp11_here(stream_server.port, "groups", "other-stream-without-groups")
    assert done.stdout.decode().startswith("no acknowledged group reads")


def test_groups_finds_each_consumers_oldest_offset_past_a_page_of_ranges(client: Client) -> None:
    client.twrite("jobs", *[b"%d" % i for i in range(3010)])
    client.tread("jobs", 0, 3000, group="acked", lease=60_000, consumer="w1")
    client.tread("jobs", 0, 10, group="acked", lease=60_000, consumer="w2")
    # Every other offset of w1's acknowledged: 1500 ranges of w1 before w2's.
    client.execute_command("TACK", "acked", *[x for i in range(1, 3000, 2) for x in (i, 1)])
    assert client.tgroup_info("jobs", "acked").pending_ranges == 1501
    row = acked_row(client, "jobs", "acked", 3010)
    assert isinstance(row, dict)
    assert [(c["name"], c["lag"], c["oldest_pending"]) for c in row["consumers"]] == [
        ("w1", 3010, 0),
        ("w2", 10, 3000),
    ]


@pytest.mark.slow
def test_a_consume_ack_killed_mid_batch_loses_nothing(
    client: Client, stream_server: ServerProcess
) -> None:
    client.twrite("nums", *[b"%d" % i for i in range(300)])
    argv = [sys.executable, "-m", "rcp11", "-p", str(stream_server.port), "consume", "nums"]
    argv += ["--group", "G", "--ack", "--lease", "300", "--batch", "100"]
    # Its reader takes one line and then nothing: the consumer is stuck
    # with its pipe full, mid-batch, when it is killed.
    proc = subprocess.Popen([*argv, "--follow"], cwd=REPO, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    wait_for(lambda: client.tgroup_info("nums", "G").pending > 0)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    wait_for(
        lambda: client.tgroup_info("nums", "G").expired == client.tgroup_info("nums", "G").pending
    )
    rest = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=60, check=True)
    seen = {int(first)} | {int(x) for x in rest.stdout.split()}
    assert seen == set(range(300))
    info = client.tgroup_info("nums", "G")
    assert (info.pending, info.acknowledged) == (0, 300)
    assert info.redelivered > 0
