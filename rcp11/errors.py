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


class PersistenceError(Exception):
    """A persistence file cannot be loaded; the message names the file, the
    byte offset when known, and the problem."""


def expected_bulk(type_byte: int) -> str:
    """redis-server's reply to a request argument that is not a bulk string:
    the offending byte as it is (the server writes protocol errors latin-1
    encoded, so any byte stays one byte), CR and LF shown as spaces."""
    shown = " " if type_byte in (10, 13) else chr(type_byte)
    return f"Protocol error: expected '$', got '{shown}'"


WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
SYNTAX = "ERR syntax error"
NOT_INTEGER = "ERR value is not an integer or out of range"
NOAUTH = "NOAUTH Authentication required."
MONITOR_DENY_BLOCKING = "ERR MONITOR isn't allowed for DENY BLOCKING client"
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
OOM = "OOM command not allowed when used memory > 'maxmemory'."
NO_SUCH_KEY = "ERR no such key"
OFFSET_OVERFLOW = "ERR stream offset would exceed 2^63-1"
EXEC_ABORT = "EXECABORT Transaction discarded because of previous errors."
NESTED_MULTI = "ERR MULTI calls can not be nested"
EXEC_WITHOUT_MULTI = "ERR EXEC without MULTI"
DISCARD_WITHOUT_MULTI = "ERR DISCARD without MULTI"
WATCH_IN_MULTI = "ERR WATCH inside MULTI is not allowed"
MAX_CLIENTS = "ERR max number of clients reached"
DENIED = (
    "DENIED Redis is running in protected mode because protected mode is enabled and "
    "no password is set for the default user. In this mode connections are only "
    "accepted from the loopback interface. To accept other clients either set a "
    "password with 'requirepass' (CONFIG SET requirepass <password> from a local "
    "connection), or disable protection with 'protected-mode no', or bind to the "
    "loopback interface only. Restart the server after changing its config file."
)
PORT_ZERO_UNREACHABLE = (
    "port 0 would leave the server unreachable: neither unixsocket nor tls-port is configured"
)
UNLOGGED_CHANGE = (
    "MISCONF An internal error left a change that could not be logged to the AOF: "
    "rcp11 refuses writes until it is restarted. Check the server log."
)
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


# --- command layer (rcp11.commands, rcp11.blocking) ---
GROUP_IS_KEY = "ERR the group key must be a different key than the stream key"
GROUP_AND_GROUPNEW = "ERR GROUP and GROUPNEW cannot be used together"
NEGATIVE_COUNT = "ERR count must be >= 0"
NEGATIVE_TIMEOUT = "ERR timeout is negative"
INVALID_EXPIRE = "ERR invalid expire time in '{}' command"
INCR_OVERFLOW = "ERR increment or decrement would overflow"
DB_INDEX = "ERR DB index is out of range"
NO_SUCH_CLIENT = "ERR No such client"
CLIENT_NAME = "ERR Client names cannot contain spaces, newlines or special characters."
INVALID_CURSOR = "ERR invalid cursor"
NOPROTO = "NOPROTO unsupported protocol version"
HELLO_PROTO = "ERR Protocol version is not an integer or out of range"
HELLO_NOAUTH = (
    "NOAUTH HELLO must be called with the client already authenticated, otherwise the "
    "HELLO AUTH <user> <pass> option can be used to authenticate the client and select "
    "the RESP protocol version at the same time"
)
AUTH_NOT_CONFIGURED = (
    "ERR AUTH <password> called without any password configured for the default user. "
    "Are you sure your configuration is correct?"
)
NO_PERSISTENCE = "ERR persistence is not available in this server"
BGSAVE_IN_PROGRESS = "ERR Background save already in progress"
SAVE_FAILED = "ERR Failed saving the snapshot (see the server log)"
BGSAVE_CHILD_ACTIVE = (
    "ERR Another child process is active (AOF?): can't BGSAVE right now. "
    "Use BGSAVE SCHEDULE in order to schedule a BGSAVE whenever possible."
)
BGSAVE_FORK_FAILED = "ERR Can't fork a background save (see the server log)"
REWRITE_IN_PROGRESS = "ERR Background append only file rewriting already in progress"
REWRITE_FAILED = (
    "ERR Can't execute an AOF background rewriting. "
    "Please check the server logs for more information."
)
GETKEYS_UNKNOWN = "ERR Invalid command specified"
GETKEYS_ARITY = "ERR Invalid number of arguments specified for command"
GETKEYS_NONE = "ERR The command has no key arguments"
NOT_IN_TRANSACTION = "ERR Command not allowed inside a transaction"
UNBLOCKED = "UNBLOCKED client unblocked via CLIENT UNBLOCK"
TREAD_OFFSET = "ERR offset is not an integer or out of range"
TREAD_COUNT = "ERR count is not an integer or out of range"
TREAD_TIMEOUT = "ERR timeout is not an integer or out of range"
BACKLOG_COUNT = "ERR BACKLOG count must be an integer >= 0"


