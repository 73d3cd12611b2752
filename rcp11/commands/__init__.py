"""The command layer: the command table, the one dispatch every command
goes through (core.execute) and the handlers, one module per family.

    from rcp11.commands import execute, BLOCKED, COMMANDS

Importing the package registers every command.
"""

from __future__ import annotations

# Each module registers its commands when imported.
from rcp11.commands import admin, connection, keys, streams, strings, transactions
from rcp11.commands.admin import info_text
from rcp11.commands.core import (
    BLOCKED,
    COMMANDS,
    Command,
    client_disconnected,
    execute,
    expire_keys,
    glob_to_regex,
    parse_int,
)

__all__ = [
    "BLOCKED",
    "COMMANDS",
    "Command",
    "admin",
    "client_disconnected",
    "connection",
    "execute",
    "expire_keys",
    "glob_to_regex",
    "info_text",
    "keys",
    "parse_int",
    "streams",
    "strings",
    "transactions",
]
