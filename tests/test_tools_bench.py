"""The benchmark harness: reply counting, and a tiny end-to-end run.

No timing assertions: the smoke run only proves that every suite starts its
servers, drives them, and writes its tables, plots and JSON record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require

from bench.resp import (
    BulkArrayCounter,
    LineCounter,
    ReplyError,
    bulk_element_size,
    encode_batch_write,
    encode_command,
)


def _tread_reply(messages: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(messages) + b"".join(b"$%d\r\n%s\r\n" % (len(m), m) for m in messages)


def _feed_in_pieces(counter: BulkArrayCounter | LineCounter, data: bytes, step: int) -> int:
    return sum(counter.feed(data[i : i + step]) for i in range(0, len(data), step))


@pytest.mark.parametrize("step", [1, 2, 7, 108, 1 << 20])
def test_array_counter_counts_replies_and_entries_however_split(step: int) -> None:
    size = 100
    stream = (
        _tread_reply([b"a" * size] * 3)
        + b"*0\r\n"
        + _tread_reply([b"\r\n*$-" * 20] * 1000)  # payload bytes that look like RESP
        + b"*-1\r\n"
    )
    counter = BulkArrayCounter(bulk_element_size(size))
    assert _feed_in_pieces(counter, stream, step) == 4
    assert counter.entries == 1003
    assert counter.null_arrays == 1


def test_array_counter_reports_server_errors() -> None:
    counter = BulkArrayCounter(bulk_element_size(100))
    with pytest.raises(ReplyError, match="WRONGTYPE"):
        counter.feed(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n")


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_line_counter_counts_integer_and_bulk_replies(step: int) -> None:
    assert _feed_in_pieces(LineCounter(1), b":0\r\n:500\r\n:1000\r\n", step) == 3
    xadd_ids = b"$15\r\n1700000000000-0\r\n$15\r\n1700000000000-1\r\n"
    assert _feed_in_pieces(LineCounter(2), xadd_ids, step) == 2


def test_line_counter_reports_server_errors() -> None:
    with pytest.raises(ReplyError, match="ERR syntax error"):
        LineCounter(1).feed(b":5\r\n-ERR syntax error\r\n")


def test_batch_write_encoding_is_a_valid_command() -> None:
    import hiredis

    # A server parses requests with the same reader as replies' arrays.
    encoded = encode_batch_write(b"TWRITE", b"k", b"xy", 3)
    reader = hiredis.Reader()
    reader.feed(encoded)
    assert reader.gets() == [b"TWRITE", b"k", b"ENTRIES", b"xy", b"xy", b"xy"]
    reader.feed(encode_batch_write(b"RPUSH", b"l", b"z", 2) + encode_command("TREAD", b"k", 5, 10))
    assert reader.gets() == [b"RPUSH", b"l", b"z", b"z"]
    assert reader.gets() == [b"TREAD", b"k", b"5", b"10"]


def _bench(*args: str, timeout: float = 170) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_every_suite() -> None:
    result = _bench("--help")
    assert result.returncode == 0
    for suite in ("kafka", "redis", "kafkaesque", "core", "persistence"):
        assert suite in result.stdout


def test_unknown_suite_is_refused_by_name() -> None:
    result = _bench("--smoke", "--suite", "kafka,nosuch")
    assert result.returncode == 2
    assert "unknown suite(s) nosuch" in result.stderr


@pytest.mark.timeout(900)  # its child process's own timeout fires first
@pytest.mark.slow
def test_smoke_run_writes_every_table_plot_and_record(tmp_path: Path) -> None:
    require("redis-server")
    require("redis-benchmark")
    page = tmp_path / "page.md"
    # Every suite at smoke size: about 2 minutes alone, more on a busy machine.
    result = _bench("--smoke", "--out", str(page), timeout=600)
    detail = f"stdout:\n{result.stdout}\nstderr (tail):\n{result.stderr[-4000:]}"
    assert page.exists(), detail
    text = page.read_text()
    record = json.loads(page.with_suffix(".json").read_text())
    errors = {name: suite["errors"] for name, suite in record["suites"].items() if suite["errors"]}
    assert not errors, f"{errors}\n{detail}"
    assert result.returncode == 0, detail
    for heading in (
        "## Goals at a glance",
        "## Suite 1: the Kafka benchmark",
        "### Throughput, 100-byte messages",
        "### End-to-end latency, producer -> blocked consumer",
        "### Message size: one producer",
        "### Throughput versus data already stored",
        "## Suite 2: rcp11 versus Redis",
        "### Throughput, same load generator (redis-benchmark, 50 clients)",
        "### Wake-up latency of a blocked reader",
        "## Suite 3: kafkaesque and voik",
        "### Sequential bandwidth of one stream (voik's figures)",
        "## Suite 4: zlib-compressed streams through the server",
        "### Random `TREAD logs <off> 100` on compressed streams",
        "## Suite: consumer groups, plain and acknowledged",
        "core_bench.py",
        "persistence_bench.py",
        "lane_bench.py",
        "Retention and the time index",
    ):
        assert heading in text, heading
    # Issue 11's goals table: every row in the summary, with its target and the
    # server's CPU (the last column).
    glance = text.split("## Goals at a glance", 1)[1].split("\n## ", 1)[0]
    for goal, target in (
        ("`TWRITE s <100B>` vs `XADD s * f <100B>`, -P 1 |", ">= 1.0x"),
        ("`TWRITE s <100B>` vs `XADD s * f <100B>`, -P 32 |", ">= 1.3x"),
        ("`TWRITE b ENTRIES <100 x 100B>` vs `RPUSH l <100 x 100B>`, -P 1 |", ">= 2.0x"),
        ("`TREAD rs 0 100` vs `XRANGE xs - + COUNT 100`, -P 1 |", ">= 4.0x"),
        ("`TREAD rs 0 100` vs `XRANGE xs - + COUNT 100`, -P 32 |", ">= 6.0x"),
        ("`TREAD rs 0 100` vs `LRANGE rl 0 99`, -P 1 |", ">= 1.5x"),
        ("`TREAD rs 0 100` vs `LRANGE rl 0 99`, -P 32 |", ">= 1.5x"),
        ("Kafka suite: 1 producer, 100 B |", ">= 3,000,000"),
        ("Kafka suite: 1 consumer, 100 B |", ">= 10,000,000"),
        (
            "RSS growth per 100 B entry / the core's own accounting "
            "(`TWRITE m ENTRIES <100 x 100B>`, pipelined) |",
            "<= 1.02x",
        ),
        (
            "RSS growth per 100 B entry with append times / a Redis stream's "
            "(`TWRITE m <100B>`, pipelined) |",
            "<= 0.95x",
        ),
        ("near the tail, zlib 6, depth 4 / uncompressed", "<= 1.2x"),
        ("Groups (rcp11-server vs redis-server): acknowledged / plain GROUP", ">= 0.8x"),
        ("Groups (rcp11-server vs redis-server): acknowledged / XREADGROUP+XACK", ">= 2.0x"),
        ("one redis-server): acknowledged / plain GROUP", ">= 0.8x"),
        ("one redis-server): acknowledged / XREADGROUP+XACK", ">= 2.0x"),
    ):
        row = next((line for line in glance.splitlines() if goal in line), None)
        assert row is not None, f"no goal row {goal!r} in:\n{glance}"
        assert f"| {target} |" in row, row
        if "RSS" not in goal:
            assert "% of a core" in row and "generator" in row, row
    # No temporary path of the run (a suite's --out, a server's directory).
    assert "/tmp" not in text and str(tmp_path) not in text
    # Every measured row carries a number, and every plot the page links exists.
    assert "| 1 producer |" in text and "| 1 consumer |" in text
    for name in ("kafka_message_size.png", "kafka_stored_curve.png"):
        png = tmp_path / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{name}" in text
    kafka = record["suites"]["kafka"]["data"]
    assert kafka["producer_rps"] > 0 and kafka["consumer_rps"] > 0
    redis_data = record["suites"]["redis"]["data"]
    assert redis_data["write_p1"]["rcp11"] > 0 and redis_data["write_p1"]["redis"] > 0


def _fake_suite(monkeypatch: pytest.MonkeyPatch, source: str) -> object:
    """Install `source` as the module behind the 'core' suite name."""
    import types

    from bench import __main__ as bench_main

    module = types.ModuleType("fake_suite_module")
    exec(compile(source, "fake_suite_module.py", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "fake_suite_module", module)
    monkeypatch.setitem(bench_main.EXTERNAL_SUITES, "core", ("fake_suite_module", "Fake"))
    monkeypatch.setattr(bench_main.inspect, "getsource", lambda _m: source)
    return bench_main


def _context(tmp_path: Path, mode: str) -> object:
    from bench.common import Context
    from bench.servers import ServerPool

    pool = ServerPool()
    pool.root.rmdir()  # its own fresh temp dir; this test's tmp_path replaces it
    pool.root = tmp_path
    return Context(mode, pool, tmp_path / "plots")


def test_external_run_suite_gets_its_mode_and_keeps_its_title(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = "def run(mode):\n    return f'## Core things\\n\\n### Table\\n\\nmode={mode}\\n'\n"
    bench_main = _fake_suite(monkeypatch, source)
    report = bench_main.run_external("core", _context(tmp_path, "quick"))
    assert report.title == "Core things (fake_suite_module.py)"
    page = report.markdown(tmp_path)
    assert page.count("## Core things") == 1
    assert "mode=quick" in page


def test_external_cli_suite_gets_flags_and_its_out_file_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = (
        "import argparse\n"
        "def main(argv):\n"
        "    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--quick', action='store_true')\n"
        "    p.add_argument('--size-gb', type=float, default=2.0)\n"
        "    p.add_argument('--out')\n"
        "    a = p.parse_args(argv)\n"
        "    print('progress line, not part of the page')\n"
        "    open(a.out, 'w').write(f'# Disk things\\n\\n## Table\\n\\nquick={a.quick} gb={a.size_gb}\\n')\n"
        "    return 0\n"
    )
    bench_main = _fake_suite(monkeypatch, source)
    report = bench_main.run_external("core", _context(tmp_path, "smoke"))
    page = report.markdown(tmp_path)
    # --smoke is unknown to it: it gets --quick and its own size option scaled down.
    assert "quick=True gb=0.01" in page
    assert "progress line" not in page
    # Its page nests under ours: its title becomes our section, its sections ours.
    assert report.title == "Disk things (fake_suite_module.py)"
    assert "### Table" in page and "\n# " not in page


def test_external_suite_failing_status_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bench_main = _fake_suite(monkeypatch, "import sys\ndef main(argv):\n    sys.exit(3)\n")
    with pytest.raises(RuntimeError, match="exited with status 3"):
        bench_main.run_external("core", _context(tmp_path, "full"))


@pytest.mark.timeout(420)  # its child process's own timeout fires first
@pytest.mark.slow
def test_retention_bench_smoke_run_writes_its_tables(tmp_path: Path) -> None:
    require("redis-server")
    out = tmp_path / "retention.md"
    done = subprocess.run(
        [sys.executable, "-m", "bench.retention_bench", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    report = out.read_text()
    assert "time index bytes / message" in report and "TSEEK median us" in report
    assert "| rcp11 retention | 8 |" in report and "| redis active expiry | 8 |" in report
    assert "rcp11 / redis" in report
    assert "streams-oldest" in report and "| 100 |" in report and "writes/s" in report


def test_a_plot_that_fails_costs_the_picture_not_the_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The record is saved before anything is drawn: a suite whose plot
    cannot be drawn keeps its table and data, and says what failed."""
    import types

    from bench import __main__ as bench_main
    from bench.report import SuiteReport, Table, plot_lines, plot_ratios

    drawn = tmp_path / "plots" / "fine.png"

    def run(ctx: object) -> SuiteReport:
        report = SuiteReport("kafka", "Suite 1: fake")
        report.data["producer_rps"] = 1234.0
        table = Table("Throughput", ["clients", "records/s"])
        table.add(1, "1,234")
        report.tables.append(table)
        # No series to draw: that plot fails (as a missing matplotlib would).
        report.plots.append(plot_ratios(drawn, "fine", [("a", 1.0, 0.9)]))
        report.plots.append(plot_lines(tmp_path / "plots" / "broken.png", "t", "x", None, "y"))
        return report

    module = types.ModuleType("fake_own_suite")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_own_suite", module)
    monkeypatch.setitem(bench_main.OWN_SUITES, "kafka", "fake_own_suite")
    page = tmp_path / "page.md"
    assert bench_main.main(["--smoke", "--suite", "kafka", "--out", str(page)]) == 1
    record = json.loads(page.with_suffix(".json").read_text())
    suite = record["suites"]["kafka"]
    assert suite["data"] == {"producer_rps": 1234.0}
    assert [e.split(":")[0] for e in suite["errors"]] == ["plot broken.png"]
    text = page.read_text()
    assert "| 1 | 1,234 |" in text and "plot broken.png" in text
    assert "plots/fine.png" in text and drawn.read_bytes()[:4] == b"\x89PNG"
    assert "broken.png)" not in text


