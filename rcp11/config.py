"""Server configuration: the directive table, redis.conf loading, CONFIG.

Every directive is one row of DIRECTIVES: name, kind (how its text parses
and renders), default, whether CONFIG SET may change it on a running server,
and the limits its kind checks. The same table serves the config file,
`--directive value` arguments, CONFIG GET/SET and CONFIG REWRITE, so a
directive can never be accepted in one place and refused in another.

Values from get() are typed: bool, int (sizes in bytes), str, save rules as
[(seconds, changes), ...], bind as [address, ...], client-output-buffer-limit
as {"normal": (hard, soft, soft_seconds), "replica": ..., "pubsub": ...}.
How each kind's text parses and renders, and ConfigError, are
rcp11/directive.py's (handed on from here too).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from rcp11 import errors
from rcp11.datafiles import data_paths, names_clash, same_file
from rcp11.directive import (
    ConfigError,
    Directive,
    file_lines,
    parse_memory,
    parse_value,
    quote_arg,
    render_value,
)
from rcp11.files import replace_atomically
from rcp11.limits import DEFAULT_MAX_BULK_LEN, DEFAULT_QUERY_BUFFER_LIMIT, INT_MAX
from rcp11.resp import split_args
from rcp11.stringmatch import compile_glob


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
        # Microseconds the C loop waits, after a poll that served many
        # connections, before one that would serve few (src/netloop.c,
        # COALESCING); 0 never waits.
        Directive("lane-coalesce-usec", "int", 10, low=0, high=1000),
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
        return render_value(DIRECTIVES[name], self._values[name])

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
                value = parse_value(d, args, self._values[name])
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
            value = parse_value(d, args, self._values[name])
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
                value = parse_value(d, words[1:], in_file.get(name, _copy(d.default)))
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
                replace[first] = file_lines(d, current)
                for index in rest:
                    replace[index] = []
            elif current != d.default:
                appended.extend(file_lines(d, current))
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
