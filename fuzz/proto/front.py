"""The server's front end in process, over socketpairs: the real Server and
Connection classes, clients served either by the C lane's own event loop
(src/netloop.c, rcp11/server/netloop.py) or by asyncio transports with the
Python lane turned off (the general path alone), driven read by read.

Used by the `loop` fuzz target and tests/test_dispatch_lane.py to hold the
C loop to the general path: each chunk is sent whole before the loop
runs, so the server reads exactly that chunk, as one read of the real
server.
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
    """One server front end on `state` and `clients` connected sockets.

    c_loop=True: the connections belong to the C lane's loop; False: to
    asyncio transports, with the Python lane (run_lane, run_buffered) off,
    so every request runs through the parser and run_pipeline(). Timers
    never fire (BLOCK timeouts expire only when the caller says so) and
    persistence is not flushed (its AOF buffer keeps everything for the
    comparison). ids: the clients' ids (CLIENT UNBLOCK names them)."""

    def __init__(
        self, state: ServerState, c_loop: bool, clients: int = 1, ids: list[int] | None = None
    ) -> None:
        self.loop = uvloop.new_event_loop()
        self.state = state
        state.config.set("protected-mode", "no")
        state.persistence.flush = lambda: True  # type: ignore[method-assign]
        self.server = Server(state, self.loop)
        self.server.arm_block_timer = lambda: None  # type: ignore[method-assign]
        self._saved = (connection_module.run_lane, connection_module.run_buffered)
        if c_loop:
            self.server.netloop = NetLoop(self.server)
        else:
            connection_module.run_lane = _no_lane  # type: ignore[assignment]
            connection_module.run_buffered = _no_lane  # type: ignore[assignment]
        self.peers: list[socket.socket] = []
        self.conns: list[Connection] = []
        for i in range(clients):
            ours, peer = socket.socketpair()
            peer.setblocking(False)
            self.peers.append(peer)
            before = set(self.server.connections)
            if c_loop:
                self.server.netloop.adopt(ours, None)  # type: ignore[union-attr]
            else:
                self.loop.run_until_complete(self._accept(ours))
            (new,) = set(self.server.connections) - before
            conn = self.server.connections[new]
            if ids is not None:
                self._rename(conn, ids[i])
            self.conns.append(conn)
        self.run()

    async def _accept(self, sock: socket.socket) -> None:
        await self.loop.connect_accepted_socket(lambda: Connection(self.server), sock)

    def _rename(self, conn: Connection, client_id: int) -> None:
        client = conn.client
        assert client is not None
        del self.state.clients[client.id]
        del self.server.connections[client.id]
        client.id = client_id
        self.state.clients[client_id] = client
        self.server.connections[client_id] = conn

    @property
    def conn(self) -> Connection:
        return self.conns[0]

    @property
    def client(self) -> Any:
        return self.conns[0].client

    def run(self) -> None:
        for _ in range(TURNS):
            self.loop.run_until_complete(asyncio.sleep(0))

    def received(self, index: int = 0) -> bytes:
        """What client index has been sent since the last call."""
        out = b""
        while True:
            try:
                chunk = self.peers[index].recv(1 << 20)
            except BlockingIOError:
                return out
            if not chunk:
                return out
            out += chunk

    def turn(self) -> bytes:
        """Run the loop until what was sent is served; the bytes client 0
        received."""
        self.run()
        return self.received(0)

    def send(self, data: bytes, index: int = 0) -> bytes:
        """data as one read of the server from client index; what that
        client received after it."""
        self.peers[index].sendall(data)
        self.run()
        return self.received(index)

    def close(self) -> None:
        connection_module.run_lane, connection_module.run_buffered = self._saved  # type: ignore[assignment]
        for peer in self.peers:
            peer.close()
        self.run()  # the server sees the end of the connections
        if self.server.netloop is not None:
            self.server.netloop.close()
        self.loop.close()


__all__ = ["SocketFront"]
