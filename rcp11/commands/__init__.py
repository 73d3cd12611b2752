"""The command layer: the command table, the one dispatch every command
goes through (core.execute) and the handlers, one module per family.

    from rcp11.commands import execute, BLOCKED, COMMANDS

execute_run() is an optional fast path a server may try first on a
pipeline: a run of plain TWRITEs on one stream done with one append
(only worth calling when argv[0] is in RUN_COMMANDS).

Importing the package registers every command.
"""

from __future__ import annotations

# Each module registers its commands when imported.
from rcp11.commands import admin, connection, keys, streams, strings, transactions
from rcp11.commands.admin import info_text
from rcp11.commands.core import (
    BLOCKED,
    COMMANDS,
    RUN_COMMANDS,
    Command,
    client_disconnected,
    execute,
    expire_keys,
    parse_int,
    rename_command,
)
from rcp11.commands.streams import execute_run

__all__ = [
    "BLOCKED",
    "RUN_COMMANDS",
    "COMMANDS",
    "Command",
    "admin",
    "client_disconnected",
    "connection",
    "execute",
    "execute_run",
    "expire_keys",
    "info_text",
    "keys",
    "parse_int",
    "rename_command",
    "streams",
    "strings",
    "transactions",
]
