"""Suite 4: cold-node compression through the server.

One rcp11 server per setting, each holding the same stream of realistic
JSON events (bench/json_events.py): `stream-compression no`, and
`stream-compression zlib` (level 6) with `stream-compression-depth` 0, 4
and 16 (the newest N sealed nodes of 1000 messages stay raw). A consumer
near the tail reads the newest nodes, which compression leaves raw: its
random `TREAD key <off> 100` should cost about what it costs on an
uncompressed stream. Reads are pipelined (32 in flight, one connection)
and run server after server, round after round (A B C D A B C D ...).
"""

from __future__ import annotations

import random
import statistics
import time

from bench.common import Context, Log, Measured, measure
from bench.json_events import events
from bench.loadgen import Job, group
from bench.report import SuiteReport, Table, bound_note, num
from bench.resp import encode_command
from bench.servers import Server
from bench.workloads import check_written

NAME = "zlib"
TITLE = "Suite 4: zlib-compressed streams through the server"

# (label, server directives); the first is the uncompressed reference.
SETTINGS = [
    ("off", {"stream_compression": "no"}),
    ("zlib 6, depth 0", {"stream_compression": "zlib", "stream_compression_depth": "0"}),
    ("zlib 6, depth 4", {"stream_compression": "zlib", "stream_compression_depth": "4"}),
    ("zlib 6, depth 16", {"stream_compression": "zlib", "stream_compression_depth": "16"}),
]
GOAL_SETTING = "zlib 6, depth 4"
# Time per random TREAD 100 near the tail, compressed / uncompressed.
GOAL_TAIL_RATIO = 1.2
NODE_ENTRIES = 1000  # the server's default stream-node-max-entries
# "Near the tail": within the newest this many messages, the 4 raw nodes
# that depth 4 keeps (the active node is newer still).
NEAR_TAIL = 4 * NODE_ENTRIES
READ_COUNT = 100
BATCH = 1000  # events per TWRITE ENTRIES while loading
WINDOW = 32  # TREADs in flight
KEY = b"logs"


def run(ctx: Context) -> SuiteReport:
    report = SuiteReport(NAME, TITLE, intro=__doc__.split("\n\n", 1)[1])

    def log(message: str) -> None:
        ctx.log(NAME, message)

    messages = ctx.pick(300_000, 60_000, 12_000)
    reads = ctx.pick(10_000, 3_000, 1_000)
    rounds = ctx.pick(3, 2, 1)
    log(f"generating {num(messages)} JSON events")
    lines = events(messages)
    servers: dict[str, Server] = {}
    try:
        for label, directives in SETTINGS:
            servers[label] = ctx.pool.start("rcp11", **directives)
        memory = _load(servers, lines, report, log)
        _reads(servers, messages, reads, rounds, memory, report, log)
    except Exception as exc:  # the page must still be written
        report.errors.append(f"zlib: {type(exc).__name__}: {exc}")
        log(f"ERROR: {exc}")
    finally:
        for srv in servers.values():
            ctx.pool.stop(srv)
    return report


def _info_streams(srv: Server) -> dict[str, int]:
    return {k: int(v) for k, v in srv.info("streams").items() if v.isdigit()}


def _wait_compressed(srv: Server, depth: int, timeout: float = 300.0) -> dict[str, int]:
    """INFO streams once every sealed node older than `depth` is compressed
    (the server may do it in the background, after the writes)."""
    deadline = time.monotonic() + timeout
    while True:
        info = _info_streams(srv)
        sealed = info["stream_nodes"] - 1  # the newest node is still open
        if info["stream_compressed_nodes"] >= sealed - depth or time.monotonic() > deadline:
            return info
        time.sleep(0.2)


def _load(
    servers: dict[str, Server], lines: list[bytes], report: SuiteReport, log: Log
) -> dict[str, dict[str, int]]:
    """The same events into every server; returns each one's INFO streams."""
    commands = [
        encode_command(b"TWRITE", KEY, b"ENTRIES", *lines[i : i + BATCH])
        for i in range(0, len(lines), BATCH)
    ]
    chunks = group(commands, 4)
    payload = sum(map(len, lines))
    memory: dict[str, dict[str, int]] = {}
    table = Table(
        f"What zlib saves on {num(len(lines))} JSON events "
        f"({payload / len(lines):.0f} bytes average)",
        [
            "setting",
            "compressed nodes",
            "core's memory bytes/message",
            "saving (uncompressed / this)",
            "load msgs/s",
            "CPU (gen / srv)",
        ],
    )
    table.notes.append(
        f"`TWRITE {KEY.decode()} ENTRIES <{BATCH} events>`, pipelined, one connection; memory "
        "is INFO streams' `stream_memory_bytes` once every node older than the depth is "
        "compressed (offset and time tables and the raw nodes included)."
    )
    report.tables.append(table)
    for (label, directives), srv in zip(SETTINGS, servers.values(), strict=True):
        log(f"loading {label}")
        job = Job(srv.port, chunks, ("lines", 1), entries=len(lines), window=16)
        m = measure(srv, [job])
        check_written(srv, KEY, len(lines))
        depth = int(directives.get("stream_compression_depth", 0))
        info = (
            _wait_compressed(srv, depth)
            if directives["stream_compression"] == "zlib"
            else _info_streams(srv)
        )
        memory[label] = info
        base = memory["off"]["stream_memory_bytes"]
        table.add(
            label,
            f"{info['stream_compressed_nodes']}/{info['stream_nodes']}",
            f"{info['stream_memory_bytes'] / len(lines):.1f}",
            f"{base / info['stream_memory_bytes']:.2f}x",
            num(m.rate),
            m.cpu_note(),
        )
        report.data[f"memory_{label}"] = info["stream_memory_bytes"]
    return memory


