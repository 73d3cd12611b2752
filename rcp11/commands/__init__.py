"""The command layer: the command table, the one check and dispatch every
command goes through, the pipeline a connection hands its requests to, and
the handlers, one module per family.

    from rcp11.commands import run_pipeline, Stop      # the server's entry point
    from rcp11.commands import execute, BLOCKED        # one command (AOF replay, tests)

table.py holds the rows (Command, KeySpec, rename-command), core.py the
check and the dispatch (execute, call, serving blocked clients),
pipeline.py run_pipeline(), lane.py run_lane() (the C lane in front of
it). Importing the package registers every command.
"""

from __future__ import annotations

# Each module registers its commands when imported.
from rcp11.commands import (
    admin,
    connection,
    diagnostics,
    groups,
    info,
    introspection,
    keys,
    streams,
    strings,
    transactions,
    tread,
)
from rcp11.commands.args import parse_int
from rcp11.commands.connection import client_line
from rcp11.commands.core import (
    BLOCKED,
    DEFERRED,
    check,
    client_disconnected,
    execute,
    expire_keys,
    serve_ready,
)
from rcp11.commands.info import info_text
from rcp11.commands.lane import lane_open, run_buffered, run_lane
from rcp11.commands.pipeline import Stop, late_reply, protocol_error_reply, run_pipeline
from rcp11.commands.table import COMMANDS, Command, KeySpec, rename_command

__all__ = [
    "BLOCKED",
    "DEFERRED",
    "COMMANDS",
    "Command",
    "KeySpec",
    "Stop",
    "admin",
    "check",
    "client_disconnected",
    "client_line",
    "connection",
    "diagnostics",
    "execute",
    "expire_keys",
    "groups",
    "info",
    "info_text",
    "introspection",
    "keys",
    "lane_open",
    "late_reply",
    "parse_int",
    "protocol_error_reply",
    "rename_command",
    "run_buffered",
    "run_lane",
    "run_pipeline",
    "serve_ready",
    "streams",
    "strings",
    "transactions",
    "tread",
]
