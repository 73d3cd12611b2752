"""What any command can answer, and what the request framing answers.

The texts that do not belong to one command: the dispatcher's (unknown
command, wrong arity, internal errors), the ones every write can meet
(WRONGTYPE, OOM, MISCONF), the generic syntax and integer errors, how an
argument is quoted inside an error, and rcp11/resp's protocol errors. Worded
as redis-server 7 words them; each text carries its error code.
"""


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
OOM = "OOM command not allowed when used memory > 'maxmemory'."


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


def subcommand_syntax(sub: str, command: str) -> str:
    """A known subcommand given more arguments than it takes (SLOWLOG GET 1 2)."""
    return (
        f"ERR unknown subcommand or wrong number of arguments for '{sub}'. "
        f"Try {command.upper()} HELP."
    )


SLOWLOG_COUNT = "ERR count should be greater than or equal to -1"


def quoted_arg(arg: bytes, limit: int | None = None) -> str:
    """A client's argument as error texts quote it, the same in the server
    and the module (rl_quote in src/module.c): at most `limit` bytes, cut at
    a NUL byte (the module's C strings, and redis-server's own %s, end
    there), invalid UTF-8 replaced as Python's "replace" decoding does, CR
    and LF as spaces (an error reply is one line)."""
    shown = arg[:limit].split(b"\0", 1)[0].decode("utf-8", "replace")
    return shown.replace("\r", " ").replace("\n", " ")


def err(message: str) -> str:
    """A plain -ERR reply with this text (config reasons, protocol errors)."""
    return f"ERR {message}"


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


# --- request framing (rcp11/resp; the server adds "ERR " and closes the connection)

PROTO_INVALID_BULK_LENGTH = "Protocol error: invalid bulk length"
PROTO_INVALID_MULTIBULK_LENGTH = "Protocol error: invalid multibulk length"
PROTO_TOO_BIG_BULK_COUNT_STRING = "Protocol error: too big bulk count string"
PROTO_TOO_BIG_INLINE_REQUEST = "Protocol error: too big inline request"
PROTO_TOO_BIG_MBULK_COUNT_STRING = "Protocol error: too big mbulk count string"
PROTO_UNAUTHENTICATED_BULK_LENGTH = "Protocol error: unauthenticated bulk length"
PROTO_UNAUTHENTICATED_MULTIBULK_LENGTH = "Protocol error: unauthenticated multibulk length"
PROTO_UNBALANCED_QUOTES_IN_REQUEST = "Protocol error: unbalanced quotes in request"
