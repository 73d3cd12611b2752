"""Tables, plots and the BENCHMARKS.md page."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec

from bench.servers import REDIS_SERVER, REPO

P = ParamSpec("P")


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


@dataclass
class Plot:
    """A figure a suite asks for, drawn by `draw_plots` once the run's data
    is saved: a plotting failure costs the picture, never the measurements."""

    path: Path
    draw: Callable[[], object]


@dataclass
class SuiteReport:
    """What one suite contributes to BENCHMARKS.md and to the JSON results."""

    name: str
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    markdown_extra: str = ""
    data: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0
    goals: list[tuple[str, str, str, bool, str]] = field(default_factory=list)

    def goal(self, what: str, measured: str, target: str, ok: bool, bound: str = "") -> str:
        """Record a goal for the page's summary; return the table's verdict cell.

        `bound` is what the run measured about the limit (CPU shares, server
        CPU per request...); the summary shows it where the goal is missed.
        """
        self.goals.append((what, measured, target, ok, bound))
        return verdict(ok)

    def markdown(self, page_dir: Path) -> str:
        parts = [f"## {self.title}", ""]
        if self.intro:
            parts += [self.intro.strip(), ""]
        for table in self.tables:
            parts.append(table.markdown())
        for plot in self.plots:
            rel = os.path.relpath(plot.path, page_dir)
            parts += [f"![{plot.path.stem}]({rel})", ""]
        if self.markdown_extra:
            parts += [self.markdown_extra.strip(), ""]
        if self.errors:
            parts += ["**Errors in this suite:**", "", "```"]
            parts += [_short(e) for e in self.errors]
            parts += ["```", ""]
        parts.append(f"_Suite time: {self.seconds:.0f} s._\n")
        return "\n".join(parts)


def _short(error: str) -> str:
    """First and last line of an error (a server's start-up traceback is long)."""
    lines = [line for line in error.splitlines() if line.strip()]
    return lines[0] if len(lines) < 3 else f"{lines[0]} ... {lines[-1].strip()}"


def num(value: float) -> str:
    """Thousands separators, no decimals: 1,234,567."""
    return f"{value:,.0f}"


def mb(value_bytes_per_s: float) -> str:
    return f"{value_bytes_per_s / 1e6:,.1f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


# A process using at least this share of one core was busy all the run: it,
# not the other side, set the pace (below it, it waited on the other side or
# on the shared cores).
SATURATED_PCT = 85.0


def bound_note(
    server_pct: float,
    gen_pct: float,
    queued_pct: float = 0.0,
    per_request: str = "",
) -> str:
    """What limited a throughput figure, from the CPU measured over its run.

    States which process was saturated: the server, the load generator, or
    neither (then the server either waited for one of the 2 shared cores,
    its queued time, or for requests), then the figures themselves, and
    `per_request` (server CPU per request, beside redis-server's) if given.
    """
    if server_pct >= SATURATED_PCT:
        who = "server CPU-bound"
    elif gen_pct >= SATURATED_PCT:
        who = "load-generator-bound"
    elif server_pct + queued_pct >= SATURATED_PCT:
        who = "shared cores (the server was ready but waited for a core)"
    else:
        who = "neither saturated (the server idled, waiting for requests)"
    facts = f"{who}: server {server_pct:.0f}% of a core"
    if queued_pct >= 5:
        facts += f" (+{queued_pct:.0f}% queued)"
    facts += f", generator {gen_pct:.0f}%"
    if per_request:
        facts += f"; {per_request}"
    return facts


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (named beside absolute figures)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _redis_version() -> str:
    try:
        out = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True)
        return out.stdout.split(" v=")[1].split()[0] if " v=" in out.stdout else out.stdout.strip()
    except (OSError, IndexError):
        return "unknown"


def environment() -> dict[str, str]:
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()
    return {
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "CPU": f"{cpu_model()}, {os.cpu_count()} cores",
        "RAM": f"{mem_gb:.0f} GiB",
        "load average at start": f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
        "Python": platform.python_version(),
        "redis-server": _redis_version(),
        "rcp11 commit": _git_commit(),
    }


