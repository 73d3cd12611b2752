"""Raw-socket load generators, one process per connection.

A `Job` is a list of pre-encoded request buffers plus a way to count the
replies. Workers are forked after the parent has encoded everything, wait
on a barrier so all connections start together, then push requests with a
bounded number of commands in flight (a sliding pipeline window) while
skimming replies with the counters of `bench.resp`. Each worker reports its
wall-clock interval and its own CPU time, so every figure can say how busy
the generator was: a generator near 100% of a core would be the bottleneck.
"""

from __future__ import annotations

import multiprocessing as mp
import select
import socket
import time
from dataclasses import dataclass, field

from bench.resp import (
    BulkArrayCounter,
    LineCounter,
    ParsedReplyCounter,
    ReplyError,
    encode_command,
)

# Big enough that one recv drains a whole TREAD reply of 1000 x 100 B.
RECV_SIZE = 1 << 20


@dataclass
class Job:
    """What one connection sends and how its replies are counted.

    chunks: (buffer, commands in buffer); identical chunks may be the same
    object, repeated. reply: ("lines", lines per reply) for integer/bulk
    replies, ("array", element size) for arrays of fixed-size bulks,
    ("parsed", 0) for replies of any shape (parsed: costs the generator more).
    entries: messages this job moves (written or expected to be read).
    mode "pipeline" sends ahead up to `window` commands; mode "follow" is a
    consumer that sends `TREAD key off count BLOCK 0` one at a time and
    advances `off` by what each reply held, until it has read `entries`.
    """

    port: int
    chunks: list[tuple[bytes, int]] = field(default_factory=list)
    reply: tuple[str, int] = ("lines", 1)
    entries: int = 0
    window: int = 32
    mode: str = "pipeline"
    follow_key: bytes = b""
    follow_start: int = 0
    follow_count: int = 1000


@dataclass
class RunResult:
    """Aggregate of all jobs run together."""

    wall: float  # first start to last end, seconds
    entries: int
    replies: int
    loadgen_cpu: float  # CPU seconds summed over the worker processes
    errors: list[str]

    @property
    def rate(self) -> float:
        return self.entries / self.wall if self.wall > 0 else 0.0

    @property
    def loadgen_cpu_pct(self) -> float:
        """Generator CPU as a percentage of one core over the run."""
        return 100.0 * self.loadgen_cpu / self.wall if self.wall > 0 else 0.0


def chunked(command: bytes, count: int, per_chunk: int) -> list[tuple[bytes, int]]:
    """`count` copies of one command, grouped `per_chunk` per send buffer."""
    full = command * per_chunk
    chunks = [(full, per_chunk)] * (count // per_chunk)
    if count % per_chunk:
        chunks.append((command * (count % per_chunk), count % per_chunk))
    return chunks


def group(commands: list[bytes], per_chunk: int) -> list[tuple[bytes, int]]:
    """Distinct commands joined `per_chunk` per send buffer."""
    return [
        (b"".join(commands[i : i + per_chunk]), len(commands[i : i + per_chunk]))
        for i in range(0, len(commands), per_chunk)
    ]


def _counter(reply: tuple[str, int]) -> LineCounter | BulkArrayCounter | ParsedReplyCounter:
    kind, arg = reply
    if kind == "parsed":
        return ParsedReplyCounter()
    return LineCounter(arg) if kind == "lines" else BulkArrayCounter(arg)


def _run_pipeline(sock: socket.socket, job: Job) -> tuple[int, int]:
    counter = _counter(job.reply)
    total = sum(n for _, n in job.chunks)
    sock.setblocking(False)
    queued = 0  # commands whose bytes are fully handed to the kernel
    done = 0
    index = 0
    view: memoryview | None = None
    sent_in_chunk = 0
    while done < total:
        want_write = index < len(job.chunks) and (
            view is not None or queued - done + job.chunks[index][1] <= job.window
        )
        readable, writable, _ = select.select([sock], [sock] if want_write else [], [], 60)
        if not readable and not writable:
            raise TimeoutError(f"no reply for 60 s ({done}/{total} replies)")
        if writable:
            if view is None:
                view = memoryview(job.chunks[index][0])
                sent_in_chunk = 0
            sent_in_chunk += sock.send(view[sent_in_chunk:])
            if sent_in_chunk == len(view):
                queued += job.chunks[index][1]
                index += 1
                view = None
        if readable:
            data = sock.recv(RECV_SIZE)
            if not data:
                raise ConnectionError(f"server closed the connection after {done} replies")
            done += counter.feed(data)
    counts_entries = isinstance(counter, BulkArrayCounter | ParsedReplyCounter)
    entries = counter.entries if counts_entries else job.entries
    return done, entries


def _run_follow(sock: socket.socket, job: Job) -> tuple[int, int]:
    counter = _counter(job.reply)
    assert isinstance(counter, BulkArrayCounter)
    offset = job.follow_start
    replies = 0
    while counter.entries < job.entries:
        sock.sendall(encode_command(b"TREAD", job.follow_key, offset, job.follow_count, "BLOCK", 0))
        while True:
            data = sock.recv(RECV_SIZE)
            if not data:
                raise ConnectionError("server closed the connection")
            if counter.feed(data):
                break
        replies += 1
        offset += counter.last_count
    return replies, counter.entries


def _worker(job: Job, barrier: mp.synchronize.Barrier, results: mp.Queue) -> None:
    outcome: dict[str, object] = {"error": None, "start": 0.0, "end": 0.0, "cpu": 0.0}
    try:
        sock = socket.create_connection(("127.0.0.1", job.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        barrier.wait()
        outcome["error"] = f"connect: {exc}"
        results.put(outcome)
        return
    if job.mode == "follow":
        # A follower blocks with BLOCK 0; if its producer died it must not
        # wait forever.
        sock.settimeout(60)
    barrier.wait()
    cpu0 = time.process_time()
    start = time.perf_counter()
    try:
        replies, entries = (
            _run_follow(sock, job) if job.mode == "follow" else _run_pipeline(sock, job)
        )
        outcome.update(replies=replies, entries=entries)
    except (OSError, ReplyError, TimeoutError, ValueError) as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
        outcome.update(replies=0, entries=0)
    outcome["end"] = time.perf_counter()
    outcome["start"] = start
    outcome["cpu"] = time.process_time() - cpu0
    sock.close()
    results.put(outcome)


def run_jobs(jobs: list[Job], timeout: float = 900.0) -> RunResult:
    """Run all jobs at once, one forked process each; wait for all."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(jobs) + 1)
    results: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(job, barrier, results), daemon=True) for job in jobs]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout=60)
        outcomes = [results.get(timeout=timeout) for _ in jobs]
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [str(o["error"]) for o in outcomes if o["error"]]
    good = [o for o in outcomes if not o["error"]]
    wall = (max(o["end"] for o in good) - min(o["start"] for o in good)) if good else 0.0
    return RunResult(
        wall=wall,
        entries=sum(int(o.get("entries", 0)) for o in outcomes),
        replies=sum(int(o.get("replies", 0)) for o in outcomes),
        loadgen_cpu=sum(float(o["cpu"]) for o in outcomes),
        errors=errors,
    )