def _read_job(port: int, offsets: list[int]) -> Job:
    commands = [encode_command(b"TREAD", KEY, off, READ_COUNT) for off in offsets]
    return Job(
        port, group(commands, 4), ("parsed", 0), entries=len(offsets) * READ_COUNT, window=WINDOW
    )


def _reads(
    servers: dict[str, Server],
    messages: int,
    reads: int,
    rounds: int,
    memory: dict[str, dict[str, int]],
    report: SuiteReport,
    log: Log,
) -> None:
    rng = random.Random(5)
    where = {
        f"near the tail (newest {num(NEAR_TAIL)})": [
            rng.randrange(messages - NEAR_TAIL, messages - READ_COUNT) for _ in range(reads)
        ],
        "anywhere": [rng.randrange(messages - READ_COUNT) for _ in range(reads)],
    }
    table = Table(
        f"Random `TREAD {KEY.decode()} <off> {READ_COUNT}` on compressed streams",
        [
            "setting",
            "offsets",
            "server CPU us/TREAD",
            "ratio to uncompressed",
            "wall us/TREAD",
            "ratio to uncompressed",
            "goal",
            "verdict",
            "CPU (gen / srv)",
        ],
    )
    table.notes.append(
        f"{num(reads)} random offsets per case, {WINDOW} TREADs in flight on one connection, "
        f"{rounds} round(s), servers interleaved; medians over the rounds. Server CPU per "
        "TREAD is the server's CPU time over the run / TREADs (what one read costs the "
        "server, whatever else runs); wall per TREAD is the run's time / TREADs, which also "
        "holds the generator's parsing of the replies. The goal compares server CPU per "
        f"TREAD near the tail, {GOAL_SETTING} against off. A compressed node is zlib chunks; "
        "a read inflates the chunks it touches."
    )
    report.tables.append(table)
    for srv in servers.values():  # untimed: the first reads after loading pay extra
        measure(srv, [_read_job(srv.port, next(iter(where.values()))[: max(1, reads // 10)])])
    for place, offsets in where.items():
        runs: dict[str, list[Measured]] = {label: [] for label in servers}
        for r in range(rounds):
            for label, srv in servers.items():
                log(f"reads {place}, round {r + 1}/{rounds}: {label}")
                runs[label].append(measure(srv, [_read_job(srv.port, offsets)]))
        cpu_us = {
            label: statistics.median(_cpu_us(m, reads) for m in ms) for label, ms in runs.items()
        }
        wall_us = {
            label: statistics.median(m.run.wall / reads * 1e6 for m in ms)
            for label, ms in runs.items()
        }
        for label, ms in runs.items():
            cpu_ratio = cpu_us[label] / cpu_us["off"]
            wall_ratio = wall_us[label] / wall_us["off"]
            is_goal = label == GOAL_SETTING and place.startswith("near")
            middle = ms[len(ms) // 2]
            verdict_cell = "-"
            if is_goal:
                verdict_cell = report.goal(
                    f"zlib: random `TREAD {READ_COUNT}` near the tail, {label} / uncompressed "
                    "(server CPU per TREAD)",
                    f"{cpu_ratio:.2f}x ({cpu_us[label]:.1f} vs {cpu_us['off']:.1f} us; "
                    f"wall {wall_ratio:.2f}x)",
                    f"<= {GOAL_TAIL_RATIO}x",
                    cpu_ratio <= GOAL_TAIL_RATIO,
                    bound_note(
                        middle.server_cpu_pct,
                        middle.run.loadgen_cpu_pct,
                        middle.server_wait_pct,
                        f"{memory[label]['stream_compressed_nodes']}/"
                        f"{memory[label]['stream_nodes']} nodes compressed, reads within "
                        f"the newest {num(NEAR_TAIL)} messages",
                    ),
                )
            table.add(
                label,
                place,
                f"{cpu_us[label]:.1f}",
                f"{cpu_ratio:.2f}x",
                f"{wall_us[label]:.1f}",
                f"{wall_ratio:.2f}x",
                f"<= {GOAL_TAIL_RATIO}x" if is_goal else "-",
                verdict_cell,
                middle.cpu_note(),
            )
            report.data[f"tread_{label}_{place.split()[0]}"] = {
                "server_us": cpu_us[label],
                "wall_us": wall_us[label],
                "rounds_server_us": [_cpu_us(m, reads) for m in ms],
            }


def _cpu_us(m: Measured, reads: int) -> float:
    """Server CPU microseconds per TREAD of one run."""
    return m.server_cpu_pct / 100 * m.run.wall / reads * 1e6
