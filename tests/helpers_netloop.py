"""A server's front end in process, over socketpairs: the real Server and
Connection classes, one client connection served either by the C lane's
loop (src/netloop.c, rcp11/server/netloop.py) or by asyncio's transport
with the Python lane turned off (the general path alone), driven read by
read.

Used by tests/test_dispatch_lane.py to hold the C loop to the general
path: each chunk is sent whole before the loop runs, so the server reads
exactly that chunk, as a read of the real server would be.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvloop

from rcp11.server import connection as connection_module
from rcp11.server.connection import Connection
from rcp11.server.listeners import Server
from rcp11.server.netloop import NetLoop
from rcp11.state import ServerState

# Loop turns after each chunk: the read, then what it schedules (a flush, a
# client resumed after a block, its flush).
TURNS = 8


def _no_lane(*args: Any) -> tuple[int, int]:
    """run_lane() and run_buffered() that run nothing (out_bytes is their
    second to last argument)."""
    return 0, args[-2]


class SocketFront:
    """One server front end on `state` and one connected client socket.

    c_loop=True: the connection belongs to the C lane's loop; False: to an
    asyncio transport, with the Python lane (run_lane, run_buffered) off, so
    every request runs through the parser and run_pipeline(). Timers never fire (BLOCK
    timeouts expire only when the test says so) and persistence is not
    flushed (its AOF buffer keeps everything for the comparison)."""

    def __init__(self, state: ServerState, c_loop: bool, client_id: int | None = None) -> None:
        self.loop = uvloop.new_event_loop()
        self.state = state
        state.config.set("protected-mode", "no")
        state.persistence.flush = lambda: True  # type: ignore[method-assign]
        self.server = Server(state, self.loop)
        self.server.arm_block_timer = lambda: None  # type: ignore[method-assign]
        ours, self.peer = socket.socketpair()
        self.peer.setblocking(False)
        self._saved = (connection_module.run_lane, connection_module.run_buffered)
        if c_loop:
            self.server.netloop = NetLoop(self.server)
            self.server.netloop.adopt(ours, None)
        else:
            connection_module.run_lane = _no_lane  # type: ignore[assignment]
            connection_module.run_buffered = _no_lane  # type: ignore[assignment]

            async def accept() -> None:
                await self.loop.connect_accepted_socket(lambda: Connection(self.server), ours)

            self.loop.run_until_complete(accept())
        (self.conn,) = self.server.connections.values()
        if client_id is not None:
            client = self.conn.client
            del state.clients[client.id]
            del self.server.connections[client.id]
            client.id = client_id
            state.clients[client_id] = client
            self.server.connections[client_id] = self.conn
        self.turn()

    @property
    def client(self) -> Any:
        return self.conn.client

    def run(self) -> None:
        for _ in range(TURNS):
            self.loop.run_until_complete(asyncio.sleep(0))

    def turn(self) -> bytes:
        """Run the loop until what was sent is served; the bytes received."""
        self.run()
        received = b""
        while True:
            try:
                chunk = self.peer.recv(1 << 20)
            except BlockingIOError:
                return received
            if not chunk:
                return received
            received += chunk

    def send(self, data: bytes) -> bytes:
        """data as one read of the server; the replies it produced."""
        self.peer.sendall(data)
        return self.turn()

    def close(self) -> None:
        connection_module.run_lane, connection_module.run_buffered = self._saved  # type: ignore[assignment]
        self.peer.close()
        self.run()  # the server sees the end of the connection
        if self.server.netloop is not None:
            self.server.netloop.close()
        self.loop.close()
