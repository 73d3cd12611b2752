"""The C loop's poll budget (src/netloop.c, OUTPUT): once a poll's runs
built poll_reply_bytes of replies, the connections not read yet wait for
the next poll. Every one of them must get its turn, whatever order epoll
hands them back in."""

from __future__ import annotations

import collections
import socket
from typing import Any

from rcp11.storage import Stream
from rcp11.storage.lane import KEY_READ
from rcp11.storage.netloop import CConnection, CLoop

ENTRY = b"x" * 1000
# TREAD <28-byte key> 0 1: 64 bytes, so a 64 KB read ends on a request.
REQUEST = b"*4\r\n$5\r\nTREAD\r\n$28\r\n" + b"k" * 28 + b"\r\n$1\r\n0\r\n$1\r\n1\r\n"
REPLY = b"*1\r\n$1000\r\n" + ENTRY + b"\r\n"
# One run fills the budget exactly (88 replies), so the poll's first read
# takes it all and every other connection waits.
BUDGET = 88 * len(REPLY)
HUGE = 1 << 40


class _Owner:
    """The loop's owner: the stream for every key, and a Python side that
    takes the rest of a read at once (so only the C loop decides who is
    read)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.reads: collections.Counter[str] = collections.Counter()

    def resolve(self, key: bytes) -> tuple[int, Any, int]:
        return KEY_READ, self.stream, 0

    def on_data(self, transport: Any, data: bytes) -> None:
        self.reads[transport.name] += 1
        transport.conn.set_lane(True, HUGE, 1 << 16)


class _Transport:
    def __init__(self, name: str) -> None:
        self.name = name
        self.conn: CConnection | None = None

    def on_closed(self, err: int) -> None:
        pass

    def on_water(self, over: int) -> None:
        pass


def _fill(peer: socket.socket, left: bytes) -> bytes:
    """Send requests until the socket is full; returns what did not fit
    of the last piece (sent first next time, so reads stay aligned)."""
    try:
        while True:
            data = left or REQUEST * 4096
            left = data[peer.send(data) :]
    except BlockingIOError:
        return left


def _drain(peer: socket.socket) -> None:
    try:
        while peer.recv(1 << 22):
            pass
    except BlockingIOError:
        pass


def test_every_waiting_connection_is_read_in_turn() -> None:
    assert len(REQUEST) == 64
    stream = Stream()
    stream.append([ENTRY])
    owner = _Owner(stream)
    loop = CLoop(owner)
    loop.set_limits(1 << 29, 1 << 20, 1000, BUDGET)
    loop.lane_on(0, 0, 0, 1 << 62, None)
    names = "ABCD"
    peers: dict[str, socket.socket] = {}
    transports = []
    left = dict.fromkeys(names, b"")
    try:
        for name in names:
            ours, peer = socket.socketpair()
            ours.setblocking(False)
            peer.setblocking(False)
            transport = _Transport(name)
            transport.conn = CConnection(loop, ours.detach(), transport)
            transport.conn.set_lane(True, HUGE, 1 << 16)
            transports.append(transport)
            peers[name] = peer
        for _ in range(8 * len(names)):
            for name in names:
                left[name] = _fill(peers[name], left[name])
            loop.run(1, 0)  # one poll
            if loop.batch_pending():
                loop.reset_batch()
            loop.flush()
            for peer in peers.values():
                _drain(peer)
        # Each poll reads one connection (its run takes the budget): in
        # turn, each is read 8 times. Before, the first two took every
        # poll between them and the others were never read.
        assert dict(owner.reads) == dict.fromkeys(names, 8)
    finally:
        for transport in transports:
            assert transport.conn is not None
            transport.conn.close(abort=True)
            transport.conn.free()
        for peer in peers.values():
            peer.close()
        loop.close()
