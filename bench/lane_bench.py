"""The C lane (src/lane.c) against the general path, in-process.

    python -m bench.lane_bench [--quick | --smoke]

The server's CPU per request of issue 11's workloads, measured in this
process without sockets (process CPU time, so it holds on a busy machine
where side-by-side throughput against redis-server swings): one read of P
requests runs either as the connection runs it (the lane,
commands.run_lane, then the parser and run_pipeline() for whatever the
lane left) or through the parser and run_pipeline() alone (the general
path). "lane ran" is the share of the requests the lane ran itself. What
is left per request in the server is the event loop, the socket calls and
the flush, which this does not include. `TREAD ... BLOCK 0` reads where
there is data: they answer at once, so the lane runs them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from rcp11.commands import execute, run_lane, run_pipeline
from rcp11.config import Config
from rcp11.resp import RequestParser, encode_command
from rcp11.state import ClientState, ServerState

TITLE = "The C lane: server CPU per request, lane vs general path (in-process)"
PAYLOAD = b"x" * 100
# Requests measured per case and mode.
REQUESTS = {"full": 100_000, "quick": 20_000, "smoke": 1_000}
# Reads between evictions of what was written (outside the timing).
EVICT_EVERY = 64

WORKLOADS = [
    ("`TWRITE s <100B>`", [b"TWRITE", b"s", PAYLOAD]),
    ("`TWRITE b ENTRIES <100 x 100B>`", [b"TWRITE", b"b", b"ENTRIES", *[PAYLOAD] * 100]),
    ("`TREAD rs 0 100`", [b"TREAD", b"rs", b"0", b"100"]),
    ("`TREAD rs 0 100 BLOCK 0` (data there)", [b"TREAD", b"rs", b"0", b"100", b"BLOCK", b"0"]),
]


def _fresh() -> tuple[ServerState, ClientState]:
    state = ServerState(Config())
    client = ClientState(authenticated=True)
    for key in (b"s", b"b", b"rs"):
        execute(state, client, [b"TWRITE", key, b"ENTRIES", *[PAYLOAD] * 100])
    return state, client


def _per_request(data: bytes, pipeline: int, requests: int, lane: bool) -> tuple[float, float]:
    """(CPU microseconds per request, share of the bytes the lane ran) of
    reads of `pipeline` requests."""
    state, client = _fresh()
    parser = RequestParser()
    out: list[bytes] = []
    mark = 1 << 40
    ran = [0]

    def general(rest: bytes = data) -> None:
        commands = parser.take(rest)
        while commands:  # a read over PARSE_SPAN comes out in parts
            run_pipeline(state, client, commands, 0, out, 0, mark)
            commands = parser.drain()

    def through_lane() -> None:
        consumed, _ = run_lane(state, client, parser, data, out, 0, mark)
        ran[0] += consumed
        if consumed != len(data):  # as the connection: the rest goes to the parser
            general(data[consumed:])

    step: Callable[[], None] = through_lane if lane else general
    reads = max(requests // pipeline, 1)
    streams = [state.keyspace.data[key] for key in (b"s", b"b")]
    spent = 0.0
    done = 0
    while done < reads:
        chunk = min(EVICT_EVERY, reads - done)
        started = time.process_time()
        for _ in range(chunk):
            out.clear()
            step()
        spent += time.process_time() - started
        done += chunk
        for stream in streams:  # untimed: memory stays small
            stream.evict_keep(0)
    return spent / (reads * pipeline) * 1e6, ran[0] / (reads * len(data))


def run(mode: str = "full") -> str:
    """The report as markdown (the entry point `python -m bench` calls)."""
    requests = REQUESTS[mode]
    lines = [
        f"## {TITLE}",
        "",
        __doc__.split("\n\n", 2)[2].strip(),
        "",
        "| workload | -P | general path, CPU us/request | lane, CPU us/request | speed-up "
        "| lane ran |",
        "|---|---|---|---|---|---|",
    ]
    for label, argv in WORKLOADS:
        for pipeline in (1, 32):
            data = encode_command(argv) * pipeline
            general, _ = _per_request(data, pipeline, requests, lane=False)
            lane, share = _per_request(data, pipeline, requests, lane=True)
            lines.append(
                f"| {label} | {pipeline} | {general:.2f} | {lane:.2f} | {general / lane:.1f}x "
                f"| {share:.0%} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lane_bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer requests")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    args = parser.parse_args(argv)
    print(run("quick" if args.quick else "smoke" if args.smoke else "full"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
