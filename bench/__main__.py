"""python -m bench [--quick|--smoke] [--suite kafka,redis,...] [--out BENCHMARKS.md] [--update]

Starts every server it needs (rcp11 and Debian's redis-server) on free
ports in temp directories, runs the suites, kills the servers (also on
error or Ctrl-C) and writes the page plus PNG plots and a JSON record.
With --update, only the sections (and goal rows) of the suites run are
replaced in the existing page; each says when and on what machine it ran.

The JSON record (bench/results/<mode>.json, or next to --out; not in git:
the committed record is BENCHMARKS.md and bench/plots/) is written after
every suite, before anything is drawn: a suite or a plot that fails later
costs no figure already measured. With --update it keeps the other suites'
figures of the record it finds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.common import Context
from bench.report import SuiteReport, draw_plots, environment, update_page, write_page
from bench.servers import REPO, server_pool

OWN_SUITES = {
    "kafka": "bench.kafka_suite",
    "redis": "bench.redis_suite",
    "kafkaesque": "bench.kafkaesque_suite",
    "module": "bench.module_bench",
    "zlib": "bench.zlib_suite",
    "groups": "bench.groups_suite",
    "attacks": "bench.attacks",
}
# Suites owned by other parts of the project; run when their module exists.
EXTERNAL_SUITES = {
    "core": ("bench.core_bench", "Storage core (C macronode) micro-benchmarks"),
    "persistence": ("bench.persistence_bench", "Persistence: AOF, snapshots, restart"),
    "spark": ("bench.spark_bench", "Spark data source: batch read, streaming sink, latency"),
    "lane": ("bench.lane_bench", "The C lane: server CPU per request, lane vs general path"),
    "retention": ("bench.retention_bench", "Retention and the time index"),
}
ALL_SUITES = [*OWN_SUITES, *EXTERNAL_SUITES]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="rcp11 benchmarks: Kafka's figures, Redis side by side, kafkaesque/voik. "
        "Starts and stops its own servers; writes BENCHMARKS.md and PNG plots.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes, under 2 minutes")
    size.add_argument(
        "--smoke", action="store_true", help="tiny sizes to check that everything runs (CI)"
    )
    parser.add_argument(
        "--suite",
        default=",".join(ALL_SUITES),
        help=f"comma-separated suites to run (default all: {','.join(ALL_SUITES)})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown page to write (default: BENCHMARKS.md at the repository root for a "
        "full run, bench/results/quick.md or smoke.md otherwise)",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="replace only the sections and goal rows of the suites run in the existing page "
        "(the rest keeps its figures); each updated section names its date and machine",
    )
    parser.add_argument(
        "--plots",
        type=Path,
        default=None,
        help="directory for PNG plots (default: bench/plots for the repository page, "
        "else a plots/ directory next to --out)",
    )
    args = parser.parse_args(argv)
    args.mode = "quick" if args.quick else "smoke" if args.smoke else "full"
    args.suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    unknown = [s for s in args.suites if s not in ALL_SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(ALL_SUITES)}")
    if args.out is None:
        # Only a full run replaces the committed page.
        page = "BENCHMARKS.md" if args.mode == "full" else f"bench/results/{args.mode}.md"
        args.out = REPO / page
    args.out = args.out.resolve()
    if args.plots is None:
        default_page = args.out == (REPO / "BENCHMARKS.md").resolve()
        args.plots = REPO / "bench" / "plots" if default_page else args.out.parent / "plots"
    return args


class _Tee(io.StringIO):
    """Keeps what a suite prints and shows it at once as progress (on stderr)."""

    def __init__(self, progress: io.TextIOBase) -> None:
        super().__init__()
        self.progress = progress

    def write(self, text: str) -> int:
        self.progress.write(text)
        self.progress.flush()
        return super().write(text)


def run_external(name: str, ctx: Context) -> SuiteReport:
    """Call another helper's suite: `run(...)` returning markdown, or `main(argv)`.

    Keyword arguments are passed only when its signature names them, so
    either style works: run(mode=...), run(quick=..., smoke=...), main([...]).
    """
    module_name, title = EXTERNAL_SUITES[name]
    report = SuiteReport(name, f"{title} ({module_name.split('.')[-1]}.py)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        report.markdown_extra = f"_Not run: `{module_name}` does not exist yet._"
        ctx.log(name, "module not present, skipped")
        return report
    entry: Callable[..., object] | None = getattr(module, "run", None) or getattr(
        module, "main", None
    )
    if entry is None:
        raise RuntimeError(f"{module_name} has neither run() nor main()")
    params = inspect.signature(entry).parameters
    source = inspect.getsource(module)
    flags = _cli_flags(ctx.mode, source)
    out_file = ctx.pool.root / f"{name}.md"
    if "--out" in source:
        flags += ["--out", str(out_file)]
    offered = {
        "mode": ctx.mode,
        "quick": ctx.mode != "full",
        "smoke": ctx.mode == "smoke",
        "plots_dir": ctx.plots_dir,
        "argv": flags,
    }
    kwargs = {k: v for k, v in offered.items() if k in params}
    positional: list[object] = []
    if not kwargs and params:
        positional = [flags]  # main(argv) style
    ctx.log(name, f"running {module_name}.{entry.__name__} ({ctx.mode})")
    captured = _Tee(sys.stderr)
    try:
        with contextlib.redirect_stdout(captured):
            result = entry(*positional, **kwargs)
    except SystemExit as exc:  # argparse refusing the flags, or sys.exit()
        result = exc.code if isinstance(exc.code, int) else 1
    cli_style = bool(positional) or "argv" in kwargs
    if cli_style and isinstance(result, int) and out_file.exists():
        result = out_file.read_text() if result == 0 else result
    if isinstance(result, str):
        result = _demote_headings(result)
        report.markdown_extra = result
        first, _, rest = result.lstrip().partition("\n")
        if first.startswith("## "):
            # The suite titled its own section: keep that title, one heading.
            report.title = f"{first[3:].strip()} ({module_name.split('.')[-1]}.py)"
            report.markdown_extra = rest
    elif hasattr(result, "markdown"):
        markdown = result.markdown
        report.markdown_extra = markdown() if callable(markdown) else str(markdown)
    elif isinstance(result, int) and result != 0:
        raise RuntimeError(f"{module_name} exited with status {result}")
    else:
        report.markdown_extra = captured.getvalue()
    return report


def _demote_headings(markdown: str) -> str:
    """Nest a page that uses `#` headings one level down: on our page `#` is
    the page title and `##` a suite."""
    lines = markdown.splitlines()
    if not any(line.startswith("# ") for line in lines):
        return markdown
    return "\n".join("#" + line if line.startswith("#") else line for line in lines) + "\n"


def _cli_flags(mode: str, source: str) -> list[str]:
    """Flags for a main(argv)-style suite. A suite without --smoke gets --quick
    plus its own size options scaled down, when it has them."""
    if mode == "full":
        return []
    if mode == "quick" or "--smoke" in source:
        return [f"--{mode}"]
    flags = ["--quick"]
    if "--size-gb" in source:
        flags += ["--size-gb", "0.01"]
    if "--seconds" in source:
        flags += ["--seconds", "0.3"]
    return flags


def record_path(args: argparse.Namespace) -> Path:
    """Where the run's raw figures go: bench/results/ (git-ignored) for the
    repository page, else next to --out."""
    if args.out == (REPO / "BENCHMARKS.md").resolve():
        return REPO / "bench" / "results" / f"{args.mode}.json"
    return args.out.with_suffix(".json")


def save_record(
    path: Path,
    env: dict[str, str],
    seconds: float,
    reports: list[SuiteReport],
    kept: dict[str, object] | None = None,
) -> None:
    """kept: the other suites' entries of the record an --update found;
    each suite run then carries its own run's environment."""
    suites: dict[str, object] = dict(kept or {})
    for r in reports:
        entry: dict[str, object] = {"data": r.data, "errors": r.errors, "seconds": r.seconds}
        if kept:
            entry["environment"] = env
        suites[r.name] = entry
    record = {"mode": env["mode"], "environment": env, "seconds": seconds, "suites": suites}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")


