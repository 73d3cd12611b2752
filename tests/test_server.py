"""The network front end, end to end: real rcp11-server processes, raw
sockets, redis-py, redis-cli and redis-benchmark."""

from __future__ import annotations

import os
import re

import redis
from conftest import (
    RawClient,
    ServerProcess,
    mbulk,
)

from rcp11.state import NullPersistence

LOG_LINE = re.compile(r"^\d+:[MC] \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2}\.\d{3} [.\-*#] .+")


# -- protocol -------------------------------------------------------------------


def test_quit_closes_after_reply(shared_server: ServerProcess) -> None:
    conn = RawClient(shared_server.port)
    conn.send(mbulk(b"QUIT") + mbulk(b"PING"))
    assert conn.reply() == b"OK"
    assert conn.closed()


# -- limits -----------------------------------------------------------------------


# -- start-up, signals, daemon ------------------------------------------------------


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- tools --------------------------------------------------------------------------


class FakeTransport:
    """Just enough of an asyncio transport to drive a Connection in-process."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def make_connection(persistence: object) -> tuple[object, object, FakeTransport]:
    import asyncio

    from rcp11 import server as server_module
    from rcp11.blocking import BlockingManager
    from rcp11.config import Config
    from rcp11.state import ServerState

    config = Config()
    config.apply_args(["--save", ""])
    state = ServerState(config)
    BlockingManager(state)
    state.persistence = persistence  # type: ignore[assignment]
    srv = server_module.Server(state, asyncio.new_event_loop())
    conn = server_module.Connection(srv)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return srv, conn, transport


class RecordingPersistence(NullPersistence):
    aof_state = "on"

    def __init__(self, outcome: bool) -> None:
        self.outcome = outcome
        self.logged: list[list[bytes]] = []
        self.flushed_before_write: list[bool] = []
        self.transport: FakeTransport | None = None

    def propagate(self, argv: list[bytes]) -> None:
        self.logged.append(argv)

    def flush(self) -> bool:
        assert self.transport is not None
        # nothing of this iteration may have reached the socket yet
        self.flushed_before_write.append(not self.transport.written)
        return self.outcome


def _answers(client: redis.Redis) -> bool:
    try:
        return client.ping() is True
    except redis.ConnectionError:
        return False
