"""A client that pipelines big reads and never reads the replies cannot grow
the server (issue 8, item 5).

2000 pipelined `TREAD big 0 1000` (44 KB replies each) that were never read
grew the server to 3.99 GB and stalled it for 9 s even with
`client-output-buffer-limit normal 10mb 5mb 10`: one read of the pipeline
ran every command it held before any limit was looked at. Now the pending
output (queued replies + the transport's buffer) is checked before each
command: over the hard limit the client is closed at once, and with no limit
its commands wait while its output is over a high-water mark. Memory is
measured as the server's peak RSS (VmHWM), not time.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import hiredis
import pytest
from conftest import ServerProcess, mbulk

MESSAGE = b"m" * 40
REQUESTS = 2000
# The peak RSS the attack may add: the 10 MB hard limit or the 4 MB
# high-water mark, one 44 KB reply past it, the transport's buffer, and the
# allocator's slack. Without the checks it grew by gigabytes.
RSS_BOUND = 64 * 1024 * 1024


def status_kb(srv: ServerProcess, field: str) -> int:
    assert srv.proc is not None
    with open(f"/proc/{srv.proc.pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc status")


def fill(srv: ServerProcess) -> bytes:
    """`big` holds 1000 messages; returns one TREAD reply's exact bytes."""
    client = srv.client()
    client.execute_command("TWRITE", "big", "ENTRIES", *[MESSAGE] * 1000)
    return b"*1000\r\n" + b"$40\r\n" + b"\r\n$40\r\n".join([MESSAGE] * 1000) + b"\r\n"


def attacker(srv: ServerProcess) -> socket.socket:
    """A client with a tiny receive window that blocks until it can send."""
    return srv.raw(rcvbuf=4096, timeout=None).sock


def send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    def send() -> None:
        try:
            sock.sendall(data)
        except OSError:
            pass  # closed by the server: that is one of the answers

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def received_until_closed(sock: socket.socket) -> int:
    sock.settimeout(30)
    received = 0
    try:
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
    except ConnectionResetError:
        pass
    sock.close()
    return received


def pings_during(srv: ServerProcess, until: Callable[[], bool]) -> int:
    """Another client PINGs until until() holds; returns how many answered."""
    other = srv.client(socket_timeout=60)
    answered = 0
    deadline = time.monotonic() + 60
    while not until():
        assert time.monotonic() < deadline, "the condition never held"
        assert other.ping() is True
        answered += 1
    assert other.ping() is True
    return answered + 1


@pytest.mark.slow
def test_unread_pipeline_over_the_hard_limit_is_closed_and_memory_stays_bounded(
    server_factory: Callable[..., ServerProcess],
) -> None:
    srv = server_factory(client_output_buffer_limit="normal 10mb 5mb 10")
    reply = fill(srv)
    rss_before = status_kb(srv, "VmRSS")
    sock = attacker(srv)
    sender = send_in_background(sock, mbulk(b"TREAD", b"big", b"0", b"1000") * REQUESTS)
    closed = "scheduled to be closed ASAP for overcoming of output buffer limits"
    assert pings_during(srv, lambda: closed in srv.output()) >= 1
    sender.join(30)
    assert (status_kb(srv, "VmHWM") - rss_before) * 1024 < RSS_BOUND
    assert "hard limit" in srv.output()
    assert received_until_closed(sock) < REQUESTS * len(reply)
    assert srv.client().execute_command("TREAD", "big", "0", "2") == [MESSAGE] * 2


@pytest.mark.slow
def test_unread_pipeline_without_limits_is_held_then_gets_every_reply(
    server_factory: Callable[..., ServerProcess],
) -> None:
    srv = server_factory()  # client-output-buffer-limit normal 0 0 0
    reply = fill(srv)
    rss_before = status_kb(srv, "VmRSS")
    sock = attacker(srv)
    sender = send_in_background(sock, mbulk(b"TREAD", b"big", b"0", b"1000") * REQUESTS)
    client = srv.client()

    def held() -> bool:
        # The attacker's output is pending: the server stopped running its
        # commands (else its memory would grow, checked below).
        line = [c for c in client.client_list() if c["cmd"] == "tread"]
        return bool(line) and int(line[0]["omem"]) > 0

    assert pings_during(srv, held) >= 1
    assert (status_kb(srv, "VmHWM") - rss_before) * 1024 < RSS_BOUND
    # Now the attacker reads: every reply arrives, whole and in order.
    sock.settimeout(60)
    reader = hiredis.Reader()
    replies = 0
    while replies < REQUESTS:
        chunk = sock.recv(1 << 20)
        assert chunk, f"closed after {replies} replies"
        reader.feed(chunk)
        while (got := reader.gets()) is not False:
            assert got == [MESSAGE] * 1000, replies
            replies += 1
    assert reader.gets() is False  # nothing more than the replies asked for
    assert len(reply) * REQUESTS > 80 * 2**20  # 88 MB were held back, not buffered
    sender.join(30)
    sock.close()
    assert "output buffer limits" not in srv.output()


@pytest.mark.slow
def test_soft_limit_closes_a_client_over_it_for_its_seconds(
    server_factory: Callable[..., ServerProcess],
) -> None:
    srv = server_factory(client_output_buffer_limit="normal 0 1mb 1")
    fill(srv)
    sock = attacker(srv)
    send_in_background(sock, mbulk(b"TREAD", b"big", b"0", b"1000") * REQUESTS)
    closed = "scheduled to be closed ASAP for overcoming of output buffer limits"
    assert pings_during(srv, lambda: closed in srv.output()) >= 1
    assert "soft limit" in srv.output()
    received_until_closed(sock)
