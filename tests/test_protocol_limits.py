"""Limits on what a client may send and be sent (docs/PROTOCOL.md section 7,
"Protocol" and "Configuration"): proto-max-bulk-len,
client-query-buffer-limit, client-output-buffer-limit (hard and soft, a
fast reader and one that never reads), maxclients and the idle timeout.
Each closes only the client over it, as redis-server does.

A client that pipelines big reads and never reads the replies cannot grow
the server (issue 8, item 5): 2000 pipelined `TREAD big 0 1000` (44 KB
replies each) that were never read grew the server to 3.99 GB and stalled
it for 9 s even with `client-output-buffer-limit normal 10mb 5mb 10`: one
read of the pipeline ran every command it held before any limit was looked
at. Now the pending output (queued replies + the transport's buffer) is
checked before each command: over the hard limit the client is closed at
once, and with no limit its commands wait while its output is over a
high-water mark. Memory is measured as the server's peak RSS (VmHWM), not
time.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import hiredis
import pytest
import redis
from conftest import (
    RawClient,
    ServerProcess,
    exchange,
    mbulk,
    tr,
    tw,
    wait_for,
)

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
    closed = "(output buffer hard limit"  # the second of the two lines it logs
    assert pings_during(srv, lambda: closed in srv.output()) >= 1
    assert "scheduled to be closed ASAP for overcoming of output buffer limits" in srv.output()
    sender.join(30)
    assert (status_kb(srv, "VmHWM") - rss_before) * 1024 < RSS_BOUND
    assert received_until_closed(sock) < REQUESTS * len(reply)
    assert srv.client().execute_command("TREAD", "big", "0", "2") == [MESSAGE] * 2


def calls_of(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def tread_calls(client: redis.Redis) -> int:
    return calls_of(client, "tread")


@pytest.mark.slow
@pytest.mark.parametrize("lane_sockets", ["yes", "no"])
def test_unread_pipeline_over_the_hard_limit_runs_nothing_after_it(
    server_factory: Callable[..., ServerProcess], lane_sockets: str
) -> None:
    """Once a client's unsent replies pass the hard limit, the rest of its
    pipeline is not run (redis-server stops reading a client it closes
    asynchronously): the TWRITE queued behind 2000 TREADs of 44 KB neither
    changes the stream nor reaches the AOF, and only the TREADs up to the
    limit were built (10 MB of 88 MB), on the C lane's socket loop and on
    asyncio's alike."""
    srv = server_factory(
        client_output_buffer_limit="normal 10mb 5mb 10",
        appendonly="yes",
        lane_sockets=lane_sockets,
    )
    reply = fill(srv)
    sock = attacker(srv)
    body = mbulk(b"TREAD", b"big", b"0", b"1000") * REQUESTS + mbulk(b"TWRITE", b"after", b"x")
    send_in_background(sock, body)
    closed = "(output buffer hard limit"
    assert pings_during(srv, lambda: closed in srv.output()) >= 1
    client = srv.client()
    assert wait_for(lambda: not [c for c in client.client_list() if c["cmd"] == "tread"])
    # 10 MB / 44 KB = 238 replies, plus what the kernel's socket buffer took.
    built = tread_calls(client)
    assert 0 < built < REQUESTS // 4, built
    assert built * len(reply) < 20 * 2**20
    assert client.exists("after") == 0
    assert b"after" not in (srv.dir / "appendonly.aof").read_bytes()
    received_until_closed(sock)


def counts_seen_while_served(
    srv: ServerProcess, command: str, request: bytes, count: int, reply_size: int
) -> list[int]:
    """A client pipelines count requests (in one send) and reads every
    reply meanwhile; another client's INFO is asked until all of them ran.
    Returns the counts it saw strictly between none and all: the other
    client was answered while the pipeline was part done."""
    client = srv.client()
    assert calls_of(client, command) == 0  # connected before the pipeline starts
    sock = srv.raw(timeout=None).sock
    received: list[int] = []
    reader = threading.Thread(target=lambda: received.append(read_bytes(sock, count * reply_size)))
    reader.start()
    sock.sendall(request * count)
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while (calls := calls_of(client, command)) < count:
        assert time.monotonic() < deadline, sorted(seen)
        seen.add(calls)
    reader.join(60)
    sock.close()
    assert received == [count * reply_size]  # every reply, whole
    return sorted(n for n in seen if 0 < n < count)


def read_bytes(sock: socket.socket, size: int) -> int:
    sock.settimeout(60)
    got = 0
    while got < size and (chunk := sock.recv(1 << 20)):
        got += len(chunk)
    return got