def group_not_offset(group: bytes) -> str:
    name = group[:128].decode("utf-8", "replace")
    return f"ERR group key '{name}' does not hold a valid offset (an integer >= 0)"


def syntax_error(problem: str) -> str:
    """A syntax error that says what is wrong (TWRITE, TREAD)."""
    return f"ERR syntax error, {problem}"


def twrite_unknown_option(option: str, entries_follow: bool) -> str:
    """TWRITE met a word that is not an option. When no ENTRIES comes
    after it, the user most likely forgot ENTRIES (TWRITE s BACKLOG 3 a b):
    say so first."""
    unknown = f"unknown option '{option}' (expected BACKLOG or ENTRIES)"
    return syntax_error(unknown if entries_follow else f"ENTRIES is missing, {unknown}")


def exec_abort_because(reason: str) -> str:
    return f"EXECABORT Transaction discarded because of: {reason}"


def internal_error(command: str, exc: BaseException) -> str:
    """A handler bug: the command failed and changed nothing."""
    return f"ERR internal error in '{command}': {type(exc).__name__}: {exc}"


def internal_error_running(exc: BaseException) -> str:
    """Dispatch itself failed (a bug outside any handler)."""
    return f"ERR internal error running the command: {exc}"


def failed_after_change(command: str, problem: str, logged: bool) -> str:
    """A handler raised after it had changed data; the change stays (and is
    in the AOF when logged), so the reply must say so rather than claim
    nothing happened."""
    outcome = "the change is kept and logged" if logged else "the change could not be logged"
    return f"{problem} (raised after '{command}' changed data; {outcome})"


# --- server, connection and key commands (Redis 7's texts) ------------------

NO_SHUTDOWN_IN_PROGRESS = "ERR No shutdown in progress."
SHUTDOWN_FAILED = "ERR Errors trying to SHUTDOWN. Check logs."
NO_LFU = "ERR An LFU maxmemory policy is not selected, access frequency not tracked."
EXPIRE_FLAGS_INCOMPATIBLE = "ERR NX and XX, GT or LT options at the same time are not compatible"
DECREMENT_OVERFLOW = "ERR decrement would overflow"
UNBLOCK_REASON = "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"
INVALID_CLIENT_ID = "ERR Invalid client ID"
CLIENT_ID_POSITIVE = "ERR client-id should be greater than 0"


def hello_option(option: str) -> str:
    return f"ERR Syntax error in HELLO option '{option}'"


def unrecognized_option(option: str) -> str:
    return f"ERR Unrecognized option '{option}'"


def setinfo_bad_chars(what: str) -> str:
    return f"ERR {what} cannot contain spaces, newlines or special characters."


def unknown_client_type(kind: str) -> str:
    return f"ERR Unknown client type '{kind}'"


def no_such_user(user: str) -> str:
    return f"ERR No such user '{user}'"


def unsupported_option(option: str) -> str:
    return f"ERR Unsupported option {option}"


def config_set_unknown(name: str) -> str:
    return f"ERR Unknown option or number of arguments for CONFIG SET - '{name}'"


def config_set_failed(name: str, reason: str) -> str:
    return f"ERR CONFIG SET failed (possibly related to argument '{name}') - {reason}"


def err(message: str) -> str:
    """A plain -ERR reply with this text (config reasons, protocol errors)."""
    return f"ERR {message}"


# --- request framing (resp.py; the server adds "ERR " and closes the connection)

PROTO_INVALID_BULK_LENGTH = "Protocol error: invalid bulk length"
PROTO_INVALID_MULTIBULK_LENGTH = "Protocol error: invalid multibulk length"
PROTO_TOO_BIG_BULK_COUNT_STRING = "Protocol error: too big bulk count string"
PROTO_TOO_BIG_INLINE_REQUEST = "Protocol error: too big inline request"
PROTO_TOO_BIG_MBULK_COUNT_STRING = "Protocol error: too big mbulk count string"
PROTO_UNAUTHENTICATED_BULK_LENGTH = "Protocol error: unauthenticated bulk length"
PROTO_UNAUTHENTICATED_MULTIBULK_LENGTH = "Protocol error: unauthenticated multibulk length"
PROTO_UNBALANCED_QUOTES_IN_REQUEST = "Protocol error: unbalanced quotes in request"


# --- CONFIG SET reasons (ConfigError; the reply is errors.config_set_failed)

BIND_FAILED = "Failed to bind to specified addresses."


def cant_chdir(path: str, why: str) -> str:
    return f"Can't chdir to '{path}': {why}"


def cant_lock(path: str, why: str) -> str:
    return f"can't lock {path}: {why}"


def cant_write(path: str, why: str) -> str:
    return f"can't write {path}: {why}"