def write_page(
    out: Path, mode: str, env: dict[str, str], suites: list[SuiteReport], total: float
) -> None:
    page_dir = out.parent
    lines = [
        "# rcp11 benchmarks",
        "",
        f"Generated by `python -m bench{'' if mode == 'full' else ' --' + mode}` "
        f"in {total:.0f} s. Do not edit by hand: run it again.",
        "",
        "How to read this page: every figure names its exact workload. Ratios are "
        "rcp11 / redis-server measured in the same run, with the two servers' runs "
        "interleaved (A B A B ...) so that machine drift hits both sides alike; the "
        "ratio is the ratio of the medians. The load generators are `redis-benchmark` "
        "(C) or forked Python processes sending pre-encoded pipelined commands over "
        "raw sockets and counting replies without parsing messages; their CPU use is "
        "given as a percentage of one core (100% would mean the generator, not the "
        "server, was the limit). Server CPU is from /proc/PID/task/*/schedstat over the "
        "same interval; `(+N% queued)` is the time the server was ready to run but "
        "waited for a core, i.e. how much the rest of the machine slowed it down. The "
        "machine has 2 cores shared by the server, the generator and whatever else "
        "runs, so they compete for CPU.",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    lines.append("")
    lines.append("Contents: " + ", ".join(f"[{s.title}](#{_anchor(s.title)})" for s in suites))
    lines.append("")
    goals = [g for s in suites for g in s.goals]
    if goals:
        lines += [
            "## Goals at a glance",
            "",
            "| goal | measured | target | verdict | CPU and what bounds it (measured) |",
        ]
        lines.append("|---|---|---|---|---|")
        lines += [
            f"| {w} | {m} | {t} | {verdict(ok)} | {b.replace('|', '/') or '-'} |"
            for w, m, t, ok, b in goals
        ]
        lines += [
            "",
            "The last column gives the server's and the load generator's CPU over the row's "
            f"run in % of one core; a process at >= {SATURATED_PCT:.0f}% of a core was the "
            "limit. Details, workloads and CPU use are in the suite sections below.",
            "",
        ]
    for suite in suites:
        lines.append(suite.markdown(page_dir))
    out.write_text("\n".join(lines))


def update_page(out: Path, env: dict[str, str], suites: list[SuiteReport]) -> None:
    """Replace, in an existing page, the sections of these suites (a new
    one is added at the end) and their rows of the goals table (rows whose
    goal starts with the same "Name:" as one of theirs); everything else
    keeps the figures of the run that wrote it. Each section says when,
    where and at which commit it was measured."""
    text = out.read_text()
    machine = (
        f"_Updated on its own by `python -m bench --suite {{name}} --update`: {env['date (UTC)']} "
        f"UTC, {env['CPU']}, {env['RAM']} RAM, load average {env['load average at start']} at "
        f"start and {env.get('load average at end', '?')} at end, rcp11 commit "
        f"{env['rcp11 commit']}, redis-server {env['redis-server']}._"
    )
    for suite in suites:
        section = suite.markdown(out.parent).rstrip("\n")
        head, _, body = section.partition("\n")
        section = f"{head}\n\n{machine.format(name=suite.name)}\n{body}\n"
        text = _replace_section(text, suite.title, section)
        text = _replace_goals(text, suite.goals)
    out.write_text(text)


def _replace_section(text: str, title: str, section: str) -> str:
    start = text.find(f"\n## {title}\n")
    if start < 0:
        return text.rstrip("\n") + "\n\n" + section
    end = text.find("\n## ", start + 1)
    return text[: start + 1] + section + ("" if end < 0 else text[end:])


def _replace_goals(text: str, goals: list[tuple[str, str, str, bool, str]]) -> str:
    if not goals:
        return text
    prefixes = {what.split(":", 1)[0] + ":" for what, *_ in goals}
    rows = [
        f"| {w} | {m} | {t} | {verdict(ok)} | {b.replace('|', '/') or '-'} |"
        for w, m, t, ok, b in goals
    ]
    lines = text.split("\n")
    try:
        first = lines.index("## Goals at a glance")
    except ValueError:
        return text
    table = first + 4  # heading, blank, header, rule
    end = table
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    kept = [
        line for line in lines[table:end] if not any(line.startswith(f"| {p}") for p in prefixes)
    ]
    return "\n".join(lines[:table] + kept + rows + lines[end:])


def _anchor(title: str) -> str:
    keep = [c for c in title.lower() if c.isalnum() or c in " -"]
    return "".join(keep).replace(" ", "-")


def draw_plots(suites: list[SuiteReport]) -> None:
    """Draw every suite's plots; one that fails becomes an error of its
    suite and leaves the page (which then links only drawn pictures)."""
    for suite in suites:
        drawn = []
        for plot in suite.plots:
            try:
                plot.draw()
            except Exception as exc:  # matplotlib missing or failing: keep the rest
                suite.errors.append(f"plot {plot.path.name}: {type(exc).__name__}: {exc}")
            else:
                drawn.append(plot)
        suite.plots = drawn


def drawn_later(draw: Callable[P, Path]) -> Callable[P, Plot]:
    """Make a drawing function (its first argument the PNG's path) return a
    `Plot` that `draw_plots` draws, instead of drawing at once."""

    @functools.wraps(draw)
    def later(*args: P.args, **kwargs: P.kwargs) -> Plot:
        path = args[0] if args else kwargs["path"]
        assert isinstance(path, Path)
        return Plot(path, functools.partial(draw, *args, **kwargs))

    return later


@drawn_later
def plot_lines(
    path: Path,
    title: str,
    xlabel: str,
    series: dict[str, tuple[list[float], list[float]]],
    ylabel: str,
    logx: bool = False,
    secondary: dict[str, tuple[list[float], list[float]]] | None = None,
    secondary_label: str = "",
    ylim_zero: bool = True,
) -> Path:
    """A line plot; `secondary` series go on a right-hand axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    if logx:
        ax.set_xscale("log")
    if ylim_zero:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if secondary:
        ax2 = ax.twinx()
        for label, (xs, ys) in secondary.items():
            ax2.plot(xs, ys, marker="s", linestyle="--", color="tab:red", label=label)
        ax2.set_ylabel(secondary_label)
        ax2.set_ylim(bottom=0)
        h2, l2 = ax2.get_legend_handles_labels()
        handles += h2
        labels += l2
    ax.legend(handles, labels, loc="best", fontsize=8, framealpha=0.9)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


@drawn_later
def plot_ratios(path: Path, title: str, bars: list[tuple[str, float, float]]) -> Path:
    """Horizontal bars of rcp11/redis ratios, each with its goal as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(bars) + 1.2), dpi=110)
    labels = [b[0] for b in bars]
    values = [b[1] for b in bars]
    colors = ["tab:green" if v >= g else "tab:red" for _, v, g in bars]
    ys = list(range(len(bars)))
    ax.barh(ys, values, color=colors, alpha=0.8)
    ax.scatter([b[2] for b in bars], ys, marker="|", s=400, color="black", label="goal", zorder=3)
    ax.axvline(1.0, color="gray", linestyle=":", linewidth=1)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("rcp11 / redis (higher is better for rcp11)")
    ax.set_xlim(0, max(values + [b[2] for b in bars]) * 1.25)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
