"""Every error text the server sends, worded as redis-server 7 words it.

Handlers raise CommandError(text); the dispatcher turns it into an -error
reply. Texts include their error code (ERR, WRONGTYPE, NOAUTH, OOM, ...).
"""

from __future__ import annotations


class CommandError(Exception):
    """A command failed with a client-visible error; nothing was changed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProtocolError(Exception):
    """The client sent bytes that are not RESP; the connection is closed
    after the error reply is written."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
SYNTAX = "ERR syntax error"
NOT_INTEGER = "ERR value is not an integer or out of range"
NOAUTH = "NOAUTH Authentication required."
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
OOM = "OOM command not allowed when used memory > 'maxmemory'."
NO_SUCH_KEY = "ERR no such key"
OFFSET_OVERFLOW = "ERR stream offset would exceed 2^63-1"
EXEC_ABORT = "EXECABORT Transaction discarded because of previous errors."
NESTED_MULTI = "ERR MULTI calls can not be nested"
EXEC_WITHOUT_MULTI = "ERR EXEC without MULTI"
DISCARD_WITHOUT_MULTI = "ERR DISCARD without MULTI"
WATCH_IN_MULTI = "ERR WATCH inside MULTI is not allowed"
MISCONF = (
    "MISCONF Errors writing to the AOF file or the snapshot: rcp11 is configured to "
    "refuse writes while persistence fails. Check the server log and the disk."
)


def unknown_command(name: str, args: list[bytes]) -> str:
    # Redis puts a space after every quoted argument, the last one included.
    shown = "".join(f"'{a[:128].decode('utf-8', 'replace')}' " for a in args[:64])
    return f"ERR unknown command '{name}', with args beginning with: {shown}"


def wrong_arity(name: str) -> str:
    return f"ERR wrong number of arguments for '{name.lower()}' command"


def unknown_subcommand(sub: str, command: str) -> str:
    return f"ERR unknown subcommand '{sub}'. Try {command.upper()} HELP."
