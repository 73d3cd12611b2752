"""Suite 3: the figures of kafkaesque and voik (seeds/kafkaesque-README.txt,
seeds/voik-README.txt).

kafkaesque (Lua scripts on a default Redis, Early 2015 MacBook Pro)
published about 70,000 messages/s in batches of 100 messages of 4 KB. voik
(a Rust commit log, offline, no network) reports ~130 MB/s sequential write
and 3.7-4.2 GB/s read per segment. Here both workloads go over loopback to
one rcp11 server, with a Redis list fed by the same generator as reference.
"""

from __future__ import annotations

from bench.common import Context, Log, measure
from bench.report import SuiteReport, Table, num, ratio
from bench.servers import Server
from bench.workloads import batch_writer, check_written, range_reader

NAME = "kafkaesque"
TITLE = "Suite 3: kafkaesque and voik"

KAFKAESQUE_MPS = 70_000
VOIK_WRITE = 130e6
VOIK_READ = (3.7e9, 4.2e9)


def run(ctx: Context) -> SuiteReport:
    report = SuiteReport(NAME, TITLE, intro=__doc__.split("\n\n", 1)[1])

    def log(message: str) -> None:
        ctx.log(NAME, message)

    servers: dict[str, Server] = {}
    try:
        for kind in ("rcp11", "redis"):
            servers[kind] = ctx.pool.start(kind)
        _kafkaesque(ctx, servers, report, log)
        _bandwidth(ctx, servers, report, log)
    finally:
        for srv in servers.values():
            ctx.pool.stop(srv)
    return report


def _kafkaesque(ctx: Context, servers: dict[str, Server], report: SuiteReport, log: Log) -> None:
    messages = ctx.pick(150_000, 20_000, 1_000)
    table = Table(
        "Batches of 100 messages of 4 KB (kafkaesque's workload)",
        ["server", "workload", "messages/s", "MB/s", "vs kafkaesque (70,000/s)", "CPU (gen / srv)"],
    )
    table.notes.append(
        f"{num(messages)} messages of 4096 random bytes, one connection, 100 messages per "
        "command, pipelined (at least 16 commands in flight)."
    )
    report.tables.append(table)
    for kind, command, key in (("rcp11", b"TWRITE", b"kq"), ("redis", b"RPUSH", b"kq")):
        srv = servers[kind]
        try:
            log(f"{kind}: {num(messages)} x 4 KB in batches of 100 ({command.decode()})")
            m = measure(srv, [batch_writer(srv.port, key, messages, 100, 4096, command=command)])
            if kind == "rcp11":
                check_written(srv, key, messages)
            workload = f"`{command.decode()} kq {'ENTRIES ' if kind == 'rcp11' else ''}<100 x 4KB>`"
            table.add(
                kind,
                workload,
                num(m.rate),
                f"{m.rate * 4096 / 1e6:,.0f}",
                ratio(m.rate, KAFKAESQUE_MPS),
                m.cpu_note(),
            )
            report.data[f"kafkaesque_{kind}"] = m.rate
            log(f"  {num(m.rate)} messages/s ({m.cpu_note()})")
        except Exception as exc:  # the page must still be written
            report.errors.append(f"kafkaesque {kind}: {type(exc).__name__}: {exc}")
            log(f"ERROR: {exc}")
        finally:
            srv.call(b"DEL", key)


def _bandwidth(ctx: Context, servers: dict[str, Server], report: SuiteReport, log: Log) -> None:
    size = 4096
    batch = 256  # 1 MiB of payload per command
    total = ctx.pick(512 << 20, 128 << 20, 8 << 20)
    messages = total // size
    messages -= messages % batch
    table = Table(
        "Sequential bandwidth of one stream (voik's figures)",
        ["server", "direction", "workload", "GB/s", "voik per segment", "CPU (gen / srv)"],
    )
    table.notes.append(
        f"{messages * size / 1e9:.2f} GB as {num(messages)} messages of 4096 random bytes, "
        f"{batch} per command (1 MiB), one connection; the read goes over everything "
        "written, from the first offset. GB = 10^9 bytes of payload. "
        "voik's figures are without any network or protocol."
    )
    report.tables.append(table)
    for kind in ("rcp11", "redis"):
        srv = servers[kind]
        try:
            command = b"TWRITE" if kind == "rcp11" else b"RPUSH"
            log(f"{kind}: write {messages * size / 1e9:.2f} GB")
            w = measure(
                srv,
                [batch_writer(srv.port, b"bw", messages, batch, size, command=command, window=4)],
            )
            if kind == "rcp11":
                check_written(srv, b"bw", messages)
            log(f"  write {w.rate * size / 1e9:.2f} GB/s; reading back")
            style = "tread" if kind == "rcp11" else "lrange"
            r = measure(
                srv,
                [
                    range_reader(
                        srv.port, b"bw", 0, messages, size, count=batch, window=4, style=style
                    )
                ],
            )
            if r.run.entries != messages:
                raise RuntimeError(f"read {r.run.entries} messages, expected {messages}")
            write_cmd = (
                "TWRITE bw ENTRIES <256 x 4KB>" if kind == "rcp11" else "RPUSH bw <256 x 4KB>"
            )
            read_cmd = "TREAD bw <off> 256" if kind == "rcp11" else "LRANGE bw <off> <off+255>"
            table.add(
                kind,
                "write",
                f"`{write_cmd}`, 4 in flight",
                f"{w.rate * size / 1e9:.2f}",
                "0.13",
                w.cpu_note(),
            )
            table.add(
                kind,
                "read",
                f"`{read_cmd}`, 4 in flight",
                f"{r.rate * size / 1e9:.2f}",
                "3.7 (cold) - 4.2 (warm)",
                r.cpu_note(),
            )
            report.data[f"bandwidth_{kind}"] = {
                "write_gbs": w.rate * size / 1e9,
                "read_gbs": r.rate * size / 1e9,
            }
            log(f"  read {r.rate * size / 1e9:.2f} GB/s")
        except Exception as exc:  # the page must still be written
            report.errors.append(f"bandwidth {kind}: {type(exc).__name__}: {exc}")
            log(f"ERROR: {exc}")
        finally:
            srv.call(b"DEL", b"bw")
