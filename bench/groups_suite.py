"""Suite: consumer groups, plain and acknowledged (issue 21).

Eight consumers (eight connections, one forked process each) drain one
stream of 100-byte messages as one group, reading batches of 100 until the
group has nothing left. Three ways, on the same data:

- **plain GROUP**: `TREAD s 0 100 GROUP g` (the read is its own
  acknowledgement: at most once);
- **acknowledged**: `TREAD s 0 100 GROUP g LEASE 60000 CONSUMER c<i> ACK
  <start> <count>`, each read acknowledging the consumer's previous batch
  (at least once; one command per batch);
- **Redis streams**: `XREADGROUP GROUP g c<i> COUNT 100 STREAMS x >`, each
  batch acknowledged by `XACK x g <its 100 IDs>` sent in the same write as
  the next XREADGROUP (one round trip per batch, two commands).

Each consumer sends its next request when the reply to the last one is in
(the acknowledgement needs it). rcp11-server is compared with Debian's
redis-server; the Redis module with Redis's own streams inside the same
redis-server. Runs alternate between the ways, `rounds` times; figures are
medians. Messages/s counts messages consumed (and, where acknowledged,
acknowledged); per server CPU-s divides by the server's CPU share, which
other load on the shared machine moves less. After each acknowledged run
the group must hold nothing pending, or the run is an error.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import statistics
import time
from dataclasses import dataclass

import hiredis

from bench.common import Context, Log
from bench.module_bench import start_module_server
from bench.report import SuiteReport, Table, bound_note, num
from bench.resp import encode_command
from bench.servers import Server
from bench.workloads import payload

NAME = "groups"
TITLE = "Suite: consumer groups, plain and acknowledged"

CONSUMERS = 8
BATCH = 100
LEASE_MS = 60_000
GOAL_VS_PLAIN = 0.8
GOAL_VS_REDIS = 2.0


@dataclass
class Outcome:
    messages: int
    start: float
    end: float
    cpu: float
    error: str | None = None


def _reply(sock: socket.socket, reader: hiredis.Reader) -> object:
    while True:
        reply = reader.gets()
        if reply is not False:
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(str(reply))
            return reply
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("server closed the connection")
        reader.feed(data)


def _drain_plain(sock: socket.socket, reader: hiredis.Reader, i: int) -> int:
    request = encode_command("TREAD", "s", 0, BATCH, "GROUP", "g")
    total = 0
    while True:
        sock.sendall(request)
        got = len(_reply(sock, reader))  # type: ignore[arg-type]
        if not got:
            return total
        total += got


def _drain_acked(sock: socket.socket, reader: hiredis.Reader, i: int) -> int:
    head = ["TREAD", "s", 0, BATCH, "GROUP", "g", "LEASE", LEASE_MS, "CONSUMER", f"c{i}"]
    request = encode_command(*head)
    total = 0
    while True:
        sock.sendall(request)
        reply = _reply(sock, reader)
        start, count = reply[0][2], reply[0][3]  # type: ignore[index]
        if not count:
            return total  # the read that found nothing acknowledged the last batch
        total += count
        request = encode_command(*head, "ACK", start, count)


def _drain_redis(sock: socket.socket, reader: hiredis.Reader, i: int) -> int:
    read = encode_command("XREADGROUP", "GROUP", "g", f"c{i}", "COUNT", BATCH, "STREAMS", "x", ">")
    request = read
    acks = 0
    total = 0
    while True:
        sock.sendall(request)
        for _ in range(acks):
            _reply(sock, reader)  # the XACK's count
        reply = _reply(sock, reader)
        if not reply:
            return total
        ids = [entry[0] for entry in reply[0][1]]  # type: ignore[index]
        total += len(ids)
        request = encode_command("XACK", "x", "g", *ids) + read
        acks = 1


_DRAINS = {"plain": _drain_plain, "acked": _drain_acked, "redis": _drain_redis}


def _consumer(port: int, way: str, i: int, barrier: object, results: mp.Queue) -> None:
    outcome = Outcome(0, 0.0, 0.0, 0.0)
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(120)
        reader = hiredis.Reader()
        barrier.wait()  # type: ignore[attr-defined]
        cpu = time.process_time()
        outcome.start = time.perf_counter()
        outcome.messages = _DRAINS[way](sock, reader, i)
        outcome.end = time.perf_counter()
        outcome.cpu = time.process_time() - cpu
        sock.close()
    except Exception as exc:  # reported by the parent
        outcome.error = f"{type(exc).__name__}: {exc}"
    results.put(outcome)


@dataclass
class Run:
    rate: float  # messages/s
    server_cpu_pct: float
    generator_cpu_pct: float
    server_wait_pct: float = 0.0  # ready to run, waiting for a core

    @property
    def per_cpu_second(self) -> float:
        return self.rate * 100.0 / self.server_cpu_pct if self.server_cpu_pct else 0.0

    @property
    def batch_us(self) -> float:
        """Server CPU per batch of BATCH messages, in microseconds."""
        return BATCH * 1e6 / self.per_cpu_second if self.per_cpu_second else 0.0


def _drain(srv: Server, way: str) -> Run:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(CONSUMERS + 1)
    results: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_consumer, args=(srv.port, way, i, barrier, results), daemon=True)
        for i in range(CONSUMERS)
    ]
    for proc in procs:
        proc.start()
    busy, waited = srv.sched_seconds()
    barrier.wait(timeout=60)
    outcomes = [results.get(timeout=900) for _ in procs]
    busy_after, waited_after = srv.sched_seconds()
    for proc in procs:
        proc.join(timeout=5)
    errors = [o.error for o in outcomes if o.error]
    if errors:
        raise RuntimeError(f"{way}: {errors[0]}")
    wall = max(o.end for o in outcomes) - min(o.start for o in outcomes)
    messages = sum(o.messages for o in outcomes)
    return Run(
        messages / wall,
        100.0 * (busy_after - busy) / wall,
        100.0 * sum(o.cpu for o in outcomes) / wall,
        100.0 * (waited_after - waited) / wall,
    )


def _pipelined(srv: Server, commands: list[bytes]) -> None:
    """Send encoded commands on one connection and read every reply."""
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.sendall(b"".join(commands))
        reader = hiredis.Reader()
        for _ in commands:
            _reply(sock, reader)


def _fill(srv: Server, way: str, messages: int) -> None:
    """The stream the runs of `way` drain (written once: each run starts a
    fresh group at its beginning)."""
    p100 = payload(100)
    if way == "redis":
        for start in range(0, messages, 1000):
            n = min(1000, messages - start)
            _pipelined(srv, [encode_command("XADD", "x", "*", "f", p100)] * n)
    else:
        for start in range(0, messages, 1000):
            srv.call(b"TWRITE", b"s", b"ENTRIES", *[p100] * min(1000, messages - start))


def _new_group(srv: Server, way: str) -> None:
    if way == "redis":
        srv.call(b"XGROUP", b"DESTROY", b"x", b"g")
        srv.call(b"XGROUP", b"CREATE", b"x", b"g", b"0")
    else:
        srv.call(b"DEL", b"g")


def _check_drained(srv: Server, way: str, messages: int) -> None:
    if way == "acked":
        info = srv.call(b"TGROUP", b"INFO", b"s", b"g")
        fields = dict(zip(info[::2], info[1::2], strict=True))  # type: ignore[index]
        if fields[b"pending"] or fields[b"acknowledged"] != messages:
            raise RuntimeError(f"acknowledged run left {fields[b'pending']} pending")
    elif way == "redis":
        pending = srv.call(b"XPENDING", b"x", b"g")
        if pending[0]:  # type: ignore[index]
            raise RuntimeError(f"XREADGROUP run left {pending[0]} pending")  # type: ignore[index]


def run(ctx: Context) -> SuiteReport:
    report = SuiteReport(NAME, TITLE, intro=__doc__.split("\n\n", 1)[1])

    def log(message: str) -> None:
        ctx.log(NAME, message)

    messages = ctx.pick(2_000_000, 400_000, 4_000)
    rounds = ctx.pick(3, 2, 1)
    table = Table(
        f"{CONSUMERS} consumers draining {messages:,} messages of 100 B in batches of {BATCH}",
        [
            "server",
            "way",
            "messages/s",
            "per server CPU-s",
            "acknowledged / plain GROUP",
            "acknowledged / XREADGROUP+XACK",
            "CPU (gen / srv)",
        ],
    )
    table.notes.append(
        f"Median of {rounds} round(s); the ways alternate within a round. Ratios are of "
        "messages/s, with the ratio per server CPU-s in brackets. Goals: acknowledged >= "
        f"{GOAL_VS_PLAIN}x plain GROUP and >= {GOAL_VS_REDIS}x XREADGROUP+XACK."
    )
    report.tables.append(table)
    setups = (
        ("rcp11-server", "rcp11-server vs redis-server"),
        ("module", "the module vs Redis streams, one redis-server"),
    )
    for which, what in setups:
        try:
            _setup(ctx, report, table, log, which, what, messages, rounds)
        except Exception as exc:  # the page must still be written
            report.errors.append(f"{what}: {type(exc).__name__}: {exc}")
            log(f"ERROR in {what}: {exc}")
    return report


def _setup(
    ctx: Context,
    report: SuiteReport,
    table: Table,
    log: Log,
    which: str,
    what: str,
    messages: int,
    rounds: int,
) -> None:
    if which == "module":
        ours = theirs = start_module_server(ctx)
    else:
        ours, theirs = ctx.pool.start("rcp11"), ctx.pool.start("redis")
    try:
        runs: dict[str, list[Run]] = {"plain": [], "acked": [], "redis": []}
        _fill(ours, "plain", messages)
        _fill(theirs, "redis", messages)
        for r in range(rounds):
            for way in runs:
                srv = theirs if way == "redis" else ours
                _new_group(srv, way)
                got = _drain(srv, way)
                _check_drained(srv, way, messages)
                runs[way].append(got)
                log(f"{which} round {r + 1} {way}: {num(got.rate)} messages/s")
        med = {way: _median(found) for way, found in runs.items()}
        labels = {
            "plain": "plain `GROUP`",
            "acked": "acknowledged (`LEASE`, `ACK` in the next read)",
            "redis": "`XREADGROUP` + `XACK` (Redis streams)",
        }
        redis_name = "redis-server" if which != "module" else "the same redis-server"
        names = {"plain": which, "acked": which, "redis": redis_name}
        vs_plain = med["acked"].rate / med["plain"].rate
        vs_redis = med["acked"].rate / med["redis"].rate
        cpu_plain = med["acked"].per_cpu_second / med["plain"].per_cpu_second
        cpu_redis = med["acked"].per_cpu_second / med["redis"].per_cpu_second
        for way, m in med.items():
            table.add(
                names[way],
                labels[way],
                num(m.rate),
                num(m.per_cpu_second),
                f"{vs_plain:.2f}x ({cpu_plain:.2f}x)" if way == "acked" else "",
                f"{vs_redis:.2f}x ({cpu_redis:.2f}x)" if way == "acked" else "",
                f"gen {m.generator_cpu_pct:.0f}% / srv {m.server_cpu_pct:.0f}%",
            )
        acked = med["acked"]
        per_batch = (
            f"server CPU {acked.batch_us:.1f} us per acknowledged batch of {BATCH} "
            f"(plain GROUP {med['plain'].batch_us:.1f}, XREADGROUP+XACK {med['redis'].batch_us:.1f})"
        )
        bound = bound_note(
            acked.server_cpu_pct, acked.generator_cpu_pct, acked.server_wait_pct, per_batch
        )
        report.goal(
            f"Groups ({what}): acknowledged / plain GROUP, 8 consumers, batches of 100",
            f"{vs_plain:.2f}x ({cpu_plain:.2f}x per server CPU)",
            f">= {GOAL_VS_PLAIN}x",
            vs_plain >= GOAL_VS_PLAIN,
            bound,
        )
        report.goal(
            f"Groups ({what}): acknowledged / XREADGROUP+XACK, 8 consumers, batches of 100",
            f"{vs_redis:.2f}x ({cpu_redis:.2f}x per server CPU)",
            f">= {GOAL_VS_REDIS}x",
            vs_redis >= GOAL_VS_REDIS,
            bound,
        )
        report.data[which] = {way: [vars(x) for x in found] for way, found in runs.items()}
    finally:
        for srv in {id(ours): ours, id(theirs): theirs}.values():
            ctx.pool.stop(srv)


def _median(found: list[Run]) -> Run:
    best = statistics.median_low([x.rate for x in found])
    return next(x for x in found if x.rate == best)
