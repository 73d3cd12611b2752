"""Server configuration: the directive table, redis.conf loading, CONFIG.

Every directive is one row of DIRECTIVES: name, kind (how its text parses
and renders), default, whether CONFIG SET may change it on a running server,
and the limits its kind checks. The same table serves the config file,
`--directive value` arguments, CONFIG GET/SET and CONFIG REWRITE, so a
directive can never be accepted in one place and refused in another.

Values from get() are typed: bool, int (sizes in bytes), str, save rules as
[(seconds, changes), ...], bind as [address, ...], client-output-buffer-limit
as {"normal": (hard, soft, soft_seconds), "replica": ..., "pubsub": ...}.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rcp11 import __version__, errors
from rcp11.datafiles import data_paths, filename_problem, names_clash, same_file
from rcp11.files import replace_atomically
from rcp11.limits import DEFAULT_MAX_BULK_LEN, DEFAULT_QUERY_BUFFER_LIMIT, INT64_MAX, INT_MAX
from rcp11.resp import split_args
from rcp11.stringmatch import compile_glob


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
    name: str
    kind: str  # bool int memory enum string save bind obl octal
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


def _client_classes() -> dict[str, tuple[int, int, int]]:
    return {
        "normal": (0, 0, 0),
        "replica": (256 * 1024**2, 64 * 1024**2, 60),
        "pubsub": (32 * 1024**2, 8 * 1024**2, 60),
    }


DIRECTIVES: dict[str, Directive] = {
    d.name: d
    for d in [
        Directive("bind", "bind", ["127.0.0.1", "-::1"]),
        Directive("port", "int", 6379, high=65535),
        Directive("unixsocket", "string", "", mutable=False),
        Directive("unixsocketperm", "octal", 0, mutable=False, high=0o777),
        Directive("protected-mode", "bool", True),
        Directive(
            "enable-protected-configs", "enum", "no", mutable=False, choices=("no", "yes", "local")
        ),
        Directive("requirepass", "string", "", sensitive=True),
        Directive("timeout", "int", 0, high=INT_MAX),
        Directive("tcp-keepalive", "int", 300, high=INT_MAX),
        Directive("maxclients", "int", 10000, low=1, high=INT_MAX),
        Directive("maxmemory", "memory", 0),
        # Never a policy that drops keys behind the user's back (a log gives
        # data back through TEVICT/BACKLOG): noeviction, Redis's default, or
        # streams-oldest, which evicts the oldest macronodes of all streams
        # (rcp11/retention.py) so the server is a ring buffer of history.
        Directive(
            "maxmemory-policy", "enum", "noeviction", choices=("noeviction", "streams-oldest")
        ),
        Directive("dir", "dir", "./", protected=True),
        Directive("dbfilename", "string", "dump.rcp", filename_only=True, protected=True),
        Directive("save", "save", [(3600, 1), (300, 100), (60, 10000)]),
        Directive("appendonly", "bool", False),
        Directive("appendfilename", "string", "appendonly.aof", mutable=False, filename_only=True),
        Directive("appendfsync", "enum", "everysec", choices=("always", "everysec", "no")),
        Directive("auto-aof-rewrite-percentage", "int", 100, high=INT_MAX),
        Directive("auto-aof-rewrite-min-size", "memory", 64 * 1024**2),
        Directive("aof-load-truncated", "bool", True),
        Directive("stop-writes-on-bgsave-error", "bool", True),
        Directive("loglevel", "enum", "notice", choices=("debug", "verbose", "notice", "warning")),
        Directive("logfile", "string", "", mutable=False),
        Directive("daemonize", "bool", False, mutable=False),
        Directive("pidfile", "string", "", mutable=False),
        Directive("proto-max-bulk-len", "memory", DEFAULT_MAX_BULK_LEN, low=1024**2),
        Directive("client-query-buffer-limit", "memory", DEFAULT_QUERY_BUFFER_LIMIT, low=1024**2),
        Directive("client-output-buffer-limit", "obl", _client_classes()),
        Directive("hz", "int", 10, low=1, high=500),
        # Plain TCP and unix socket connections are served by the C lane's
        # own event loop (src/netloop.c), no Python call per request; "no"
        # serves them through asyncio as TLS connections are (the path
        # before it: for comparison, and a way back).
        Directive("lane-sockets", "bool", True, mutable=False),
        Directive("databases", "int", 1, mutable=False, low=1, high=1),
        Directive("stream-node-max-entries", "int", 1000, low=1, high=1_000_000),
        Directive("stream-compression", "enum", "no", choices=("no", "zlib")),
        Directive("stream-compression-level", "int", 6, low=1, high=9),
        Directive("stream-compression-depth", "int", 0, low=0, high=65_535),
        # Retention (rcp11/retention.py): 0 is off.
        Directive("stream-retention-ms", "int", 0),
        Directive("stream-retention-bytes", "memory", 0),
        # The slow log and the latency monitor (rcp11/diagnostics.py), as
        # redis-server 7 bounds them.
        Directive("slowlog-log-slower-than", "int", 10000, low=-1),
        Directive("slowlog-max-len", "int", 128),
        Directive("latency-monitor-threshold", "int", 0),
        # TLS (rcp11/tls.py), as redis-server 7 names them. Read once at
        # start-up, except tls-auth-clients (new handshakes follow it).
        Directive("tls-port", "int", 0, mutable=False, high=65535),
        Directive("tls-cert-file", "string", "", mutable=False),
        Directive("tls-key-file", "string", "", mutable=False),
        Directive("tls-key-file-pass", "string", "", mutable=False, sensitive=True),
        Directive("tls-ca-cert-file", "string", "", mutable=False),
        Directive("tls-auth-clients", "enum", "yes", choices=("yes", "no", "optional")),
        Directive("tls-protocols", "string", "", mutable=False),
    ]
}

# The directives whose values are secrets (see Directive.sensitive), with
# Redis's own that rcp11 does not have.
SENSITIVE = frozenset(
    [name for name, d in DIRECTIVES.items() if d.sensitive]
    + ["masterauth", "tls-client-key-file-pass"]
)

_CLASS_ALIASES = {"normal": "normal", "replica": "replica", "slave": "replica", "pubsub": "pubsub"}


def _parse(d: Directive, args: list[str], current: Any) -> Any:
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


def _render(d: Directive, value: Any, for_file: bool = False) -> str:
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


def _file_lines(d: Directive, value: Any) -> list[str]:
    """How the directive is written into a config file by CONFIG REWRITE."""
    if d.kind == "save":
        if not value:
            return ['save ""']
        return [f"save {s} {c}" for s, c in value]
    if d.kind in ("bind", "obl"):
        return [f"{d.name} {_render(d, value, True)}"]
    return [f"{d.name} {quote_arg(_render(d, value, True))}"]


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


class Config:
    """The running configuration. Start from defaults, then load_file() and
    apply_args() (file first, arguments override, as redis-server does)."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {name: _copy(d.default) for name, d in DIRECTIVES.items()}
        self._callbacks: dict[str, list[Callable[[Any], None]]] = {}
        self.path: str | None = None
        # Relative pidfile and logfile paths mean the directory the server
        # was started from (it chdir()s into `dir` later).
        self.start_dir = os.getcwd()
        # Where each directive was last set (file or command line), to name
        # it when a check across directives fails after loading.
        self._origin: dict[str, tuple[int, str, int, str]] = {}
        # While loading, the first `save` line replaces the default rules and
        # later ones add to them, so a file can list one rule per line.
        self._save_seen = False
        # rename-command lines (file, then arguments): (old, new, source,
        # line, text). Not a directive: no CONFIG GET/SET, kept by REWRITE.
        self.renames: list[tuple[str, str, str, int, str]] = []

    # -- reading -----------------------------------------------------------

    def get(self, name: str) -> Any:
        return self._values[name]

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def render(self, name: str) -> str:
        """The value as CONFIG GET shows it."""
        return _render(DIRECTIVES[name], self._values[name])

    def config_get(self, *patterns: str) -> dict[str, str]:
        """CONFIG GET: every directive matching any glob pattern
        (case-insensitive), rendered as text."""
        result: dict[str, str] = {}
        for pattern in patterns:
            lowered = pattern.lower()
            if not any(special in lowered for special in "[*?"):
                # As Redis: no glob character, an exact (case-blind) name.
                if lowered in DIRECTIVES and lowered not in result:
                    result[lowered] = self.render(lowered)
                continue
            match = compile_glob(pattern.encode("utf-8", "surrogateescape"), nocase=True).match
            for name in DIRECTIVES:
                if name not in result and match(name.encode()):
                    result[name] = self.render(name)
        return result

    # -- changing ----------------------------------------------------------

    def on_change(self, name: str, callback: Callable[[Any], None]) -> None:
        """Call callback(new_value) after CONFIG SET changes `name`. A
        callback may raise ConfigError to refuse; the change is then undone."""
        self._callbacks.setdefault(name, []).append(callback)

    def set(self, name: str, text: str | Iterable[str]) -> None:
        """CONFIG SET one directive (text may hold several words, as
        'save' or 'client-output-buffer-limit' take)."""
        self.set_many([(name, text if isinstance(text, str) else " ".join(text))])

    def protected_allowed(self, local: bool) -> bool:
        """Whether a client (connected over loopback or the unix socket when
        `local`) may CONFIG SET protected directives."""
        mode = self._values["enable-protected-configs"]
        return mode == "yes" or (mode == "local" and local)

    def set_many(self, pairs: list[tuple[str, str]], *, protected_ok: bool = True) -> None:
        """CONFIG SET name value [name value ...]: all or nothing. CONFIG SET
        from a client passes protected_ok=protected_allowed(...); code of the
        server itself may set anything mutable."""
        seen: set[str] = set()
        parsed: list[tuple[str, Any]] = []
        for raw_name, text in pairs:
            name = raw_name.lower()
            d = DIRECTIVES.get(name)
            if d is None:
                raise ConfigError(errors.CONFIG_UNKNOWN, raw_name, unknown=True)
            if name in seen:
                raise ConfigError(errors.CONFIG_DUPLICATE, raw_name)
            seen.add(name)
            if not d.mutable:
                raise ConfigError(errors.CONFIG_IMMUTABLE, raw_name)
            if d.protected and not protected_ok:
                raise ConfigError(errors.CONFIG_PROTECTED, raw_name)
            try:
                args = self._args_for_set(d, text)
                value = _parse(d, args, self._values[name])
            except ConfigError as exc:
                raise ConfigError(exc.reason, raw_name) from None
            parsed.append((name, value))
        candidate = dict(self._values)
        candidate.update(parsed)
        clash = self._files_clash(candidate)
        if clash is not None:
            problem, blamed = clash
            named = [raw for raw, _ in pairs if raw.lower() in blamed] or [pairs[-1][0]]
            raise ConfigError(problem, named[0])
        old = {name: self._values[name] for name, _ in parsed}
        for name, value in parsed:
            self._values[name] = value
        done: list[str] = []
        failing = ""
        try:
            for name, value in parsed:
                failing = name
                for callback in self._callbacks.get(name, ()):
                    callback(value)
                done.append(name)
        except ConfigError as exc:
            for name, value in old.items():
                self._values[name] = value
            # The failing directive's callbacks that ran before the refusal
            # (the server's chdir for `dir`, say) are undone too.
            for name in [*done, failing]:
                for callback in self._callbacks.get(name, ()):
                    try:
                        callback(old[name])
                    except ConfigError:
                        pass  # restoring the old value is best effort
            raise ConfigError(exc.reason, exc.name or failing) from None

    @staticmethod
    def _args_for_set(d: Directive, text: str) -> list[str]:
        if d.kind in ("save", "bind", "obl"):
            if text.strip() == "":
                return [""] if d.kind == "save" else []
            return text.split()
        return [text]

    # -- checks across directives -------------------------------------------

    def check(self) -> None:
        """After the file and the command line are applied: refuse values
        that only clash together (raises ConfigError naming where the later
        of the clashing directives was set)."""
        clash = self._files_clash(self._values)
        if clash is None:
            return
        problem, blamed = clash
        origins = [self._origin[name] for name in blamed if name in self._origin]
        if not origins:
            raise ConfigError(problem, blamed[0])
        _, source, line, text = max(origins)
        raise ConfigError(problem, blamed[0], source=source, line=line, text=text)

    def _files_clash(self, values: dict[str, Any]) -> tuple[str, list[str]] | None:
        """Why the files these values name would overwrite one another,
        with the directives involved; None when they are all distinct."""
        dbfilename, appendfilename = values["dbfilename"], values["appendfilename"]
        problem = names_clash(dbfilename, appendfilename)
        if problem is not None:
            return problem, ["dbfilename", "appendfilename"]
        ours = data_paths(values["dir"], dbfilename, appendfilename)
        theirs: dict[str, str] = {}
        for name in ("pidfile", "logfile"):
            if values[name]:
                theirs[name] = os.path.join(self.start_dir, values[name])
        if self.path:
            theirs["the config file"] = self.path
        for mine, path in ours.items():
            for other, other_path in theirs.items():
                if same_file(path, other_path):
                    blamed = [n for n in (other, mine, "dir") if n in DIRECTIVES]
                    return errors.config_same_file(mine, path, other), blamed
        return None

    # -- loading -----------------------------------------------------------

    def load_file(self, path: str) -> None:
        """Read a redis.conf-style file: `directive arg ...` per line, #
        comments, quoted arguments, `include other.conf`."""
        self.path = os.path.abspath(path)
        self._load_file(self.path, depth=0)

    def _load_file(
        self, path: str, depth: int, included_at: tuple[str, int, str] | None = None
    ) -> None:
        """Apply a file's directives; included_at: the file, line number and
        line of the `include` that names it."""
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            reason = errors.config_cant_open(path, exc.strerror)
            if included_at is None:
                # One line, as redis-server says it: there is no line to show.
                raise ConfigError(reason, source=path) from None
            source, number, text = included_at
            raise ConfigError(reason, source=source, line=number, text=text) from None
        for number, line in enumerate(lines, 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            tokens = split_args(stripped.encode("utf-8", "surrogateescape"))
            if tokens is None:
                raise ConfigError(
                    errors.CONFIG_UNBALANCED_QUOTES,
                    source=path,
                    line=number,
                    text=stripped,
                )
            words = [t.decode("utf-8", "surrogateescape") for t in tokens]
            if words[0].lower() == "include" and len(words) == 2:
                if depth > 16:
                    raise ConfigError(errors.CONFIG_INCLUDE_DEPTH, source=path, line=number)
                target = os.path.join(os.path.dirname(path), words[1])
                self._load_file(target, depth + 1, (path, number, stripped))
                continue
            self._apply(words, path, number, stripped)

    def apply_args(self, argv: list[str]) -> None:
        """Apply `--directive value ...` groups as redis-server takes them:
        each `--name` starts a group, the words after it are its arguments."""
        groups: list[list[str]] = []
        for word in argv:
            if word.startswith("--") and len(word) > 2:
                groups.append([word[2:]])
            elif groups:
                groups[-1].append(word)
            else:
                raise ConfigError(
                    errors.CONFIG_BAD_DIRECTIVE,
                    source="<command line>",
                    line=0,
                    text=word,
                )
        for number, words in enumerate(groups, 1):
            text = " ".join(["--" + words[0]] + [quote_arg(w) for w in words[1:]])
            self._apply(words, "<command line>", number, text)

    def _apply(self, words: list[str], source: str, line: int, text: str) -> None:
        name = words[0].lower()
        if name == "rename-command" and len(words) == 3:
            self.renames.append((words[1], words[2], source, line, text))
            return
        d = DIRECTIVES.get(name)
        if d is None or len(words) < 2:
            raise ConfigError(
                errors.CONFIG_BAD_DIRECTIVE,
                name,
                source=source,
                line=line,
                text=text,
            )
        args = words[1:]
        try:
            value = _parse(d, args, self._values[name])
        except ConfigError as exc:
            raise ConfigError(exc.reason, name, source=source, line=line, text=text) from None
        self._origin[name] = (len(self._origin), source, line, text)
        if d.kind == "save" and value and self._save_seen:
            value = self._values["save"] + value
        if d.kind == "save":
            self._save_seen = True
        self._values[name] = value

    # -- CONFIG REWRITE ----------------------------------------------------

    def rewrite(self) -> None:
        """Rewrite the file the configuration was loaded from so it holds the
        running values: lines of unchanged directives (and every comment)
        stay as they are, changed ones are replaced where they were, and
        directives set away from their default but absent are appended."""
        if self.path is None:
            raise ConfigError(errors.CONFIG_NO_FILE)
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise ConfigError(errors.config_rewrite_failed(exc.strerror)) from None
        where: dict[str, list[int]] = {}
        in_file: dict[str, Any] = {}
        for index, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            tokens = split_args(stripped.encode("utf-8", "surrogateescape"))
            if not tokens:
                continue
            words = [t.decode("utf-8", "surrogateescape") for t in tokens]
            name = words[0].lower()
            d = DIRECTIVES.get(name)
            if d is None:
                continue
            where.setdefault(name, []).append(index)
            try:
                value = _parse(d, words[1:], in_file.get(name, _copy(d.default)))
            except ConfigError:
                value = None
            if d.kind == "save" and name in in_file and value:
                value = in_file[name] + value
            in_file[name] = value
        replace: dict[int, list[str]] = {}
        appended: list[str] = []
        for name, d in DIRECTIVES.items():
            current = self._values[name]
            if name in where:
                if in_file.get(name) == current:
                    continue
                first, *rest = where[name]
                replace[first] = _file_lines(d, current)
                for index in rest:
                    replace[index] = []
            elif current != d.default:
                appended.extend(_file_lines(d, current))
        output: list[str] = []
        for index, line in enumerate(lines):
            output.extend(replace.get(index, [line]))
        if appended:
            marker = "# Generated by CONFIG REWRITE"
            if marker not in output:
                output.append(marker)
            output.extend(appended)
        data = ("\n".join(output) + "\n").encode("utf-8", "surrogateescape")
        try:
            replace_atomically(self.path, lambda file: file.write(data), keep_mode=True)
        except OSError as exc:
            raise ConfigError(errors.config_rewrite_failed(exc.strerror)) from None


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


__all__ = ["DIRECTIVES", "Config", "ConfigError", "Directive", "parse_memory", "quote_arg"]
