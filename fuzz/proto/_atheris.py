"""One fuzzer process: `python -m fuzz.proto._atheris TARGET [libFuzzer args...]`.

rcp11 is imported under atheris's instrumentation, so libFuzzer sees the
Python branches the input reached (coverage-guided); the C core and hiredis
are not instrumented. Started by `python -m fuzz.proto`, which passes the corpus
directories and limits.
"""

from __future__ import annotations

import os
import shlex
import sys

import atheris

with atheris.instrument_imports(include=["rcp11"]):
    import rcp11.commands  # noqa: F401  (every command module, instrumented)
    from fuzz.proto.harness import in_scratch_dir
    from fuzz.proto.targets import TARGETS


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _self_command(name: str) -> str:
    """An executable that starts this fuzzer again: libFuzzer's -merge (and
    -fork) run argv[0] as a program, which a `python -m` module is not."""
    path = os.path.abspath(f"fuzz-{name}.sh")
    root = _root()
    with open(path, "w") as f:
        f.write(
            f"#!/bin/sh\nPYTHONPATH={shlex.quote(root)} exec {shlex.quote(sys.executable)} "
            f'-m fuzz.proto._atheris {shlex.quote(name)} "$@"\n'
        )
    os.chmod(path, 0o755)
    return path


def main() -> None:
    name = sys.argv[1]
    target = TARGETS[name]
    # Commands that write files write them into the target's scratch
    # directory (under runs/, not in git); the corpus paths are absolute
    # (python -m fuzz.proto makes them so).
    in_scratch_dir(os.path.join(_root(), "fuzz", "proto", "runs", name, "scratch"))
    atheris.Setup([_self_command(name), *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
