"""The raw socket client: exact request and reply bytes, hostile input,
connections the server closes, and a PING that says a server is up."""

from __future__ import annotations

import socket
from typing import Any

import hiredis


def mbulk(*args: bytes | str | int) -> bytes:
    """A request as a client sends it: a RESP array of bulk strings."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in parts)


def as_str(value: Any) -> Any:
    """bytes -> str, so RESP2 and RESP3 replies compare alike."""
    return value.decode() if isinstance(value, bytes) else value


def parse_reply(data: bytes) -> Any:
    """One reply's bytes as hiredis parses them (errors are ReplyError values)."""
    reader = hiredis.Reader()
    reader.feed(data)
    return reader.gets()


def parse_map(data: bytes) -> dict[Any, Any]:
    """A RESP3 map or RESP2 flat key/value array as a dict."""
    value = parse_reply(data)
    if isinstance(value, dict):
        return value
    return dict(zip(value[::2], value[1::2], strict=True))


def _reply_end(data: bytes, pos: int) -> int | None:
    """The index just past the RESP2/RESP3 reply starting at data[pos], or
    None while it is incomplete."""
    line_end = data.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind, head, after = data[pos : pos + 1], data[pos + 1 : line_end], line_end + 2
    if kind in (b"$", b"!", b"="):  # bulk string, blob error, verbatim string
        length = int(head)
        if length < 0:
            return after
        end = after + length + 2
        return end if len(data) >= end else None
    if kind in (b"*", b"~", b">"):
        elements = max(int(head), 0)
    elif kind in (b"%", b"|"):
        elements = 2 * int(head)
    else:  # a one-line reply: + - : _ , # (
        return after
    for _ in range(elements):
        end = _reply_end(data, after)
        if end is None:
            return None
        after = end
    if kind == b"|":  # an attribute comes before the reply it describes
        return _reply_end(data, after)
    return after


class RawClient:
    """A bare socket to a server: for what well-behaved clients never send,
    the exact bytes of replies, and connections the server should close.

    Every read takes from one buffer of received bytes, so parsed replies
    (reply(), call()) and raw reads (read_until(), ...) mix on a connection.
    Reads stop when the server closes the connection; read_until() and
    read_lines() raise TimeoutError when the server stays silent."""

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        *,
        source: str | None = None,
        timeout: float | None = 10.0,
        nodelay: bool = False,
        rcvbuf: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        if rcvbuf is not None:  # before connect(), so the window starts small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if nodelay:  # small writes tend to arrive as separate reads
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.connect((host, port))
        self.buffer = b""
        self.eof = False

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes, ignore_closed: bool = False) -> bool:
        """Send all of data. With ignore_closed, a connection the server
        already closed is not an error (it may close on a bad request
        before reading the rest); returns whether everything was sent."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            if not ignore_closed:
                raise
            return False
        return True

    def _receive(self) -> bool:
        """One recv() into the buffer; False once the server closed."""
        if self.eof:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def _take(self, end: int) -> bytes:
        data, self.buffer = self.buffer[:end], self.buffer[end:]
        return data

    def reply_bytes(self) -> bytes:
        """The exact bytes of the next reply."""
        while (end := _reply_end(self.buffer, 0)) is None:
            if not self._receive():
                raise ConnectionError(f"closed before a full reply: {self.buffer!r}")
        return self._take(end)

    def reply(self) -> Any:
        """The next reply as hiredis parses it (errors are ReplyError values)."""
        return parse_reply(self.reply_bytes())

    def call(self, *argv: bytes | str | int) -> bytes:
        """Send one command as a RESP array; the exact bytes of its reply."""
        self.send(mbulk(*argv))
        return self.reply_bytes()

    def command(self, *argv: bytes | str | int) -> Any:
        """Send one command as a RESP array; its reply as hiredis parses it."""
        self.send(mbulk(*argv))
        return self.reply()

    def read_until(self, end: bytes) -> bytes:
        """Everything received until it ends with `end`, or the server closes."""
        while not self.buffer.endswith(end) and self._receive():
            pass
        return self._take(len(self.buffer))

    def read_lines(self, count: int) -> bytes:
        """Everything received until it holds `count` CRLFs, or the server closes."""
        while self.buffer.count(b"\r\n") < count and self._receive():
            pass
        return self._take(len(self.buffer))

    def read_until_quiet(self, quiet: float = 0.3) -> bytes:
        """Everything received until nothing comes for `quiet` seconds, or
        the server closes (for answers of unknown length)."""
        timeout = self.sock.gettimeout()
        self.sock.settimeout(quiet)
        try:
            while self._receive():
                pass
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(timeout)
        return self._take(len(self.buffer))

    def read_until_closed(self) -> bytes:
        """Everything received until the server closes the connection."""
        while self._receive():
            pass
        return self._take(len(self.buffer))

    def closed(self, timeout: float | None = None) -> bool:
        """True when the server closes the connection (reading and keeping
        whatever it sends first), False when it stays open for the
        socket's timeout (or `timeout` seconds)."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            while self._receive():
                pass
        except TimeoutError:
            return False
        return True


def exchange(
    port: int,
    data: bytes,
    *,
    until: bytes = b"",
    lines: int = 0,
    timeout: float = 5.0,
    host: str = "127.0.0.1",
) -> bytes:
    """Send data on a fresh connection and return the answer: up to the
    bytes `until` ends with, or `lines` CRLFs, or else until the line goes
    quiet; in every case at most until the server closes."""
    with RawClient(port, host, timeout=timeout) as raw:
        raw.send(data, ignore_closed=True)
        if until:
            return raw.read_until(until)
        if lines:
            return raw.read_lines(lines)
        return raw.read_until_quiet()


def raw_pipeline(port: int, commands: list[list[str]]) -> bytes:
    """The replies' exact bytes to commands sent in one write."""
    data = b"".join(mbulk(*command) for command in commands) + mbulk("ECHO", "__end__")
    return exchange(port, data, until=b"$7\r\n__end__\r\n")[: -len(b"$7\r\n__end__\r\n")]


def answers_ping(port: int, timeout: float = 1.0) -> bool:
    """True when a server on `port` answers PING (+PONG, or -NOAUTH from
    one with a password), not while nothing listens or it still loads."""
    try:
        reply = exchange(port, b"PING\r\n", lines=1, timeout=timeout)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH"))
