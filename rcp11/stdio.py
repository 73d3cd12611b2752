"""The command-line programs' exit when their reader went away: `rcp11-server
--help | head -1` closes the pipe before the program's output is written,
and Python then prints a BrokenPipeError traceback (from the write or from
the interpreter's final flush of stdout). Every entry point runs through
quiet_broken_pipe(), as a Unix tool does: no traceback, the exit status of
a program killed by SIGPIPE's usual handling is not needed either (0)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def quiet_broken_pipe(run: Callable[[], int]) -> int:
    """run()'s exit status, or 0 when stdout's reader closed the pipe."""
    try:
        status = run()
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        return 0
    return status


def silence_stdout() -> None:
    """stdout's reader is gone and stdout may still hold unwritten bytes:
    point it at /dev/null so the interpreter's final flush has nowhere to
    fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
