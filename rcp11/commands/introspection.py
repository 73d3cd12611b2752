"""COMMAND: what the command table says about itself, in redis-server 7's
shapes (COMMAND INFO's ten fields with key specs, COMMAND DOCS, GETKEYS).

Commands are listed as clients can call them: a command disabled by
rename-command is gone from every list and count; a renamed one is found
by its new name and, as redis-server 7 shows it (its reply carries the
command's own `fullname`), described under its original name.
"""

from __future__ import annotations

from typing import Any

from rcp11 import __version__, errors
from rcp11.commands.args import check_subcommand, text
from rcp11.commands.table import Command, callable_commands, command, lookup
from rcp11.errors import CommandError
from rcp11.resp import SimpleString
from rcp11.state import ClientState, ServerState
from rcp11.stringmatch import compile_glob

_ACL_CATEGORY = {
    "connection": "@connection",
    "transactions": "@transaction",
    "stream": "@stream",
    "string": "@string",
    "server": "@admin",
    "generic": "@keyspace",
}


def command_flags(cmd: Command) -> list[SimpleString]:
    """COMMAND INFO's flags: the row's, plus movablekeys when the legacy
    first/last/step cannot find every key (a key found after a keyword)."""
    flags = set(cmd.flags)
    if cmd.getkeys is not None or any(spec.keyword for spec in cmd.key_specs):
        flags.add("movablekeys")
    return [SimpleString(flag) for flag in sorted(flags)]


def _categories(cmd: Command) -> list[SimpleString]:
    categories = [_ACL_CATEGORY.get(cmd.group, "@keyspace")]
    if cmd.write or cmd.writes_some_keys:
        categories.append("@write")
    if "readonly" in cmd.flags or (
        not cmd.write and any("RO" in spec.flags for spec in cmd.key_specs)
    ):
        categories.append("@read")
    if "blocking" in cmd.flags:
        categories.append("@blocking")
    return [SimpleString(category) for category in categories]


def command_info(cmd: Command) -> list[Any]:
    """[name, arity, flags, first key, last key, step, ACL categories, tips,
    key specs, subcommands], as redis-server 7's COMMAND INFO."""
    return [
        cmd.name,
        cmd.arity,
        command_flags(cmd),
        cmd.first_key,
        cmd.last_key,
        cmd.step,
        _categories(cmd),
        [],
        [spec.reply() for spec in cmd.key_specs],
        [],
    ]


def _command_docs(cmd: Command) -> dict[str, Any]:
    docs: dict[str, Any] = {
        "summary": cmd.summary or cmd.name.upper(),
        "since": "1.0.0" if cmd.group != "stream" else __version__,
        "group": cmd.group,
    }
    if cmd.arguments:
        docs["arguments"] = [_doc_argument(arg) for arg in cmd.arguments]
    return docs


def _doc_argument(argument: dict[str, Any]) -> dict[str, Any]:
    """One COMMAND DOCS argument; its flags are status replies, as Redis's."""
    shown = dict(argument)
    if "flags" in shown:
        shown["flags"] = [SimpleString(flag) for flag in shown["flags"]]
    if "arguments" in shown:
        shown["arguments"] = [_doc_argument(arg) for arg in shown["arguments"]]
    return shown


def _getkeys(argv: list[bytes]) -> list[bytes]:
    """COMMAND GETKEYS <command> <args...>: the keys that call would use."""
    target = lookup(argv[0])
    if target is None:
        raise CommandError(errors.GETKEYS_UNKNOWN)
    arity = target.arity
    if (arity > 0 and len(argv) != arity) or len(argv) < -arity:
        raise CommandError(errors.GETKEYS_ARITY)
    keys = target.keys(argv)
    if not keys:
        raise CommandError(errors.GETKEYS_NONE)
    return keys


def _filter(argv: list[bytes], rows: list[Command]) -> list[str]:
    """COMMAND LIST FILTERBY MODULE|ACLCAT|PATTERN <value>."""
    if len(argv) != 5 or argv[2].lower() != b"filterby":
        raise CommandError(errors.SYNTAX)
    kind, value = argv[3].lower(), argv[4]
    if kind == b"pattern":
        match = compile_glob(value, nocase=True).match
        return [cmd.name for cmd in rows if match(cmd.name.encode())]
    if kind == b"aclcat":
        category = "@" + text(value).lower().lstrip("@")
        return [cmd.name for cmd in rows if category in map(str, _categories(cmd))]
    if kind == b"module":
        return []
    raise CommandError(errors.SYNTAX)


_HELP = [
    "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "(no subcommand)",
    "    Return details about all commands.",
    "COUNT",
    "    Return the total number of commands in this server.",
    "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
    "    Return a list of all commands in this server.",
    "INFO [<command-name> ...]",
    "    Return details about multiple commands.",
    "DOCS [<command-name> ...]",
    "    Return documentation details about multiple commands.",
    "GETKEYS <full-command>",
    "    Return the keys from a full command.",
    "HELP",
    "    Prints this help.",
]


@command("command", -1, "loading stale", summary="Describe the commands", group="server")
def command_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    rows = list(callable_commands().values())
    if len(argv) == 1:
        return [command_info(cmd) for cmd in rows]
    sub = check_subcommand(
        "command",
        {"count": 2, "info": -2, "docs": -2, "list": -2, "getkeys": -4, "help": 2},
        argv,
    )
    if sub == "count":
        return len(rows)
    if sub == "info":
        if len(argv) == 2:
            return [command_info(cmd) for cmd in rows]
        found = [lookup(name) for name in argv[2:]]
        return [None if cmd is None else command_info(cmd) for cmd in found]
    if sub == "docs":
        if len(argv) == 2:
            return {cmd.name: _command_docs(cmd) for cmd in rows}
        found = [lookup(name) for name in argv[2:]]
        return {cmd.name: _command_docs(cmd) for cmd in found if cmd is not None}
    if sub == "list":
        if len(argv) == 2:
            return [cmd.name for cmd in rows]
        return _filter(argv, rows)
    if sub == "getkeys":
        return _getkeys(argv[2:])
    return _HELP
