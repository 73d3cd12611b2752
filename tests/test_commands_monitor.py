"""What a Redis user looks at first, answered as redis-server 7 answers it:
MONITOR (as redis-cli MONITOR shows it), INFO errorstats and INFO server's
multiplexing_api. Compared with a real redis-server where both can run the
same commands."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

import hiredis
import redis
from conftest import RedisServer, ServerProcess, mbulk, redis_cli

# Commands both servers run alike; errors and admin commands included, as
# MONITOR must leave out what Redis leaves out (rejected before running:
# wrong arity, unknown command; admin: CONFIG, DEBUG, MONITOR) and hide
# secrets (AUTH's arguments, HELLO's AUTH user and password).
SCRIPT = [
    ["SET", "k", "v"],
    ["AUTH", "secret"],
    ["AUTH", "default", "secret"],
    ["GET"],
    ["NOSUCH", "a"],
    ["CONFIG", "GET", "port"],
    ["HELLO", "2", "AUTH", "default", "pw", "SETNAME", "me"],
    ["MULTI"],
    ["SET", "a", 'quote"and\nnewline\x00'],
    ["GET", "a"],
    ["EXEC"],
    ["INCR", "k"],
    ["CLIENT", "SETNAME", "x"],
    ["PING"],
    ["DEL", "k", "a"],
    ["ECHO", "done"],
]


class Monitor:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(mbulk(b"MONITOR"))
        self.buf = b""
        assert self.line() == "+OK"

    def line(self) -> str:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode("latin-1")

    def until(self, last: str) -> list[str]:
        lines = []
        while not lines or not lines[-1].endswith(last):
            lines.append(self.line())
        return lines


def replies(port: int, script: list[list[str]]) -> list[object]:
    """Send script as one pipeline; every reply, errors as exceptions."""
    reader = hiredis.Reader()
    got: list[object] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"".join(mbulk(*(a.encode("latin-1") for a in argv)) for argv in script))
        while len(got) < len(script):
            chunk = conn.recv(65536)
            assert chunk, "connection closed"
            reader.feed(chunk)
            while (reply := reader.gets()) is not False:
                got.append(reply)
    return got


def monitored(port: int) -> list[str]:
    monitor = Monitor(port)
    try:
        replies(port, SCRIPT)
        lines = monitor.until('"ECHO" "done"')
    finally:
        monitor.sock.close()
    shown = []
    for line in lines:
        match = re.fullmatch(r"\+(\d+)\.(\d{6}) \[0 127\.0\.0\.1:\d+\] (.*)", line)
        assert match, line
        shown.append(match.group(3))
    return shown


def test_monitor_shows_commands_as_redis_does(
    fresh_server: ServerProcess, redis_reference: RedisServer
) -> None:
    ours = monitored(fresh_server.port)
    assert ours == monitored(redis_reference.port)
    assert '"AUTH" "(redacted)" "(redacted)"' in ours
    assert '"HELLO" "2" "AUTH" "(redacted)" "(redacted)" "SETNAME" "me"' in ours
    assert '"SET" "a" "quote\\"and\\nnewline\\x00"' in ours
    assert not any("CONFIG" in line or "NOSUCH" in line for line in ours)


def test_monitor_names_unix_socket_clients_and_stops_on_reset(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = str(tmp_path / "rcp11.sock")
    server = server_factory(unixsocket=path)
    monitor = Monitor(server.port)
    client = redis.Redis(unix_socket_path=path)
    client.execute_command("TWRITE", "s", "x")
    # (redis-py's own connection set-up commands come first)
    assert monitor.until('"x"')[-1].endswith(f'[0 unix:{path}] "TWRITE" "s" "x"')
    monitor.sock.sendall(mbulk(b"RESET"))
    assert monitor.line() == "+RESET"
    client.execute_command("TWRITE", "s", "y")
    monitor.sock.sendall(mbulk(b"PING"))
    assert monitor.line() == "+PONG"  # no MONITOR line came before it
    client.close()
    monitor.sock.close()


def test_monitor_inside_exec_is_refused(fresh_server: ServerProcess) -> None:
    got = replies(fresh_server.port, [["MULTI"], ["MONITOR"], ["EXEC"], ["PING"]])
    assert [str(reply) for reply in got[2]] == [
        "ERR MONITOR isn't allowed for DENY BLOCKING client"
    ]
    assert got[3] == b"PONG"


def errorstats(port: int) -> str:
    for argv in (["CONFIG", "RESETSTAT"], ["GET"], ["NOSUCH"], ["SET", "k", "v"], ["INCR", "k"]):
        redis_cli(port, *argv)
    redis_cli(port, "DEL", "k")
    return redis_cli(port, "INFO", "errorstats")


def test_info_errorstats_counts_errors_by_code_as_redis(
    fresh_server: ServerProcess, redis_reference: RedisServer
) -> None:
    ours = errorstats(fresh_server.port)
    assert ours == errorstats(redis_reference.port)
    assert "errorstat_ERR:count=3" in ours


def test_info_server_says_which_event_loop_runs(fresh_server: ServerProcess) -> None:
    info = redis_cli(fresh_server.port, "INFO", "server")
    assert "multiplexing_api:uvloop\r" in info or "multiplexing_api:uvloop\n" in info


def test_scan_type_finds_streams_by_their_type_name_only(fresh_server: ServerProcess) -> None:
    r = fresh_server.client()
    r.execute_command("TWRITE", "s", "x")
    r.set("k", "v")
    assert r.type("s") == b"rcp11-log"
    assert r.execute_command("SCAN", 0, "TYPE", "rcp11-log") == (0, [b"s"])
    assert r.execute_command("SCAN", 0, "TYPE", "RCP11-LOG") == (0, [b"s"])
    assert r.execute_command("SCAN", 0, "TYPE", "stream") == (0, [])
    assert r.execute_command("SCAN", 0, "TYPE", "string") == (0, [b"k"])


def monitor_flags(port: int) -> str:
    monitor = Monitor(port)
    try:
        listing = redis_cli(port, "CLIENT", "LIST")
    finally:
        monitor.sock.close()
    return next(
        field.split("=")[1]
        for line in listing.splitlines()
        if "cmd=monitor" in line
        for field in line.split()
        if field.startswith("flags=")
    )


def test_client_list_flags_a_monitor_as_redis(
    fresh_server: ServerProcess, redis_reference: RedisServer
) -> None:
    assert monitor_flags(fresh_server.port) == monitor_flags(redis_reference.port) == "O"