@pytest.mark.slow
@pytest.mark.parametrize("lane_sockets", ["yes", "no"])
def test_big_replies_under_a_high_output_limit_leave_turns_to_other_clients(
    server_factory: Callable[..., ServerProcess], lane_sockets: str
) -> None:
    """With a hard limit far above the replies (256 MB), one read of
    pipelined TREADs of 44 KB (600 of them: 26 MB of replies, 70 MB for a
    64 KB read) was run in one go by the C lane, on both paths: no other
    client was answered until all of it was built. A run builds a few MB of
    replies at most now; between runs others are served, so another
    client's INFO sees the pipeline part done."""
    srv = server_factory(client_output_buffer_limit="normal 256mb 0 0", lane_sockets=lane_sockets)
    reply = fill(srv)
    request = mbulk(b"TREAD", b"big", b"0", b"1000")
    # 600 requests are 25 KB: one send, one read of the server's.
    assert counts_seen_while_served(srv, "tread", request, 600, len(reply))


@pytest.mark.slow
@pytest.mark.parametrize("lane_sockets", ["yes", "no"])
def test_big_general_path_replies_under_a_high_output_limit_leave_turns(
    server_factory: Callable[..., ServerProcess], lane_sockets: str
) -> None:
    """The same through the general path (GET is not the lane's): it read
    the clock every 64 commands only, so 60 pipelined GETs of a 1 MB value
    were one stretch of 60 MB. It reads the clock after every few MB of
    replies too."""
    srv = server_factory(client_output_buffer_limit="normal 256mb 0 0", lane_sockets=lane_sockets)
    value = b"v" * 2**20
    srv.client().set("k", value)
    reply = b"$%d\r\n%s\r\n" % (len(value), value)
    assert counts_seen_while_served(srv, "get", mbulk(b"GET", b"k"), 60, len(reply))


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
    closed = "(output buffer soft limit"  # the second of the two lines it logs
    assert pings_during(srv, lambda: closed in srv.output()) >= 1
    assert "scheduled to be closed ASAP for overcoming of output buffer limits" in srv.output()
    received_until_closed(sock)


# ------------------------------------------------------------------ requests


@pytest.mark.slow
def test_bulk_over_proto_max_bulk_len(server_factory) -> None:
    srv = server_factory(proto_max_bulk_len="1mb")
    conn = RawClient(srv.port)
    # Only the header: the error comes before any payload is sent.
    conn.send(b"*3\r\n$6\r\nTWRITE\r\n$1\r\nh\r\n$%d\r\n" % (1024 * 1024 + 1))
    assert str(conn.reply()) == "ERR Protocol error: invalid bulk length"
    assert conn.closed()
    ok = RawClient(srv.port)
    ok.send(mbulk(b"TWRITE", b"h", b"x" * (1024 * 1024)))
    assert ok.reply() == 0


def test_runtime_limit_change_applies_to_open_connections(fresh_server: ServerProcess) -> None:
    conn = RawClient(fresh_server.port)
    conn.send(mbulk(b"PING"))
    assert conn.reply() == b"PONG"
    fresh_server.client().config_set("proto-max-bulk-len", "1mb")
    conn.send(b"*2\r\n$4\r\nECHO\r\n$2000000\r\n")
    assert str(conn.reply()) == "ERR Protocol error: invalid bulk length"


@pytest.mark.slow
def test_query_buffer_limit(server_factory) -> None:
    srv = server_factory(client_query_buffer_limit="1mb")
    other = srv.client()
    conn = RawClient(srv.port)
    conn.send(b"*3\r\n$6\r\nTWRITE\r\n$1\r\nq\r\n$3000000\r\n")
    try:
        conn.send(b"x" * (2 * 1024 * 1024))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert conn.closed()
    assert other.ping() is True
    assert wait_for(lambda: "max query buffer length" in srv.output())


