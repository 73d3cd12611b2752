"""Argument helpers every handler module shares."""

from __future__ import annotations

import re
import time
from typing import Any

from rcp11 import errors
from rcp11.errors import CommandError
from rcp11.limits import INT64_MAX, INT64_MIN
from rcp11.state import ServerState

# The Redis version we behave like; tools read it from HELLO and INFO to
# decide which commands they may use.
REDIS_COMPAT_VERSION = "7.0.0"

# Redis's string2ll: optional '-', no '+', no leading zeros, no spaces.
INTEGER_RE = re.compile(rb"0|-?[1-9][0-9]{0,18}")


def parse_int(arg: bytes, message: str = errors.NOT_INTEGER) -> int:
    # Fast path for the usual short non-negative number (18 digits cannot
    # overflow); everything else goes through the exact check.
    if 0 < len(arg) < 19 and arg.isdigit() and (arg[0] != 48 or len(arg) == 1):
        return int(arg)
    if INTEGER_RE.fullmatch(arg) is None:
        raise CommandError(message)
    value = int(arg)
    if not INT64_MIN <= value <= INT64_MAX:
        raise CommandError(message)
    return value


def text(arg: bytes) -> str:
    return arg.decode("utf-8", "replace")


def get_string(state: ServerState, key: bytes) -> bytes | None:
    value = state.keyspace.get(key)
    if value is not None and not isinstance(value, bytes):
        raise CommandError(errors.WRONGTYPE)
    return value


def now_ms() -> int:
    return int(time.time() * 1000)


def config_value(state: ServerState, name: str, default: Any) -> Any:
    config = state.config
    if config is None:
        return default
    value = config.get(name)
    return default if value is None else value


def check_subcommand(command_name: str, arity: dict[str, int], argv: list[bytes]) -> str:
    """The lower-case subcommand of argv, checked against its arity."""
    sub = text(argv[1]).lower()
    expected = arity.get(sub)
    if expected is None:
        raise CommandError(errors.unknown_subcommand(text(argv[1]), command_name))
    if (expected > 0 and len(argv) != expected) or len(argv) < -expected:
        raise CommandError(errors.wrong_arity(f"{command_name}|{sub}"))
    return sub


def on_off(arg: bytes) -> bool:
    value = arg.lower()
    if value not in (b"on", b"off"):
        raise CommandError(errors.SYNTAX)
    return value == b"on"


__all__ = [
    "INTEGER_RE",
    "REDIS_COMPAT_VERSION",
    "check_subcommand",
    "config_value",
    "get_string",
    "now_ms",
    "on_off",
    "parse_int",
    "text",
]
