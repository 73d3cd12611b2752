"""`rcp11 consume KEY --since WHEN` (TSEEK from the command line)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
from conftest import REPO, ServerProcess, wait_for

from rcp11.cli import Since, parse_since


def rcp11(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "rcp11", *args], cwd=REPO, capture_output=True, timeout=60
    )


@pytest.mark.parametrize(
    "text, ago_ms",
    [("10m", 600_000), ("90s", 90_000), ("2h", 7_200_000), ("1h30m", 5_400_000)]
    + [("500ms", 500), ("7d", 604_800_000), ("1w", 604_800_000), (" 3m ", 180_000)],
)
def test_since_durations_count_back_from_when_the_command_runs(text: str, ago_ms: int) -> None:
    since = parse_since(text)
    assert since == Since(ago_ms=ago_ms)
    assert since.resolve(now_ms=10**13) == 10**13 - ago_ms


def test_since_absolute_times_and_unix_ms() -> None:
    assert parse_since("1763931600000").resolve() == 1763931600000
    utc = datetime(2026, 11, 23, 21, 0, tzinfo=timezone.utc)
    assert parse_since("2026-11-23T21:00Z").resolve() == utc.timestamp() * 1000
    assert parse_since("2026-11-23T22:00:00+01:00").resolve() == utc.timestamp() * 1000
    local = datetime(2026, 11, 23, 21, 0)  # no zone: local time, as `date` shows it
    assert parse_since("2026-11-23 21:00").resolve() == round(local.timestamp() * 1000)
    for bad in ("yesterday", "10x", "m10", "", "-5m", "10m-"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_since(bad)


@pytest.mark.slow
def test_consume_since_starts_at_the_first_message_appended_then(server_factory) -> None:
    srv: ServerProcess = server_factory(stream_node_max_entries=4)
    c = srv.client()
    c.execute_command("TWRITE", "events", "ENTRIES", "old1", "old2", "old3", "old4")
    mark = time.time_ns() // 1_000_000 + 1
    wait_for(lambda: time.time_ns() // 1_000_000 > mark)
    c.execute_command("TWRITE", "events", "ENTRIES", "new1", "new2")
    port = str(srv.port)
    done = rcp11("-p", port, "consume", "events", "--since", str(mark), "--offsets")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"4\tnew1\n5\tnew2\n"
    iso = datetime.fromtimestamp(mark / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    assert rcp11("-p", port, "consume", "events", "--since", iso).stdout == b"new1\nnew2\n"
    everything = rcp11("-p", port, "consume", "events", "--since", "1h").stdout
    assert everything == b"old1\nold2\nold3\nold4\nnew1\nnew2\n"
    assert rcp11("-p", port, "consume", "events", "--since", "0ms").stdout == b""
    assert rcp11("-p", port, "consume", "missing", "--since", "10m").stdout == b""


@pytest.mark.slow
def test_consume_since_usage_errors() -> None:
    assert b"--since" in rcp11("consume", "--help").stdout
    for args in (
        ["consume", "k", "--since", "soon"],
        ["consume", "k", "--since", "10m", "--from", "3"],
        ["consume", "k", "--since", "10m", "--group", "g"],
        ["consume", "k", "--since", "10m", "--groupnew", "g"],
    ):
        done = rcp11(*args)
        assert done.returncode == 2 and b"--since" in done.stderr, args
