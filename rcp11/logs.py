"""The log, as redis-server writes it, and how keys and arguments are shown.

    12345:M 21 Nov 2026 21:33:43.123 * DB loaded from disk: 3 keys

`pid:role date level-mark message`: role M for the server, C for a forked
child (snapshot or rewrite), level marks . - * # for debug, verbose,
notice and warning (the loglevel directive's names).

show_arg() is redis-server's sdscatrepr(): how MONITOR shows arguments
and how log lines name keys ("big", "a\\x00b"), never Python's b'big'.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rcp11.config import Config

# Level names of the loglevel directive, mapped onto logging's numbers;
# "verbose" sits between DEBUG and INFO as it does in Redis.
VERBOSE = 15
LEVELS = {
    "debug": logging.DEBUG,
    "verbose": VERBOSE,
    "notice": logging.INFO,
    "warning": logging.WARNING,
}
_LEVEL_MARKS = {logging.DEBUG: ".", VERBOSE: "-", logging.INFO: "*"}

_ESCAPES = {
    ord("\\"): "\\\\",
    ord('"'): '\\"',
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    ord("\a"): "\\a",
    ord("\b"): "\\b",
}
# Byte -> how sdscatrepr() writes it: printable ASCII as itself, the usual
# escapes, anything else as \xHH.
_SHOWN = [
    _ESCAPES.get(byte, chr(byte) if 32 <= byte < 127 else f"\\x{byte:02x}") for byte in range(256)
]


def show_arg(data: bytes) -> str:
    """data as redis-server prints a string: in double quotes, with \\n, \\r,
    \\t, \\a, \\b, \\\\ and \\" escapes and \\xHH for other unprintable bytes."""
    if data.isascii() and data.isalnum():
        return f'"{data.decode()}"'
    return '"' + "".join(map(_SHOWN.__getitem__, data)) + '"'


class RedisFormatter(logging.Formatter):
    """`pid:M 21 Nov 2026 21:33:43.123 * message` (see the module docstring)."""

    def __init__(self, main_pid: int) -> None:
        super().__init__()
        self.main_pid = main_pid

    def format(self, record: logging.LogRecord) -> str:
        pid = os.getpid()
        role = "M" if pid == self.main_pid else "C"
        stamp = time.strftime("%d %b %Y %H:%M:%S", time.localtime(record.created))
        mark = _LEVEL_MARKS.get(record.levelno, "#")
        text = f"{pid}:{role} {stamp}.{int(record.msecs):03d} {mark} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(config: Config) -> None:
    """Send every log line where `logfile` says (stdout when empty; nowhere
    for a daemon without a logfile), at `loglevel`."""
    logging.addLevelName(VERBOSE, "VERBOSE")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    logfile = config.get("logfile")
    handler: logging.Handler
    if logfile:
        handler = logging.FileHandler(logfile, encoding="utf-8")
    elif config.get("daemonize"):
        handler = logging.NullHandler()  # a daemon's stdout is /dev/null
    else:
        handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(RedisFormatter(os.getpid()))
    root.addHandler(handler)
    root.setLevel(LEVELS[config.get("loglevel")])


def set_level(level: str) -> None:
    """CONFIG SET loglevel."""
    logging.getLogger().setLevel(LEVELS[level])


__all__ = ["LEVELS", "VERBOSE", "RedisFormatter", "set_level", "setup_logging", "show_arg"]
