"""Keep a fuzz target's committed seed corpus small.

    python -m fuzz.seeds SEEDS [MORE ...] -- FUZZER [ARG ...]

SEEDS is a target's seed directory in the tree (fuzz/core/corpus/<harness>/,
fuzz/proto/corpus/<target>/); MORE are directories a long run grew
(fuzz/*/runs/..., git-ignored); FUZZER is the command that runs the target
under libFuzzer (a libFuzzer binary, or `python -m fuzz.proto._atheris
TARGET`). `make fuzz-seeds` calls it for every target.

A seed directory holds two kinds of file:

- named by hand (`twrite`, `finding-nested-array`, `fill-read-<sha>.bin`):
  hand-written seeds, and `finding-*` inputs that once made the target fail
  and are replayed on every run. They are always kept.
- named by the SHA-1 of their content (40 hex digits, as libFuzzer names what
  it finds): inputs that reached new code. Only the fewest that reach every
  coverage edge the whole pool reaches are kept.

The coverage is libFuzzer's own (the same for the C harnesses and atheris),
in two passes:

1. One `-merge=1` over the named files, then all the others, with a control
   file. libFuzzer runs them in that order in one process and writes, per
   input, the edges no earlier input reached (its COV lines): the inputs with
   any such edge reach, together, everything the pool reaches.
2. Each of those inputs alone, for its whole edge set; then a greedy set
   cover (the input adding the most edges not yet reached, until none adds
   any), starting from what the named files reach. Pass 2 typically halves
   what pass 1 picked.

Edges, not libFuzzer's finer features (hit counts, comparisons): a long run
rebuilds those in minutes from inputs that already reach the code.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FOUND_NAME = re.compile(r"[0-9a-f]{40}")


def is_found(path: Path) -> bool:
    """Named as libFuzzer names what it finds (the SHA-1 of the content)."""
    return FOUND_NAME.fullmatch(path.name) is not None


def found_name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _files(directories: Iterable[Path]) -> list[Path]:
    return sorted(p for d in directories if d.is_dir() for p in d.rglob("*") if p.is_file())


def read_control_file(path: Path) -> tuple[list[str], int, dict[int, set[int]]]:
    """The inputs a `-merge=1` run listed, how many came from its first
    directory, and per input the edges it was the first to reach (COV lines;
    an input that crashed or timed out has none)."""
    lines = path.read_text().splitlines()
    count, first = int(lines[0]), int(lines[1])
    files = lines[2 : 2 + count]
    cov: dict[int, set[int]] = {}
    for line in lines[2 + count :]:
        parts = line.split()
        if parts and parts[0] == "COV":
            cov[int(parts[1])] = {int(edge) for edge in parts[2:]}
    return files, first, cov


def _merge(fuzzer: Sequence[str], first: Path, rest: Path, control: Path) -> None:
    """Run libFuzzer's merge of `rest` into `first`, keeping its control file.
    Tried twice: on a loaded machine an input can pass -timeout once."""
    command = [*fuzzer, "-merge=1", f"-merge_control_file={control}", str(first), str(rest)]
    for _ in range(2):
        control.unlink(missing_ok=True)
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode == 0 and control.exists():
            return
    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode})")


def first_reach(
    fuzzer: Sequence[str], named: list[Path], pool: list[Path]
) -> tuple[set[int], list[Path]]:
    """Pass 1: the edges the named files reach, and the inputs of `pool`
    that reach an edge no named file and no earlier input of the pool
    reaches."""
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as tmp:
        root = Path(tmp)
        first, rest = root / "named", root / "pool"
        first.mkdir()
        rest.mkdir()
        for path in named:
            shutil.copyfile(path, first / found_name(path.read_bytes()))
        by_name = {}
        for path in pool:
            by_name[path.name] = path
            shutil.copyfile(path, rest / path.name)
        _merge(fuzzer, first, rest, root / "control")
        files, in_first, cov = read_control_file(root / "control")
        reached = set().union(*(cov.get(i, set()) for i in range(in_first)))
        picked = [by_name[Path(files[i]).name] for i in range(in_first, len(files)) if cov.get(i)]
        return reached, picked


def edges_of(fuzzer: Sequence[str], path: Path) -> set[int]:
    """Every edge one input reaches, run alone."""
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as tmp:
        root = Path(tmp)
        (root / "empty").mkdir()
        (root / "one").mkdir()
        shutil.copyfile(path, root / "one" / "input")
        _merge(fuzzer, root / "empty", root / "one", root / "control")
        _, _, cov = read_control_file(root / "control")
        return cov.get(0, set())


def cover(reached: set[int], candidates: dict[Path, set[int]]) -> list[Path]:
    """Greedy set cover: the candidate adding the most unreached edges, until
    none adds any (ties: the smaller file, then the name, for a stable pick)."""
    reached = set(reached)
    left = dict(candidates)
    chosen: list[Path] = []
    while left:
        best = min(left, key=lambda p: (-len(left[p] - reached), p.stat().st_size, p.name))
        if not left[best] - reached:
            break
        chosen.append(best)
        reached |= left.pop(best)
    return chosen


def minimise(
    seeds: Path, more: list[Path], fuzzer: Sequence[str], jobs: int = 2
) -> tuple[int, int, int]:
    """Rewrite `seeds` to its named files plus a minimal covering set of the
    found inputs of `seeds` and `more`. Returns (named, found before, kept)."""
    named = [p for p in _files([seeds]) if not is_found(p)]
    old = [p for p in _files([seeds]) if is_found(p)]
    # Only found inputs join the pool: a crash artifact beside a run's
    # corpus is a finding, to be named by hand (finding-*), not picked.
    pool: dict[str, Path] = {}
    for path in [*old, *(p for p in _files(more) if is_found(p))]:
        pool.setdefault(found_name(path.read_bytes()), path)
    reached, picked = first_reach(fuzzer, named, list(pool.values()))
    with ThreadPoolExecutor(max_workers=jobs) as workers:
        edges = dict(zip(picked, workers.map(lambda p: edges_of(fuzzer, p), picked), strict=True))
    keep = cover(reached, edges)
    contents = {found_name(p.read_bytes()): p.read_bytes() for p in keep}
    for path in old:
        if path.name not in contents:
            path.unlink()
    for name, data in contents.items():
        (seeds / name).write_bytes(data)
    return len(named), len(old), len(keep)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    at = args.index("--")
    parser = argparse.ArgumentParser(prog="python -m fuzz.seeds", description=__doc__)
    parser.add_argument("seeds", type=Path)
    parser.add_argument("more", type=Path, nargs="*")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    options = parser.parse_args(args[:at])
    fuzzer = args[at + 1 :]
    named, before, kept = minimise(options.seeds, options.more, fuzzer, options.jobs)
    print(f"{options.seeds}: {named} named, {kept} found inputs kept ({before} before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
