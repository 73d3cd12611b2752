"""MULTI EXEC DISCARD WATCH UNWATCH."""

from __future__ import annotations

from typing import Any

from rcp11 import errors
from rcp11.commands.core import (
    call,
    command,
    lookup_original,
    transaction,
    unwatch_all,
    write_refusal,
)
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


def _end_transaction(state: ServerState, client: ClientState) -> None:
    client.queued = None
    client.multi_error = False
    unwatch_all(state, client)


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
    _end_transaction(state, client)
    return OK


@command("exec", 1, "noscript loading stale", summary="Run a transaction", group="transactions")
def exec_command(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    queued = client.queued
    if queued is None:
        raise CommandError(errors.EXEC_WITHOUT_MULTI)
    if client.multi_error:
        _end_transaction(state, client)
        raise CommandError(errors.EXEC_ABORT)
    if client.dirty_cas:
        _end_transaction(state, client)
        return NULL_ARRAY
    # Queued by their own names (dispatch renames argv[0] back).
    commands = [lookup_original(argv[0]) for argv in queued]
    if not state.loading:
        refusal = write_refusal(
            state, any(cmd.write for cmd in commands), any(cmd.denyoom for cmd in commands)
        )
        if refusal is not None:
            _end_transaction(state, client)
            raise CommandError(errors.exec_abort_because(refusal))
    _end_transaction(state, client)

    # Everything the transaction propagates goes to the log between MULTI
    # and EXEC, so a replay applies it all or nothing; a transaction that
    # changed nothing logs nothing.
    original_propagate = state.propagate
    wrapped = False

    def propagate_in_transaction(cmd_argv: list[bytes]) -> None:
        nonlocal wrapped
        if not wrapped:
            wrapped = True
            original_propagate([b"MULTI"])
        original_propagate(cmd_argv)

    state.propagate = propagate_in_transaction  # type: ignore[method-assign]
    previous_exec_client, transaction.client = transaction.client, client
    replies = []
    try:
        for cmd, cmd_argv in zip(commands, queued, strict=True):
            replies.append(call(state, client, cmd, cmd_argv))
    finally:
        transaction.client = previous_exec_client
        del state.propagate
        if wrapped:
            original_propagate([b"EXEC"])
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