def _line(server_pct: float, gen_pct: float, us: float, kernel_us: float) -> object:
    from bench.redisbench import BenchLine

    line = BenchLine(rps=1000.0, p50_ms=0.1, p99_ms=0.2, wall=1.0, loadgen_cpu=gen_pct / 100)
    line.server_cpu_pct = server_pct
    line.server_us_per_request = us
    line.server_kernel_us_per_request = kernel_us
    line.server_syscalls_per_request = 2.0
    return line


@pytest.mark.parametrize(
    ("rcp11_pct", "gen_pct", "redis_pct", "shown"),
    [
        (99, 12, 98, True),  # both servers CPU-bound
        (94, 82, 83, False),  # redis-server was not: its rate is not its CPU cost
        (51, 98, 67, False),  # the load generator set the pace
        (56, 41, 47, False),  # neither saturated
    ],
)
def test_the_zero_user_time_ratio_is_given_only_where_both_servers_are_cpu_bound(
    rcp11_pct: float, gen_pct: float, redis_pct: float, shown: bool
) -> None:
    from bench.redis_suite import _bound

    rcp = [_line(rcp11_pct, gen_pct, us=57.9, kernel_us=47.3)] * 3
    red = [_line(redis_pct, gen_pct, us=79.1, kernel_us=56.2)] * 3
    note = _bound(rcp, red, 1000)  # type: ignore[arg-type]
    assert "47.3 of it in the kernel" in note and "(redis-server 79.1" in note
    assert ("user-space time at zero and its kernel time as measured, 1.67x" in note) == shown
    assert "cost nothing" not in note
    # The generator's ceiling only where the generator was the limit: 1000
    # requests in 1 s at 98% of a core is 980 us each, at most 1,020/s.
    generator_bound = gen_pct >= 85
    assert ("1.02x redis-server's rate is this row's ceiling" in note) == generator_bound


