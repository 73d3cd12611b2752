"""The command table: one row per command, its key specifications, and the
names clients call it by (rename-command).

A row says everything dispatch and COMMAND INFO/DOCS/GETKEYS need: arity,
flags, the legacy first/last/step key positions, and Redis 7 key specs
(where keys are and what the command does to them). Handlers register
their row with @command when their module is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rcp11.state import ClientState, ServerState

Handler = Callable[["ServerState", "ClientState", list[bytes]], Any]

# Commands with subcommands (CLIENT LIST shows "cmd=client|list").
_CONTAINERS = frozenset({"client", "config", "command", "memory", "object", "slowlog", "latency"})

# Commands a client inside MULTI runs at once instead of queuing.
_NOT_QUEUED = frozenset({"exec", "discard", "multi", "watch", "quit", "reset"})

# Commands the C lane runs (some calls of: src/lane.c says which).
_LANE_COMMANDS = frozenset({"twrite", "tread"})

_ACCESS_KINDS = frozenset({"RO", "RW", "OW", "RM"})
# Key-spec flags that mean the command may change what the key holds.
_WRITE_KEY_FLAGS = frozenset({"RW", "OW", "RM"})


@dataclass(frozen=True)
class KeySpec:
    """One Redis 7 key specification: where the search for keys begins (a
    fixed index, or the argument after a keyword found from `startfrom`
    on), how many keys follow (a range: `lastkey` 0 is one key, -1 runs to
    the last argument), and what the command does to them (`flags`: RO, RW,
    OW, RM and ACCESS, UPDATE, INSERT, DELETE as Redis names them)."""

    flags: tuple[str, ...]
    index: int = 1
    keyword: bytes | None = None
    startfrom: int = 1
    lastkey: int = 0
    step: int = 1
    limit: int = 0

    @property
    def writes(self) -> bool:
        return not _WRITE_KEY_FLAGS.isdisjoint(self.flags)

    def keys(self, argv: list[bytes]) -> list[bytes]:
        """The keys of argv this spec finds."""
        if self.keyword is None:
            first = self.index
        else:
            keyword = self.keyword
            for i in range(self.startfrom, len(argv)):
                if argv[i].upper() == keyword:
                    first = i + 1
                    break
            else:
                return []
        if first >= len(argv):
            return []
        last = first + self.lastkey if self.lastkey >= 0 else len(argv) + self.lastkey
        if self.limit > 1 and self.lastkey < 0:
            last = first + (last - first + 1) // self.limit - 1
        return argv[first : last + 1 : self.step]

    def reply(self) -> dict[str, Any]:
        """COMMAND INFO's shape for this spec (a map in RESP3, a flat array
        of names and values in RESP2, as redis-server 7 replies)."""
        from rcp11.resp import SimpleString

        if self.keyword is None:
            begin = {"type": "index", "spec": {"index": self.index}}
        else:
            spec = {"keyword": self.keyword.decode(), "startfrom": self.startfrom}
            begin = {"type": "keyword", "spec": spec}
        find = {
            "type": "range",
            "spec": {"lastkey": self.lastkey, "keystep": self.step, "limit": self.limit},
        }
        # redis-server 7 prints the access kinds (RO, RW, OW, RM) in capitals
        # and what is done to the data (access, update, insert, delete) in
        # lower case.
        flags = [SimpleString(f if f in _ACCESS_KINDS else f.lower()) for f in self.flags]
        return {"flags": flags, "begin_search": begin, "find_keys": find}


@dataclass(frozen=True)
class Command:
    name: str
    handler: Handler
    arity: int  # > 0: exactly; < 0: at least -arity. The name counts.
    flags: frozenset[str]
    first_key: int = 0
    last_key: int = 0  # negative: counted from the end (-1 = last argument)
    step: int = 0
    summary: str = ""
    group: str = "generic"
    key_specs: tuple[KeySpec, ...] = ()
    # The exact keys of one call when the specs can only approximate them
    # (options parsed like the handler parses them), as Redis's getkeys_proc.
    getkeys: Callable[[list[bytes]], list[bytes]] | None = None
    # argv as MONITOR may show it: secrets replaced by "(redacted)".
    redact: Callable[[list[bytes]], list[bytes]] | None = None
    # COMMAND DOCS' "arguments" (redis-cli turns them into typing hints).
    arguments: tuple[dict[str, Any], ...] = ()
    # Derived from flags once, so dispatch tests booleans, not set members.
    write: bool = field(init=False)
    denyoom: bool = field(init=False)
    noauth: bool = field(init=False)
    no_multi: bool = field(init=False)
    admin: bool = field(init=False)
    # Not flagged write, but some calls write a key (TREAD ... GROUP g).
    writes_some_keys: bool = field(init=False)
    # CLIENT LIST names it "name|subcommand".
    container: bool = field(init=False)
    # Runs at once inside MULTI instead of being queued.
    not_queued: bool = field(init=False)
    # EXEC: checked for what its queued commands do.
    runs_transaction: bool = field(init=False)
    # The C lane (src/lane.c) runs some calls of it: EXEC hands it over.
    in_lane: bool = field(init=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "write", "write" in self.flags)
        set_(self, "denyoom", "denyoom" in self.flags)
        set_(self, "noauth", "no_auth" in self.flags)
        set_(self, "no_multi", "no_multi" in self.flags)
        set_(self, "admin", "admin" in self.flags)
        set_(self, "writes_some_keys", not self.write and any(s.writes for s in self.key_specs))
        set_(self, "container", self.name in _CONTAINERS)
        set_(self, "not_queued", self.name in _NOT_QUEUED)
        set_(self, "runs_transaction", self.name == "exec")
        set_(self, "in_lane", self.name in _LANE_COMMANDS)

    def keys(self, argv: list[bytes]) -> list[bytes]:
        """Every key argument of argv (COMMAND GETKEYS)."""
        if self.getkeys is not None:
            return self.getkeys(argv)
        found: list[bytes] = []
        for spec in self.key_specs:
            found += spec.keys(argv)
        return found

    def changes_nothing(self, argv: list[bytes]) -> bool:
        """Whether this call only reads: a readonly command, or a call of a
        command whose key specs write some keys that writes none (TREAD
        without GROUP). Running it for a client that will see no reply
        changes nothing anyone can see."""
        if "readonly" in self.flags:
            return True
        return self.writes_some_keys and not self.writes_keys(argv)

    def writes_keys(self, argv: list[bytes]) -> bool:
        """Whether this call may change a key: a write command, or one of
        the calls of a command whose key specs write some keys."""
        if self.write:
            return True
        if not self.writes_some_keys:
            return False
        if self.getkeys is not None:
            written = set(self.getkeys(argv))
            return any(written.intersection(s.keys(argv)) for s in self.key_specs if s.writes)
        return any(spec.keys(argv) for spec in self.key_specs if spec.writes)


def default_key_specs(flags: frozenset[str], keys: tuple[int, int, int]) -> tuple[KeySpec, ...]:
    """The key spec a simple command's legacy (first, last, step) implies."""
    first, last, step = keys
    if not first:
        return ()
    spec_flags = ("RO", "ACCESS") if "readonly" in flags else ("RW", "UPDATE")
    return (
        KeySpec(spec_flags, index=first, lastkey=last - first if last > 0 else last, step=step),
    )


