"""Redis's own tools against rcp11 (docs/PROTOCOL.md section 7): redis-cli
(one-shot, interactive input, --pipe, RESP3, readable output) and
redis-benchmark, with the stream commands too. Tests that take
stream_server run against both servers."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import redis
import redis.asyncio
from conftest import (
    ServerProcess,
    require,
    tr,
    tw,
)

# ----------------------------------------------------------------- redis-cli


def test_redis_cli_twrite_and_tread(
    stream_server: ServerProcess, stream_client: redis.Redis, tmp_path: Path
) -> None:
    require("redis-cli")

    def cli(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(stream_server.port), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert cli("TWRITE", "s", "hello world") == "0\n"
    assert cli("TWRITE", "s", "BACKLOG", "10", "ENTRIES", "b", "c") == "1\n"
    assert cli("TREAD", "s", "0", "10").splitlines() == ["hello world", "b", "c"]
    # Interactive-style input, as typed at the redis-cli prompt.
    out = cli(stdin='TWRITE s "with space"\nTREAD s -1 1 WITHINFO\n')
    assert out.splitlines() == ["3", "0", "3", "3", "1", "with space"]
    assert cli("-3", "TREAD", "s", "5", "1", "BLOCK", "10") == "\n"


def test_redis_cli_pipe_and_reads(stream_server: ServerProcess) -> None:
    require("redis-cli")
    data = "".join(f"TWRITE piped m{i}\r\n" for i in range(100))
    proc = subprocess.run(
        ["redis-cli", "-p", str(stream_server.port), "--pipe"],
        input=data,
        capture_output=True,
        text=True,
    )
    assert "errors: 0, replies: 100" in proc.stdout
    out = subprocess.run(
        ["redis-cli", "-p", str(stream_server.port), "TREAD", "piped", "-2", "5"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == ["m98", "m99"]


# What redis-cli greys out after the typed text (linenoise's hint colour).
HINT_START, HINT_END = b"\x1b[0;90;49m", b"\x1b[0m"


def redis_cli_hint(port: int, typed: bytes, timeout: float = 15.0) -> str:
    """The hint interactive redis-cli shows once `typed` is on its line: it
    builds hints from the server's COMMAND DOCS. Runs it in a terminal (a
    pty, 200 columns) and answers its cursor-position queries."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: redis-cli on the terminal
        os.execvpe("redis-cli", ["redis-cli", "-p", str(port)], {**os.environ, "TERM": "xterm"})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    screen = b""
    deadline = time.monotonic() + timeout
    try:
        sent = False
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.05)[0]:
                chunk = os.read(fd, 65536)
                screen += chunk
                if b"\x1b[6n" in chunk:  # where is the cursor?
                    os.write(fd, b"\x1b[1;1R")
            if not sent and b"> " in screen:
                os.write(fd, typed)
                sent = True
            shown = screen.rsplit(b"> " + typed, 1)
            if sent and len(shown) == 2 and HINT_END in shown[1]:
                return shown[1].split(HINT_START, 1)[1].split(HINT_END, 1)[0].decode()
        raise AssertionError(f"no hint after {typed!r}: {screen[-300:]!r}")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


def test_redis_cli_hints_the_stream_commands_arguments(stream_server: ServerProcess) -> None:
    require("redis-cli")
    port = stream_server.port
    assert redis_cli_hint(port, b"TWRITE s ") == "entry|[BACKLOG backlog] ENTRIES entry [entry ...]"
    assert redis_cli_hint(port, b"TREAD s ") == (
        "offset count [BLOCK milliseconds] [GROUP groupkey|GROUPNEW newgroupkey] [WITHINFO]"
        " [NONULLS] [WITHTIMES] [PACKED] [LEASE lease] [CONSUMER consumer] [ACK start count]"
    )
    assert redis_cli_hint(port, b"TACK g ") == "start count [start count ...]"
    assert redis_cli_hint(port, b"TCONCAT dst ") == "source [source ...]"
    assert redis_cli_hint(port, b"TSEEK s ") == "unix-time-ms"


def test_redis_cli(shared_server: ServerProcess, shared_client: redis.Redis) -> None:
    require("redis-cli")
    port = str(shared_server.port)
    result = subprocess.run(
        ["redis-cli", "-p", port, "PING"], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == "PONG"
    commands = "".join(f"TWRITE mass m{i}\r\n" for i in range(2000))
    result = subprocess.run(
        ["redis-cli", "-p", port, "--pipe"],
        input=commands,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "errors: 0, replies: 2000" in result.stdout
    result = subprocess.run(
        ["redis-cli", "-p", port, "TREAD", "mass", "-2", "5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.stdout.split() == ["m1998", "m1999"]


def test_redis_cli_starts_and_talks(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    require("redis-cli")
    # redis-cli 7 asks for COMMAND DOCS at start; a bad answer breaks hints.
    done = subprocess.run(
        ["redis-cli", "-p", str(shared_server.port)],
        input="SET greeting hi\nGET greeting\nTYPE greeting\nINFO keyspace\n",
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 0
    lines = done.stdout.split("\n")
    assert lines[:3] == ["OK", "hi", "string"]
    assert "db0:keys=1,expires=0,avg_ttl=0" in lines


def test_redis_cli_resp3_and_readable_output(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    require("redis-cli")
    tw(shared_client, "s", "a", "b", "c")
    shared_client.execute_command("TEVICT", "s", 0)
    cli = ["redis-cli", "-p", str(shared_server.port), "--no-raw"]
    out = subprocess.run([*cli, "TREAD", "s", "0", "5", "WITHINFO"], capture_output=True, text=True)
    assert out.stdout.splitlines() == [
        "1) 1) (integer) 1",
        "   2) (integer) 2",
        "   3) (integer) 0",
        "   4) (integer) 3",
        "2) (nil)",
        '3) "b"',
        '4) "c"',
    ]
    for proto in ("-2", "-3"):
        out = subprocess.run(
            [*cli, proto, "TREAD", "s", "9", "5", "BLOCK", "10"], capture_output=True, text=True
        )
        assert out.stdout.strip() == "(nil)"
    out = subprocess.run([*cli, "-3", "TREAD", "s", "0", "1"], capture_output=True, text=True)
    assert out.stdout.strip() == "1) (nil)"


# ----------------------------------------------------------- redis-benchmark


def test_redis_benchmark(shared_server: ServerProcess) -> None:
    require("redis-benchmark")
    result = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(shared_server.port),
            "-t",
            "ping",
            "-n",
            "2000",
            "-c",
            "5",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "PING_MBULK" in result.stdout.replace("\r", "\n")
    assert shared_server.client().ping() is True


def test_redis_benchmark_runs(shared_server: ServerProcess, shared_client: redis.Redis) -> None:
    require("redis-benchmark")
    done = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(shared_server.port),
            "-n",
            "2000",
            "-c",
            "4",
            "-t",
            "set,get,incr",
        ]
        + ["-q", "-P", "8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("requests per second") == 3


def test_redis_benchmark_with_stream_commands(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    require("redis-benchmark")
    out = subprocess.run(
        ["redis-benchmark", "-p", str(shared_server.port), "-n", "2000", "-c", "4", "-q"]
        + ["TWRITE", "bench", "__rand_int__"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "requests per second" in out.stdout
    assert tr(shared_client, "bench", 0, 0, "WITHINFO") == [[0, 1999, 0, 0]]
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(shared_server.port),
            "-n",
            "1000",
            "-c",
            "4",
            "-q",
            "-P",
            "16",
        ]
        + ["TREAD", "bench", "-10", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "requests per second" in out.stdout
