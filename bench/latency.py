"""Wake-up latency of a reader blocked on a stream.

One process holds two connections. For each sample the reader sends a
blocking read for the next message and the writer does a PING round trip,
so the read is parked in the server before the clock starts (both servers
handle connections in one event loop, in arrival order). Then the clock
starts, the writer appends one message and the clock stops when the
reader's reply is complete: write -> wake -> reply, end to end, as Kafka's
TestEndToEndLatency measures it (one message at a time).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import hiredis
import numpy as np

from bench.resp import encode_command


@dataclass
class LatencyResult:
    samples_us: np.ndarray

    def pct(self, q: float) -> float:
        """Percentile in milliseconds."""
        return float(np.percentile(self.samples_us, q)) / 1000.0

    @property
    def p50(self) -> float:
        return self.pct(50)

    @property
    def p99(self) -> float:
        return self.pct(99)

    @property
    def p999(self) -> float:
        return self.pct(99.9)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_reply(sock: socket.socket, reader: hiredis.Reader) -> object:
    while True:
        reply = reader.gets()
        if reply is not False:
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"server error: {reply}")
            return reply
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError("server closed the connection")
        reader.feed(data)


def wakeup_latency(port: int, flavour: str, samples: int, payload_size: int = 100) -> LatencyResult:
    """`flavour` "tread" (TREAD BLOCK + TWRITE) or "xread" (XREAD BLOCK + XADD)."""
    key = b"latency:" + flavour.encode()
    payload = b"x" * payload_size
    reader_sock, writer_sock = _connect(port), _connect(port)
    reader_parser, writer_parser = hiredis.Reader(), hiredis.Reader()
    ping = encode_command(b"PING")
    writer_sock.sendall(encode_command(b"DEL", key))
    _read_reply(writer_sock, writer_parser)
    if flavour == "tread":
        write_cmd = encode_command(b"TWRITE", key, payload)
    else:
        write_cmd = encode_command(b"XADD", key, b"*", b"f", payload)
    warmup = min(200, samples // 10)
    out = np.empty(samples, dtype=np.float64)
    try:
        for i in range(-warmup, samples):
            offset = i + warmup
            if flavour == "tread":
                read_cmd = encode_command(b"TREAD", key, offset, 1, b"BLOCK", 0)
            else:
                read_cmd = encode_command(b"XREAD", b"COUNT", 1, b"BLOCK", 0, b"STREAMS", key, b"$")
            reader_sock.sendall(read_cmd)
            writer_sock.sendall(ping)
            _read_reply(writer_sock, writer_parser)
            start = time.perf_counter_ns()
            writer_sock.sendall(write_cmd)
            reply = _read_reply(reader_sock, reader_parser)
            elapsed = time.perf_counter_ns() - start
            _read_reply(writer_sock, writer_parser)
            if not reply:
                raise RuntimeError(f"blocked read returned {reply!r}")
            if i >= 0:
                out[i] = elapsed / 1000.0
    finally:
        reader_sock.close()
        writer_sock.close()
    return LatencyResult(out)
