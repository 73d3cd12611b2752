"""Run the Python fuzzers: `python -m fuzz.proto [--time S] [--merge] [TARGET ...]`.

Each target (raw, struct, diff, loop; all by default) runs in its own atheris
process for --time seconds, one after the other. Inputs that reach new code
are kept in fuzz/proto/runs/<target>/corpus/ (not in git); the seeds in
fuzz/proto/corpus/<target>/ are read first. A crash, a Finding or a timeout stops
that target, leaves the input in fuzz/proto/runs/<target>/artifacts/ and makes
the exit code 1: the input joins the seeds as finding-<what>, beside its
regression test in tests/test_fuzz_findings.py. --merge fuzzes nothing: it
folds fuzz/proto/runs/<target>/corpus/ into the seeds, keeping the fewest
inputs that reach every edge (fuzz/seeds.py).

Prints one line per target: executions, seconds, coverage (libFuzzer's
`cov`: instrumented edges reached; `ft`: features), corpus size, result.
Extra arguments after `--` go to libFuzzer as they are.

While a finding is known and its fix not merged, RCP11_FUZZ_AVOID_KNOWN=1
keeps the structure-aware generator away from it (see fuzz/proto/gen.py),
so a long run explores past it. CI never sets it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fuzz.seeds import minimise

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TARGET_NAMES = ("raw", "struct", "diff", "loop")

# Per input: a request that takes longer is a finding (KEYS on a long key
# must not freeze the server), and so is one that makes the process big.
INPUT_TIMEOUT_S = 10
RSS_LIMIT_MB = 2048
MAX_LEN = 4096


@dataclass
class Result:
    target: str
    runs: int
    seconds: float
    cov: int
    ft: int
    corpus: int
    exit_code: int
    artifact: str | None

    def line(self) -> str:
        outcome = "ok" if self.exit_code == 0 else f"FAILED ({self.artifact or 'see output'})"
        return (
            f"fuzz {self.target:6} runs={self.runs} time={self.seconds:.0f}s cov={self.cov} "
            f"ft={self.ft} corpus={self.corpus} {outcome}"
        )


def _env() -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )


def merge_target(target: str, extra: list[str]) -> None:
    """Fold what runs found into the target's seeds, minimised."""
    fuzzer = [sys.executable, "-m", "fuzz.proto._atheris", target]
    fuzzer += [f"-timeout={INPUT_TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}", *extra]
    os.environ.update(_env())
    seeds = HERE / "corpus" / target
    named, before, kept = minimise(seeds, [HERE / "runs" / target / "corpus"], fuzzer)
    print(f"fuzz {target:6} seeds: {named} named, {kept} found inputs kept ({before} before)")


def run_target(target: str, seconds: int, extra: list[str]) -> Result:
    seeds = HERE / "corpus" / target
    # libFuzzer reads corpus directories recursively: artifacts and the
    # scratch directory sit beside the corpus, not in it.
    work = HERE / "runs" / target / "corpus"
    artifacts = work.parent / "artifacts"
    for path in (seeds, work, artifacts):
        path.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "fuzz.proto._atheris",
        target,
        str(work),
        str(seeds),
        f"-max_total_time={seconds}",
        f"-timeout={INPUT_TIMEOUT_S}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-max_len={MAX_LEN}",
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
        *extra,
    ]
    env = _env()
    started = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds_taken = time.monotonic() - started
    output = proc.stdout + proc.stderr
    runs = _last_int(r"stat::number_of_executed_units:\s*(\d+)", output)
    cov = _last_int(r"\bcov: (\d+)", output)
    ft = _last_int(r"\bft: (\d+)", output)
    corpus = _last_int(r"\bcorp: (\d+)", output)
    artifact = None
    found = re.findall(r"Test unit written to (\S+)", output)
    if found:
        artifact = found[-1]
    if proc.returncode != 0:
        sys.stdout.write(output[-6000:])
    return Result(target, runs, seconds_taken, cov, ft, corpus, proc.returncode, artifact)


def _last_int(pattern: str, text: str) -> int:
    found = re.findall(pattern, text)
    return int(found[-1]) if found else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, extra = args[:at], args[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m fuzz.proto", description=__doc__.split("\n")[0]
    )
    parser.add_argument("targets", nargs="*", help="raw, struct, diff, loop (default: all)")
    parser.add_argument("--time", type=int, default=600, help="seconds per target (600)")
    parser.add_argument(
        "--merge", action="store_true", help="fold runs/ into the seeds, minimised (no fuzzing)"
    )
    options = parser.parse_args(args)
    unknown = set(options.targets) - set(TARGET_NAMES)
    if unknown:
        parser.error(f"unknown target(s): {', '.join(sorted(unknown))}")
    failed = False
    for target in options.targets or TARGET_NAMES:
        if options.merge:
            merge_target(target, extra)
            continue
        result = run_target(target, options.time, extra)
        print(result.line(), flush=True)
        failed |= result.exit_code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
