"""One configuration directive: its row in the table (Directive), how its
text parses into a typed value and renders back, by kind (parse_value,
render_value, file_lines), and the refusal every step raises (ConfigError).

rcp11/config.py holds the table of directives (DIRECTIVES) and the running
configuration built on it; this module knows no directive by name but the
kinds' own (save, bind, client-output-buffer-limit).

The kinds: bool (yes/no), int, memory (100mb), octal, enum (one of
choices), string, dir (an existing directory, made absolute), save (rules
of seconds and changes), bind (addresses), obl (client-output-buffer-limit
per client class).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rcp11 import __version__, errors
from rcp11.datafiles import filename_problem
from rcp11.limits import INT64_MAX


class ConfigError(Exception):
    """A directive or value was refused.

    reason is the bare explanation ("argument must be a memory value");
    name the directive it is about; message the reply CONFIG SET sends.
    When the value came from a file or the command line, source and line
    say where, and fatal_message() renders Redis's start-up complaint.
    """

    def __init__(
        self,
        reason: str,
        name: str | None = None,
        *,
        unknown: bool = False,
        source: str | None = None,
        line: int | None = None,
        text: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.name = name
        self.unknown = unknown
        self.source = source
        self.line = line
        self.text = text

    @property
    def message(self) -> str:
        if self.name is None:
            return errors.err(self.reason)
        if self.unknown:
            return errors.config_set_unknown(self.name)
        return errors.config_set_failed(self.name, self.reason)

    def fatal_message(self) -> str:
        if self.line is None and self.source is not None:
            return self.reason  # about the whole file (it cannot be read): no line to show
        return errors.config_fatal(
            __version__, self.source, self.line, self.text or "", self.reason
        )

    def __str__(self) -> str:
        return self.fatal_message() if self.source else self.reason


# ---------------------------------------------------------------------------
# Value kinds: parse(text tokens) -> value, render(value) -> tokens
# ---------------------------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1024,
    "m": 1000**2,
    "mb": 1024**2,
    "g": 1000**3,
    "gb": 1024**3,
}


def parse_memory(text: str) -> int:
    """'100mb' -> 104857600 as Redis's memtoull: k/m/g are powers of 1000,
    kb/mb/gb powers of 1024, case-insensitive."""
    lowered = text.strip().lower()
    digits = lowered.rstrip("kmgb")
    unit = lowered[len(digits) :]
    if unit not in _UNITS or not digits or not digits.lstrip("-").isdigit():
        raise ConfigError(errors.CONFIG_NOT_MEMORY)
    value = int(digits) * _UNITS[unit]
    if value < 0:
        raise ConfigError(errors.CONFIG_NOT_MEMORY)
    return value


def _rewrite_memory(value: int) -> str:
    for unit, size in (("gb", 1024**3), ("mb", 1024**2), ("kb", 1024)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


@dataclass(frozen=True)
class Directive:
    """One row of the directive table (rcp11/config.py's DIRECTIVES)."""

    name: str
    kind: str  # bool int memory octal enum string dir save bind obl
    default: Any
    mutable: bool = True
    low: int = 0
    high: int = INT64_MAX
    choices: tuple[str, ...] = ()
    # Plain file names only: a path here would let CONFIG SET write anywhere.
    filename_only: bool = False
    # Where files are written: CONFIG SET only with enable-protected-configs
    # (redis-server 7's PROTECTED_CONFIG).
    protected: bool = False
    # A secret: the slow log shows "(redacted)" for the value CONFIG SET
    # gives it (redis-server 7's SENSITIVE_CONFIG).
    sensitive: bool = False


_CLASS_ALIASES = {"normal": "normal", "replica": "replica", "slave": "replica", "pubsub": "pubsub"}


def parse_value(d: Directive, args: list[str], current: Any) -> Any:
    """Parse one directive's arguments into its typed value. `current` matters
    only for kinds that accumulate (client-output-buffer-limit per class)."""
    kind = d.kind
    if kind in ("save", "bind", "obl") and len(args) == 1 and args[0].strip():
        # One quoted argument holding several words ("--save '60 1'"), as
        # Redis 7 accepts for its multi-argument directives.
        args = args[0].split()
    if kind == "save":
        return _parse_save(args)
    if kind == "bind":
        if not args:
            raise ConfigError(errors.CONFIG_WRONG_ARGS)
        return list(args)
    if kind == "obl":
        return _parse_obl(args, current)
    if len(args) != 1:
        raise ConfigError(errors.CONFIG_WRONG_ARGS)
    text = args[0]
    if kind == "bool":
        lowered = text.lower()
        if lowered not in ("yes", "no"):
            raise ConfigError(errors.CONFIG_NOT_BOOL)
        return lowered == "yes"
    if kind in ("int", "memory", "octal"):
        if kind == "memory":
            value = parse_memory(text)
        else:
            try:
                value = int(text, 8 if kind == "octal" else 10)
            except ValueError:
                raise ConfigError(errors.CONFIG_NOT_INTEGER) from None
        if not d.low <= value <= d.high:
            raise ConfigError(errors.config_out_of_range(d.low, d.high))
        return value
    if kind == "enum":
        lowered = text.lower()
        if lowered not in d.choices:
            raise ConfigError(errors.config_not_choice(d.choices))
        return lowered
    if kind == "dir":
        path = os.path.abspath(text)
        if not os.path.isdir(path):
            raise ConfigError(errors.config_no_directory(text))
        return path
    if d.filename_only:
        problem = filename_problem(d.name, text)
        if problem is not None:
            raise ConfigError(problem)
    return text


def _parse_save(args: list[str]) -> list[tuple[int, int]]:
    if len(args) == 1 and args[0] == "":
        return []
    if not args or len(args) % 2:
        raise ConfigError(errors.CONFIG_BAD_SAVE)
    rules = []
    for i in range(0, len(args), 2):
        try:
            seconds, changes = int(args[i]), int(args[i + 1])
        except ValueError:
            raise ConfigError(errors.CONFIG_BAD_SAVE) from None
        if seconds < 1 or changes < 0:
            raise ConfigError(errors.CONFIG_BAD_SAVE)
        rules.append((seconds, changes))
    return rules


def _parse_obl(
    args: list[str], current: dict[str, tuple[int, int, int]]
) -> dict[str, tuple[int, int, int]]:
    if not args or len(args) % 4:
        raise ConfigError(errors.CONFIG_OBL_ARGS)
    result = dict(current)
    for i in range(0, len(args), 4):
        cls = _CLASS_ALIASES.get(args[i].lower())
        if cls is None:
            raise ConfigError(errors.CONFIG_OBL_CLASS)
        try:
            hard = parse_memory(args[i + 1])
            soft = parse_memory(args[i + 2])
            seconds = int(args[i + 3])
        except (ConfigError, ValueError):
            raise ConfigError(errors.CONFIG_OBL_VALUES) from None
        if seconds < 0:
            raise ConfigError(errors.CONFIG_OBL_VALUES)
        result[cls] = (hard, soft, seconds)
    return result


def render_value(d: Directive, value: Any, for_file: bool = False) -> str:
    kind = d.kind
    if kind == "bool":
        return "yes" if value else "no"
    if kind == "memory":
        # CONFIG GET shows plain bytes, as Redis does; a rewritten file gets
        # the largest exact binary unit, as people write it by hand.
        return _rewrite_memory(value) if for_file else str(value)
    if kind == "octal":
        return format(value, "o")
    if kind == "dir" and not for_file:
        return os.path.abspath(value)  # CONFIG GET dir shows where files go
    if kind == "save":
        return " ".join(f"{s} {c}" for s, c in value)
    if kind == "bind":
        return " ".join(value)
    if kind == "obl":
        # "slave" is what Redis 7 itself prints for the replica class.
        parts = []
        for cls, shown in (("normal", "normal"), ("replica", "slave"), ("pubsub", "pubsub")):
            hard, soft, seconds = value[cls]
            if for_file:
                parts.append(f"{shown} {_rewrite_memory(hard)} {_rewrite_memory(soft)} {seconds}")
            else:
                parts.append(f"{shown} {hard} {soft} {seconds}")
        return " ".join(parts)
    return str(value)


def quote_arg(text: str) -> str:
    """Quote a value so split_args() reads it back unchanged."""
    if text and all(c.isprintable() and c not in " \"'\\" for c in text):
        return text
    escaped = []
    for c in text:
        if c in '"\\':
            escaped.append("\\" + c)
        elif c == "\n":
            escaped.append("\\n")
        elif c == "\r":
            escaped.append("\\r")
        elif c == "\t":
            escaped.append("\\t")
        elif not c.isprintable():
            escaped.append("".join(f"\\x{b:02x}" for b in c.encode()))
        else:
            escaped.append(c)
    return '"' + "".join(escaped) + '"'


def file_lines(d: Directive, value: Any) -> list[str]:
    """How the directive is written into a config file by CONFIG REWRITE."""
    if d.kind == "save":
        if not value:
            return ['save ""']
        return [f"save {s} {c}" for s, c in value]
    if d.kind in ("bind", "obl"):
        return [f"{d.name} {render_value(d, value, True)}"]
    return [f"{d.name} {quote_arg(render_value(d, value, True))}"]
