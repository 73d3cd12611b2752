"""The server's own commands: connection (AUTH, HELLO, CLIENT, MONITOR),
transactions (MULTI, EXEC, WATCH), keys and strings, and administration
(SAVE, BGSAVE, SHUTDOWN, COMMAND GETKEYS), in redis-server 7's words.
Stream commands' texts are in streams.py, CONFIG's in config.py.
"""

# --- connections, authentication and clients (AUTH, HELLO, CLIENT, MONITOR)

MAX_CLIENTS = "ERR max number of clients reached"
DENIED = (
    "DENIED Redis is running in protected mode because protected mode is enabled and "
    "no password is set for the default user. In this mode connections are only "
    "accepted from the loopback interface. To accept other clients either set a "
    "password with 'requirepass' (CONFIG SET requirepass <password> from a local "
    "connection), or disable protection with 'protected-mode no', or bind to the "
    "loopback interface only. Restart the server after changing its config file."
)
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
AUTH_NOT_CONFIGURED = (
    "ERR AUTH <password> called without any password configured for the default user. "
    "Are you sure your configuration is correct?"
)
NOPROTO = "NOPROTO unsupported protocol version"
HELLO_PROTO = "ERR Protocol version is not an integer or out of range"
HELLO_NOAUTH = (
    "NOAUTH HELLO must be called with the client already authenticated, otherwise the "
    "HELLO AUTH <user> <pass> option can be used to authenticate the client and select "
    "the RESP protocol version at the same time"
)
MONITOR_DENY_BLOCKING = "ERR MONITOR isn't allowed for DENY BLOCKING client"
NO_SUCH_CLIENT = "ERR No such client"
CLIENT_NAME = "ERR Client names cannot contain spaces, newlines or special characters."
INVALID_CLIENT_ID = "ERR Invalid client ID"
CLIENT_ID_POSITIVE = "ERR client-id should be greater than 0"
UNBLOCK_REASON = "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"
PAUSE_MODE = "ERR CLIENT PAUSE mode must be WRITE or ALL"
UNBLOCKED = "UNBLOCKED client unblocked via CLIENT UNBLOCK"


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


# --- transactions (MULTI, EXEC, DISCARD, WATCH)

EXEC_ABORT = "EXECABORT Transaction discarded because of previous errors."
NESTED_MULTI = "ERR MULTI calls can not be nested"
EXEC_WITHOUT_MULTI = "ERR EXEC without MULTI"
DISCARD_WITHOUT_MULTI = "ERR DISCARD without MULTI"
WATCH_IN_MULTI = "ERR WATCH inside MULTI is not allowed"
NOT_IN_TRANSACTION = "ERR Command not allowed inside a transaction"


def exec_abort_because(reason: str) -> str:
    return f"EXECABORT Transaction discarded because of: {reason}"


# --- keys and strings

NO_SUCH_KEY = "ERR no such key"
INVALID_EXPIRE = "ERR invalid expire time in '{}' command"
EXPIRE_FLAGS_INCOMPATIBLE = "ERR NX and XX, GT or LT options at the same time are not compatible"
INCR_OVERFLOW = "ERR increment or decrement would overflow"
DECREMENT_OVERFLOW = "ERR decrement would overflow"
DB_INDEX = "ERR DB index is out of range"
INVALID_CURSOR = "ERR invalid cursor"
NO_LFU = "ERR An LFU maxmemory policy is not selected, access frequency not tracked."


def unsupported_option(option: str) -> str:
    return f"ERR Unsupported option {option}"


# --- administration (SAVE, BGSAVE, BGREWRITEAOF, SHUTDOWN, COMMAND GETKEYS)

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
NO_SHUTDOWN_IN_PROGRESS = "ERR No shutdown in progress."
SHUTDOWN_FAILED = "ERR Errors trying to SHUTDOWN. Check logs."
GETKEYS_UNKNOWN = "ERR Invalid command specified"
GETKEYS_ARITY = "ERR Invalid number of arguments specified for command"
GETKEYS_NONE = "ERR The command has no key arguments"