COMMANDS: dict[str, Command] = {}
# The rows by the names clients may call them (rename-command changes these,
# never COMMANDS): lower-case name -> row, and the name's bytes as clients
# usually send them (upper or lower case), so dispatch needs no decode for
# the common spellings (BY_SPELLING is dispatch's first lookup).
_CLIENT_NAMES: dict[str, Command] = {}
BY_SPELLING: dict[bytes, Command] = {}
# rename-command's effect, new name (or "") by original name; empty when
# nothing was renamed, which is all dispatch tests on its hot path.
RENAMED: dict[str, str] = {}


def command(
    name: str,
    arity: int,
    flags: str = "",
    keys: tuple[int, int, int] = (0, 0, 0),
    summary: str = "",
    group: str = "generic",
    key_specs: tuple[KeySpec, ...] | None = None,
    getkeys: Callable[[list[bytes]], list[bytes]] | None = None,
    redact: Callable[[list[bytes]], list[bytes]] | None = None,
    arguments: tuple[dict[str, Any], ...] = (),
) -> Callable[[Handler], Handler]:
    """Register the decorated handler as command `name`. key_specs default
    to the one the legacy `keys` (first, last, step) imply."""

    def register(handler: Handler) -> Handler:
        flag_set = frozenset(flags.split())
        specs = default_key_specs(flag_set, keys) if key_specs is None else key_specs
        row = Command(
            name,
            handler,
            arity,
            flag_set,
            *keys,
            summary,
            group,
            specs,
            getkeys,
            redact,
            arguments,
        )
        COMMANDS[name] = _CLIENT_NAMES[name] = row
        BY_SPELLING[name.encode()] = BY_SPELLING[name.upper().encode()] = row
        return handler

    return register


def lookup(name: bytes) -> Command | None:
    """The command a client calls by this name (after rename-command)."""
    cmd = BY_SPELLING.get(name)
    if cmd is None:
        cmd = _CLIENT_NAMES.get(name.decode("utf-8", "replace").lower())
    return cmd


def lookup_original(name: bytes) -> Command | None:
    """The command by its own name, whatever rename-command did: what the
    AOF holds (dispatch logs original names) and EXEC runs."""
    return COMMANDS.get(name.decode("utf-8", "replace").lower())


def client_name(cmd: Command) -> str | None:
    """The name clients call cmd by: its own, the one rename-command gave
    it, or None when it was disabled (renamed to "")."""
    if cmd.name not in RENAMED:
        return cmd.name
    return RENAMED[cmd.name].lower() or None


def callable_commands() -> dict[str, Command]:
    """Every command clients can call, by the name they call it (what
    COMMAND, COMMAND COUNT, INFO, DOCS and LIST show, as Redis shows a
    renamed command under its new name and a disabled one not at all)."""
    return _CLIENT_NAMES


def rename_command(old: str, new: str) -> None:
    """rename-command old new, as redis.conf applies it: `old` stops
    answering, `new` ("" for none) calls that command. Raises ValueError
    with Redis's text."""
    cmd = _CLIENT_NAMES.get(old.lower())
    if cmd is None:
        raise ValueError("No such command in rename-command")
    if new and new.lower() in _CLIENT_NAMES:
        raise ValueError("Target command name already exists")
    del _CLIENT_NAMES[old.lower()]
    for spelling in [b for b, row in BY_SPELLING.items() if row is cmd]:
        del BY_SPELLING[spelling]
    if new:
        _CLIENT_NAMES[new.lower()] = cmd
        for spelling in {new, new.lower(), new.upper()}:
            BY_SPELLING[spelling.encode("utf-8", "surrogateescape")] = cmd
    RENAMED[cmd.name] = new


__all__ = [
    "COMMANDS",
    "RENAMED",
    "BY_SPELLING",
    "Command",
    "Handler",
    "KeySpec",
    "callable_commands",
    "client_name",
    "command",
    "lookup",
    "lookup_original",
    "rename_command",
]
