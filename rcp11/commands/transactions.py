"""MULTI EXEC DISCARD WATCH UNWATCH."""

from __future__ import annotations

from typing import Any

from rcp11 import errors
from rcp11.commands.core import call, end_transaction, unwatch_all
from rcp11.commands.table import command, lookup_original
from rcp11.errors import CommandError
from rcp11.resp import NULL_ARRAY, OK
from rcp11.state import ClientState, ServerState


@command(
    "multi", 1, "noscript loading stale fast", summary="Start a transaction", group="transactions"
)
def multi_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is not None:
        raise CommandError(errors.NESTED_MULTI)
    client.queued = []
    client.multi_error = False
    return OK


@command(
    "discard",
    1,
    "noscript loading stale fast",
    summary="Discard a transaction",
    group="transactions",
)
def discard_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is None:
        raise CommandError(errors.DISCARD_WITHOUT_MULTI)
    end_transaction(state, client)
    return OK


@command(
    "exec",
    1,
    "noscript loading stale skip_slowlog",
    summary="Run a transaction",
    group="transactions",
)
def exec_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    queued = client.queued
    if queued is None:
        raise CommandError(errors.EXEC_WITHOUT_MULTI)
    if client.multi_error:
        end_transaction(state, client)
        raise CommandError(errors.EXEC_ABORT)
    if client.dirty_cas:
        end_transaction(state, client)
        return NULL_ARRAY
    # Queued by their own names (dispatch renames argv[0] back). MISCONF
    # and OOM were checked for all of them when EXEC itself was (core.check).
    commands = [lookup_original(argv[0]) for argv in queued]
    end_transaction(state, client)
    # Everything the transaction propagates goes to the log between MULTI
    # and EXEC, so a replay applies it all or nothing; a transaction that
    # changed nothing logs nothing. Blocking commands answer at once.
    replies = []
    denied, client.deny_blocking = client.deny_blocking, True
    try:
        with state.transaction_log():
            for cmd, cmd_argv in zip(commands, queued, strict=True):
                replies.append(call(state, client, cmd, cmd_argv))  # type: ignore[arg-type]
    finally:
        client.deny_blocking = denied
    return replies


@command("watch", -2, "noscript loading stale fast", summary="Watch keys", group="transactions")
def watch_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if client.queued is not None:
        raise CommandError(errors.WATCH_IN_MULTI)
    for key in argv[1:]:
        state.keyspace.watchers.setdefault(key, set()).add(client)
        client.watched.add(key)
    return OK


@command(
    "unwatch", 1, "noscript loading stale fast", summary="Forget watched keys", group="transactions"
)
def unwatch_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    unwatch_all(state, client)
    return OK