def kept_suites(path: Path, args: argparse.Namespace) -> dict[str, object]:
    """For --update: the suites of the record already there that this run
    does not measure again."""
    if not args.update or not path.exists():
        return {}
    try:
        suites = json.loads(path.read_text()).get("suites", {})
    except (OSError, ValueError):
        return {}
    return {name: entry for name, entry in suites.items() if name not in args.suites}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.plots.mkdir(parents=True, exist_ok=True)
    json_path = record_path(args)
    kept = kept_suites(json_path, args)
    env = environment()
    env["mode"] = args.mode
    started = time.monotonic()
    reports: list[SuiteReport] = []
    with server_pool() as pool:
        ctx = Context(args.mode, pool, args.plots)
        ctx.log("bench", f"mode {args.mode}, suites {','.join(args.suites)}, page {args.out}")
        for name in args.suites:
            suite_start = time.monotonic()
            try:
                if name in OWN_SUITES:
                    report = importlib.import_module(OWN_SUITES[name]).run(ctx)
                else:
                    report = run_external(name, ctx)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # one broken suite must not hide the others
                traceback.print_exc()
                title = getattr(sys.modules.get(OWN_SUITES.get(name, "")), "TITLE", f"Suite {name}")
                report = SuiteReport(name, title, errors=[f"{type(exc).__name__}: {exc}"])
            report.seconds = time.monotonic() - suite_start
            reports.append(report)
            save_record(json_path, env, time.monotonic() - started, reports, kept)
            ctx.log(name, f"done in {report.seconds:.0f} s, {len(report.errors)} error(s)")
    total = time.monotonic() - started
    load = os.getloadavg()
    env["load average at end"] = f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    save_record(json_path, env, total, reports, kept)
    draw_plots(reports)
    save_record(json_path, env, total, reports, kept)  # with any plot that failed
    if args.update and args.out.exists():
        update_page(args.out, env, reports)
    else:
        write_page(args.out, args.mode, env, reports, total)
    errors = sum(len(r.errors) for r in reports)
    print(f"wrote {args.out} ({total:.0f} s, {errors} error(s)); raw figures in {json_path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
