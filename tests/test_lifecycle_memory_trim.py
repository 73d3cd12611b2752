"""Memory freed by deleting keys goes back to the system: glibc's malloc
keeps it for reuse, and a server whose keys were all deleted stayed at
405 MB RSS (45 MB empty) while the dataset was 24 KB. The cron trims the
heap after large frees (rcp11/server/trim.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from itertools import islice, repeat
from pathlib import Path
from typing import Any

import hiredis
import pytest
from conftest import wait_for

from rcp11.resp import encode_command


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["DEL", "FLUSHALL"])
def test_rss_falls_back_after_every_key_is_deleted(server_factory, how: str) -> None:
    server = server_factory(save="")
    r = server.client()
    empty = rss_mb(server.proc.pid)
    messages = [b"x" * (200 + i % 300) for i in range(100)]
    keys = [f"k{n}" for n in range(120)]
    for key in keys:
        pipe = r.pipeline(transaction=False)
        for _ in range(40):
            pipe.execute_command("TWRITE", key, "ENTRIES", *messages)
        pipe.execute()
    full = rss_mb(server.proc.pid)
    assert full - empty > 100, (empty, full)  # the data really took memory
    if how == "DEL":
        for start in range(0, len(keys), 10):
            r.delete(*keys[start : start + 10])
    else:
        r.flushall()
    assert r.info("memory")["used_memory_dataset"] == 0
    bound = empty + 0.25 * (full - empty)
    # The cron trims within a tick or two of the frees (hz 10).
    wait_for(lambda: rss_mb(server.proc.pid) < bound, timeout=20)


def minor_faults(pid: int) -> int:
    # /proc/PID/stat: after "pid (comm)", minflt is the 8th field.
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_pipelined_reads_reuse_reply_memory(server_factory) -> None:
    # 50 clients each pipelining 32 TREADs of 100 messages: every batch is
    # answered with a ~340 KB buffer, many in flight at once. glibc gave
    # such buffers fresh mmap()ed pages (or trimmed the heap's top under
    # them), 2.5 page faults and their zeroing in the kernel per TREAD. The
    # server keeps them on its heap (limits.MALLOC_MMAP_THRESHOLD), reused.
    server = server_factory(save="")
    server.client().execute_command("TWRITE", "rs", "ENTRIES", *[b"x" * 100] * 1000)
    request = encode_command([b"TREAD", b"rs", b"0", b"100"])
    with socket.create_connection(("127.0.0.1", server.port)) as probe:
        probe.sendall(request)
        reply_size = len(read_exactly_one_reply(probe))
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    try:

        def burst() -> None:
            for sock in socks:
                sock.sendall(request * 32)
            for sock in socks:
                want = reply_size * 32
                while want:
                    chunk = sock.recv(min(want, 1 << 20))
                    assert chunk, "connection closed"
                    want -= len(chunk)

        burst()  # warm: the heap grows to what the bursts need once
        before = minor_faults(server.proc.pid)
        for _ in range(5):
            burst()
        reads = 5 * len(socks) * 32
        # Without the setting: 2.6 faults per read here; with it about 0.5
        # (buffers malloc does not hand out).
        assert (minor_faults(server.proc.pid) - before) / reads < 1.2
    finally:
        for sock in socks:
            sock.close()


def read_exactly_one_reply(sock: socket.socket) -> bytes:
    """One RESP reply to TREAD (an array of bulk strings), whole."""
    data = b""
    while True:
        data += sock.recv(65536)
        reader = hiredis.Reader()
        reader.feed(data)
        if reader.gets() is not False:
            return data


def pipelined(r, commands: Iterable[tuple[Any, ...]], chunk: int = 500) -> None:
    """Send commands in pipelines of chunk."""
    commands = iter(commands)
    while batch := list(islice(commands, chunk)):
        pipe = r.pipeline(transaction=False)
        for command in batch:
            pipe.execute_command(*command)
        pipe.execute()


def fill(r, key: str, requests: int) -> None:
    """requests x TWRITE key ENTRIES <100 x 100 B>."""
    pipelined(r, repeat(("TWRITE", key, "ENTRIES", *[b"m" * 100] * 100), requests))


@pytest.mark.slow
def test_memory_freed_and_soon_needed_again_is_reused(server_factory) -> None:
    # A stream deleted and written anew (staging streams, a FLUSHALL before
    # a reload): giving the freed pages back at once made every page of the
    # new data come back through a page fault, ~12% of the server's CPU per
    # write of 100 messages. The cron gives back only what stayed unused
    # (limits.TRIM_DECAY_SECONDS), so the second fill reuses the first's.
    server = server_factory(save="")
    r = server.client()
    pid = server.proc.pid
    before = minor_faults(pid)
    fill(r, "s", 10_000)  # 100 MB
    first = minor_faults(pid) - before
    assert first > 15_000, first  # the first fill really faulted its pages in
    r.delete("s")
    before = minor_faults(pid)
    fill(r, "s", 10_000)
    again = minor_faults(pid) - before
    assert again < first / 5, (first, again)
    # ... and once nothing needs it, it still goes back.
    full = rss_mb(pid)
    r.delete("s")
    wait_for(lambda: rss_mb(pid) < full - 60, timeout=30)


@pytest.mark.slow
def test_memory_of_a_vanished_clients_request_goes_back(server_factory) -> None:
    # A half-sent request is not data: used_memory never counted it, and
    # glibc no longer trims the heap's top by itself. What the process holds
    # beyond used_memory is what the cron gives back.
    server = server_factory(save="")
    pid = server.proc.pid
    r = server.client()
    empty = rss_mb(pid)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"*3\r\n$6\r\nTWRITE\r\n$3\r\nbig\r\n$%d\r\n" % (400 << 20))
        chunk = b"x" * (1 << 20)
        for _ in range(300):
            sock.sendall(chunk)
        wait_for(lambda: rss_mb(pid) > empty + 250, timeout=30)
    wait_for(lambda: r.info("clients")["connected_clients"] == 1, timeout=10)
    wait_for(lambda: rss_mb(pid) < empty + 60, timeout=30)


def small_streams(r, first: int, count: int, payload: bytes) -> None:
    """One stream k<i> of one message each, i from first."""
    keys = range(first, first + count)
    pipelined(r, (("TWRITE", f"k{i}", "ENTRIES", payload) for i in keys), 5000)


@pytest.mark.slow
def test_used_memory_stays_true_when_freed_pages_go_back(server_factory) -> None:
    # malloc_trim() gives back free pages inside the heap without shrinking
    # it: counting the heap by its size, used_memory lost the memory outside
    # it (Python's objects for every key) once such pages went back, and
    # maxmemory let that much more in (216 MB shown as 124 MB, no data
    # changed).
    server = server_factory(save="")
    r = server.client()
    pid = server.proc.pid
    small_streams(r, 0, 60_000, b"x")
    fill(r, "big", 10_000)  # 100 MB between the keys' memory ...
    small_streams(r, 60_000, 5_000, b"x" * 600)  # ... and the heap's top
    r.delete("big")
    used = r.info("memory")["used_memory"]
    held = rss_mb(pid)
    wait_for(lambda: rss_mb(pid) < held - 60, timeout=30)  # given back
    assert r.info("memory")["used_memory"] > 0.95 * used