@pytest.mark.slow
def test_blocked_client_is_held_to_the_query_buffer_limit(server_factory) -> None:
    # A blocked client's pipeline waits unparsed; past the limit it is closed
    # instead of growing the server's memory.
    srv = server_factory(client_query_buffer_limit="1mb")
    conn = RawClient(srv.port)
    conn.send(mbulk(b"TREAD", b"nothing", b"0", b"1", b"BLOCK", b"0"))
    assert wait_for(lambda: srv.client().info("clients")["blocked_clients"] == 1)
    try:
        for _ in range(30):
            conn.send(mbulk(b"PING", b"x" * 100_000) * 1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert conn.closed()
    assert wait_for(lambda: "max query buffer length" in srv.output())
    assert srv.client().info("clients")["blocked_clients"] == 0


def test_proto_max_bulk_len_closes_the_client_and_writes_nothing(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    shared_client.config_set("proto-max-bulk-len", "1mb")
    try:
        big = 2 * 1024 * 1024
        with shared_server.raw() as raw:
            raw.send(b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$%d\r\n" % big + b"x" * 1000)
            assert raw.read_until_closed() == b"-ERR Protocol error: invalid bulk length\r\n"
        assert shared_client.exists("s") == 0
        assert tw(shared_client, "s", b"y" * (1024 * 1024)) == 0
    finally:
        shared_client.config_set("proto-max-bulk-len", "512mb")


def test_query_buffer_limit_closes_only_that_client(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    shared_client.config_set("client-query-buffer-limit", "1mb")
    try:
        with shared_server.raw() as raw:
            header = b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$%d\r\n" % (3 * 1024 * 1024)
            raw.send(header + b"x" * (2 * 1024 * 1024), ignore_closed=True)
            assert raw.closed(timeout=3)
        assert shared_client.ping() and shared_client.exists("s") == 0
    finally:
        shared_client.config_set("client-query-buffer-limit", "1gb")


# ------------------------------------------------------------------- replies


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "reason"), [("normal 2mb 0 0", "hard limit"), ("normal 0 1mb 1", "soft limit")]
)
def test_output_buffer_limit_disconnects_slow_reader(
    server_factory, limit: str, reason: str
) -> None:
    srv = server_factory(client_output_buffer_limit=limit)
    writer = srv.client()
    chunk = b"y" * 10_000
    for _ in range(10):
        writer.execute_command("TWRITE", "big", "ENTRIES", *[chunk] * 100)
    slow = srv.raw(rcvbuf=4096)
    for _ in range(20):
        if not slow.send(mbulk(b"TREAD", b"big", b"0", b"1000"), ignore_closed=True):
            break
    # Two log lines: "... closed ASAP for overcoming of output buffer limits"
    # then "(output buffer <reason> ... passed ...)": wait for the one checked.
    assert wait_for(lambda: f"(output buffer {reason}" in srv.output())
    assert "overcoming of output buffer limits" in srv.output()
    assert writer.ping() is True
    slow.close()


@pytest.mark.slow
def test_one_reply_over_the_hard_limit_closes_even_a_fast_reader(server_factory) -> None:
    srv = server_factory(client_output_buffer_limit="normal 100kb 50kb 1")
    writer = srv.client()
    writer.execute_command("TWRITE", "big", "ENTRIES", *[b"z" * 1000] * 500)
    with srv.raw() as reader:
        reader.send(mbulk(b"TREAD", b"big", b"0", b"500"))
        received = reader.read_until_closed()

    # The 500 KB reply is over the 100 KB hard limit: none of it is sent.
    assert len(received) < 100_000
    assert wait_for(lambda: "output buffer limits" in srv.output())
    assert writer.execute_command("TREAD", "big", "0", "2") == [b"z" * 1000] * 2


@pytest.mark.slow
def test_transaction_past_the_hard_limit_is_closed_without_building_the_rest(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """Issue 23: one EXEC of 1000 `TREAD big 0 1000` (1 MB replies each)
    from a client that never reads built every reply after the client was
    past its output limit (5 s and 1.9 GB of RSS, other clients stopped).
    The client is closed once its replies pass the hard limit, as Redis's
    addReply closes it; the rest of the transaction still runs (it is
    atomic) but builds no reply: the write and the group read queued after
    the reads happen."""
    srv = server_factory(client_output_buffer_limit="normal 10mb 5mb 10")
    srv.client().execute_command("TWRITE", "big", "ENTRIES", *[b"m" * 1000] * 1000)
    rss_before = status_kb(srv, "VmRSS")
    sock = attacker(srv)
    body = mbulk(b"MULTI") + mbulk(b"TREAD", b"big", b"0", b"1000") * 1000
    body += mbulk(b"TWRITE", b"after", b"x") + mbulk(b"TREAD", b"big", b"0", b"7", b"GROUP", b"g")
    send_in_background(sock, body + mbulk(b"EXEC"))
    closed = "scheduled to be closed ASAP for overcoming of output buffer limits"
    assert pings_during(srv, lambda: closed in srv.output()) >= 1
    assert "hard limit" in srv.output()
    assert received_until_closed(sock) < 12 * 2**20
    assert (status_kb(srv, "VmHWM") - rss_before) * 1024 < RSS_BOUND  # was 1.9 GB
    client = srv.client()
    assert wait_for(lambda: client.execute_command("TREAD", "after", "0", "1") == [b"x"])
    assert client.get("g") == b"7"


@pytest.mark.slow
@pytest.mark.parametrize(
    "inside, options",
    [
        ("pipeline", ()),
        ("transaction", ()),
        ("pipeline", (b"WITHTIMES",)),
        ("pipeline", (b"PACKED",)),
        ("transaction", (b"PACKED", b"WITHTIMES")),
    ],
)
def test_one_read_over_the_hard_limit_is_not_built(
    server_factory: Callable[..., ServerProcess], inside: str, options: tuple[bytes, ...]
) -> None:
    """One TREAD whose reply (96 MB) is over the 10 MB hard limit closes
    the client without the server building it: it is sized from the
    nodes first (issue 23: building replies for a client past its limit
    stalled the server). Alone, or inside a transaction; with times, or
    in the PACKED form."""
    srv = server_factory(client_output_buffer_limit="normal 10mb 5mb 10")
    writer = srv.client()
    for _ in range(64):
        writer.execute_command("TWRITE", "big", "ENTRIES", *[b"m" * 1500] * 1000)
    rss_before = status_kb(srv, "VmRSS")
    request = mbulk(b"TREAD", b"big", b"0", b"64000", *options)
    if inside == "transaction":
        request = mbulk(b"MULTI") + request + mbulk(b"EXEC")
    with srv.raw(rcvbuf=4096) as reader:
        reader.send(request)
        received = reader.read_until_closed()
    assert len(received) < 12 * 2**20
    assert wait_for(lambda: "output buffer limits" in srv.output())
    assert (status_kb(srv, "VmHWM") - rss_before) * 1024 < RSS_BOUND  # the reply is 96 MB
    assert writer.execute_command("TREAD", "big", "0", "1") == [b"m" * 1500]


def test_reply_over_the_output_buffer_hard_limit_closes_that_client_only(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    tw(shared_client, "big", *[b"x" * 1000] * 500)
    shared_client.config_set("client-output-buffer-limit", "normal 100kb 50kb 1")
    try:
        with shared_server.raw(timeout=5) as raw:
            raw.send(b"TREAD big 0 500\r\n")
            got = len(raw.read_until_closed())
        assert got < 500 * 1000  # closed instead of sending the whole reply
        assert len(tr(shared_client, "big", 0, 50)) == 50  # a small reply still goes out
    finally:
        shared_client.config_set("client-output-buffer-limit", "normal 0 0 0")
    assert len(tr(shared_client, "big", 0, 500)) == 500


# ------------------------------------------------------------------- clients


@pytest.mark.slow
def test_maxclients(server_factory) -> None:
    srv = server_factory(maxclients=2)
    first = RawClient(srv.port)
    first.send(mbulk(b"PING"))
    assert first.reply() == b"PONG"
    second = RawClient(srv.port)
    second.send(mbulk(b"PING"))
    assert second.reply() == b"PONG"
    third = RawClient(srv.port)
    assert str(third.reply()) == "ERR max number of clients reached"
    assert third.closed()
    first.close()
    wait_for(lambda: b"connected_clients:1\r\n" in second.command("INFO", "clients"))
    fourth = RawClient(srv.port)
    fourth.send(mbulk(b"PING"))
    assert fourth.reply() == b"PONG"


@pytest.mark.slow
def test_idle_timeout(server_factory) -> None:
    """The idle client is closed; one whose every request the C lane runs
    (TWRITE: no Python call per request) is not idle and stays."""
    srv = server_factory(timeout=1)
    busy = RawClient(srv.port)  # older than the idle one
    assert busy.call("TWRITE", "busy", "x") == b":0\r\n"
    idle = RawClient(srv.port)
    idle.send(mbulk(b"PING"))
    assert idle.reply() == b"PONG"
    deadline = time.monotonic() + 6
    writes = 1
    while not idle.closed(timeout=0.2):
        assert time.monotonic() < deadline, "the idle client was never closed"
        assert busy.call("TWRITE", "busy", "x") == b":%d\r\n" % writes
        writes += 1
    assert writes >= 4  # the busy one outlived the timeout
    assert busy.call("TWRITE", "busy", "x") == b":%d\r\n" % writes
    busy.close()


@pytest.mark.slow
def test_maxclients_refuses_the_extra_client(server_factory: Any) -> None:
    srv = server_factory(maxclients=3)
    held = [srv.raw() for _ in range(3)]
    for raw in held:
        assert raw.call("PING") == b"+PONG\r\n"
    with RawClient(srv.port, timeout=3) as extra:
        out = extra.read_until_closed()  # the server speaks first, then closes
    assert out == b"-ERR max number of clients reached\r\n"
    held.pop().close()
    wait_for(lambda: b"connected_clients:2\r\n" in held[0].command("INFO", "clients"))
    assert exchange(srv.port, b"PING\r\n", lines=1) == b"+PONG\r\n"
    assert b"rejected_connections:1\r\n" in held[0].command("INFO", "stats")
    for raw in held:
        raw.close()
