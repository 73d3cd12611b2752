"""The command table and the one dispatch every command goes through.

Handlers are synchronous and do no I/O: they read and change ServerState,
call state.propagate() for what they changed, and return a reply value (see
rcp11.resp). A blocking handler registers the client with state.blocking and
returns BLOCKED; the server then sends nothing until the blocking manager
delivers the reply with client.send().
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rcp11 import errors
from rcp11.errors import CommandError
from rcp11.resp import OK, PONG, Error
from rcp11.state import ClientState, ServerState

Handler = Callable[[ServerState, ClientState, list[bytes]], Any]


class _Blocked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


# Returned by execute() when the client now waits; the server sends nothing.
BLOCKED = _Blocked()


@dataclass(frozen=True)
class Command:
    name: str
    handler: Handler
    arity: int  # > 0: exactly; < 0: at least -arity. The name counts.
    flags: frozenset[str]
    first_key: int = 0
    last_key: int = 0
    step: int = 0


COMMANDS: dict[str, Command] = {}


def command(
    name: str, arity: int, flags: str = "", first_key: int = 0, last_key: int = 0, step: int = 0
) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        COMMANDS[name] = Command(
            name, handler, arity, frozenset(flags.split()), first_key, last_key, step
        )
        return handler

    return register


def execute(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    """Run one command for client; returns its reply or BLOCKED."""
    name = argv[0].decode("utf-8", "replace").lower()
    cmd = COMMANDS.get(name)
    if cmd is None:
        return Error(errors.unknown_command(argv[0].decode("utf-8", "replace"), argv[1:]))
    if (cmd.arity > 0 and len(argv) != cmd.arity) or len(argv) < -cmd.arity:
        return Error(errors.wrong_arity(name))
    client.last_command = name
    state.stats.total_commands_processed += 1
    try:
        return cmd.handler(state, client, argv)
    except CommandError as exc:
        return Error(exc.message)


@command("ping", -1, "fast stale")
def ping(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        raise CommandError(errors.wrong_arity("ping"))
    return PONG if len(argv) == 1 else argv[1]


@command("echo", 2, "fast stale")
def echo(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    return argv[1]


@command("quit", -1, "noauth fast stale")
def quit_(state: ServerState, client: ClientState, argv: list[bytes]) -> Any:
    # The server closes the connection once this reply is written.
    client.closing = True
    return OK


__all__ = ["BLOCKED", "COMMANDS", "Command", "execute"]