def test_update_replaces_only_the_suites_run(tmp_path: Path) -> None:
    """--update: the sections and goal rows of the suites run are replaced
    (a new suite is added), each saying when and where it ran; every other
    section and goal row keeps its figures."""
    from bench.report import SuiteReport, Table, update_page

    page = tmp_path / "page.md"
    page.write_text(
        "# rcp11 benchmarks\n\n## Goals at a glance\n\n"
        "| goal | measured | target | verdict | CPU |\n|---|---|---|---|---|\n"
        "| Kafka suite: 1 producer | 3 | >= 2 | met | - |\n"
        "| Attacks: old row | 900 ms | < 50 ms | **missed** | - |\n\n"
        "## Suite 1: the Kafka benchmark\n\nkafka figures\n\n"
        "## Suite: attacks\n\nold attack figures\n\n"
        "## Suite 4: zlib\n\nzlib figures\n"
    )
    env = {
        "date (UTC)": "2026-01-02 03:04",
        "CPU": "Some CPU, 2 cores",
        "RAM": "24 GiB",
        "load average at start": "0.1 / 0.2 / 0.3",
        "load average at end": "0.4 / 0.5 / 0.6",
        "rcp11 commit": "abc1234",
        "redis-server": "7.0.15",
    }
    attacks = SuiteReport("attacks", "Suite: attacks")
    table = Table("PING", ["attack", "worst"])
    table.add("one", "12.0")
    attacks.tables.append(table)
    attacks.goal("Attacks: worst PING", "12.0 ms", "< 50 ms", True)
    new = SuiteReport("new", "Suite: new one", intro="new figures")
    update_page(page, env, [attacks, new])
    text = page.read_text()
    assert "old attack figures" not in text and "| one | 12.0 |" in text
    assert "kafka figures" in text and "zlib figures" in text
    assert text.index("## Suite: attacks") < text.index("## Suite 4: zlib")
    assert text.rstrip().endswith("_Suite time: 0 s._") and "new figures" in text
    assert "2026-01-02 03:04 UTC, Some CPU, 2 cores" in text and "abc1234" in text
    glance = text.split("## Suite 1")[0]
    assert "Attacks: old row" not in glance and "| Attacks: worst PING | 12.0 ms |" in glance
    assert "| Kafka suite: 1 producer | 3 |" in glance
