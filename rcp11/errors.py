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
TSEEK_TIME = "ERR time is not an integer or out of range"
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


def quoted_arg(arg: bytes, limit: int | None = None) -> str:
    """A client's argument as error texts quote it, the same in the server
    and the module (rl_quote in src/module.c): at most `limit` bytes, cut at
    a NUL byte (the module's C strings, and redis-server's own %s, end
    there), invalid UTF-8 replaced as Python's "replace" decoding does, CR
    and LF as spaces (an error reply is one line)."""
    shown = arg[:limit].split(b"\0", 1)[0].decode("utf-8", "replace")
    return shown.replace("\r", " ").replace("\n", " ")


def _key_name(key: bytes) -> str:
    return quoted_arg(key, 128)


def group_not_offset(group: bytes) -> str:
    return f"ERR group key '{_key_name(group)}' does not hold a valid offset (an integer >= 0)"


def tconcat_source_is_destination(key: bytes) -> str:
    return f"ERR source key '{_key_name(key)}' is the destination key"


def tconcat_source_twice(key: bytes) -> str:
    return f"ERR source key '{_key_name(key)}' is given more than once"


def syntax_error(problem: str) -> str:
    """A syntax error that says what is wrong (TWRITE, TREAD)."""
    return f"ERR syntax error, {problem}"


ENTRIES_MISSING = syntax_error("ENTRIES is missing")
NO_ENTRY_AFTER_ENTRIES = syntax_error("no entry after ENTRIES")
BACKLOG_NEEDS_COUNT = syntax_error("BACKLOG needs a count")


def option_twice(option: str) -> str:
    """An option (its canonical upper-case name) given twice."""
    return syntax_error(f"{option} given more than once")


def option_needs_value(option: str) -> str:
    return syntax_error(f"{option} needs a value")


def twrite_unknown_option(option: bytes, entries_follow: bool) -> str:
    """TWRITE met a word that is not an option. When no ENTRIES comes
    after it, the user most likely forgot ENTRIES (TWRITE s BACKLOG 3 a b):
    say so first."""
    unknown = f"unknown option '{quoted_arg(option)}' (expected BACKLOG or ENTRIES)"
    return syntax_error(unknown if entries_follow else f"ENTRIES is missing, {unknown}")


def tread_unknown_option(option: bytes) -> str:
    return syntax_error(f"unknown option '{quoted_arg(option)}'")


def exec_abort_because(reason: str) -> str:
    return f"EXECABORT Transaction discarded because of: {reason}"


def tconcat_too_many(limit: int) -> str:
    return (
        f"ERR TCONCAT would append more than {limit} messages at once; "
        "concatenate fewer sources per call"
    )


# --- the Spark data source (rcp11.spark); raised in Spark, not sent by the server ---
SPARK_PREFIX = "rcp11 data source: "
SPARK_NO_SUBSCRIPTION = (
    SPARK_PREFIX + "say which streams to read: option 'subscribe' (comma-separated stream "
    "keys), 'subscribePattern' (a glob) or .load('a,b')"
)
SPARK_BATCH_STARTING_LATEST = (
    SPARK_PREFIX + "startingOffsets cannot be 'latest' (or -1) in a batch query: it would "
    "read nothing"
)
SPARK_BATCH_ENDING_EARLIEST = (
    SPARK_PREFIX + "endingOffsets cannot be 'earliest' (or -2) in a batch query: it would "
    "read nothing"
)
SPARK_KEY_COLUMN = (
    SPARK_PREFIX + "the DataFrame has a 'key' column, but rcp11 messages have no key; "
    "drop it, or put it into the value (e.g. to_json(struct(key, value)) AS value)"
)
SPARK_NO_TARGET = (
    SPARK_PREFIX + "say which stream to write to: option 'stream' (or 'topic'), "
    ".save('stream'), or a 'stream' (or 'topic') string column"
)
SPARK_OVERWRITE = SPARK_PREFIX + "streams are append-only logs; write with mode('append')"


def spark_unknown_option(name: str, hint: str | None, known: list[str]) -> str:
    guess = f" (did you mean '{hint}'?)" if hint else ""
    return f"{SPARK_PREFIX}unknown option '{name}'{guess}; the options are: {', '.join(known)}"


def spark_bad_option(name: str, value: str, expected: str) -> str:
    return f"{SPARK_PREFIX}option '{name}' must be {expected}, got {value!r}"


def spark_bad_offsets(name: str, value: str) -> str:
    return (
        f"{SPARK_PREFIX}option '{name}' must be 'earliest', 'latest' or a JSON object "
        f'{{"stream": offset}} with offsets >= 0, -2 (earliest) or -1 (latest); got {value!r}'
    )


def spark_streaming_ending(name: str) -> str:
    return (
        f"{SPARK_PREFIX}{name} applies to batch queries only; a streaming query reads "
        "until it is stopped (use Trigger.AvailableNow to stop at what exists)"
    )


def spark_bad_times(name: str, value: str) -> str:
    return (
        f"{SPARK_PREFIX}option '{name}' must be a JSON object {{\"stream\": ms}} with times "
        f"in ms since the epoch (>= 0); got {value!r}"
    )


def spark_no_time_match(name: str, stream: str, ms: int, next_offset: int) -> str:
    return (
        f"{SPARK_PREFIX}{name}: stream {stream!r} has no message appended at or after "
        f"{ms} ms (its next offset is {next_offset}); set "
        "startingOffsetsByTimestampStrategy=latest to start there instead"
    )


def spark_not_a_cluster(address: str) -> str:
    return (
        f"{SPARK_PREFIX}option cluster=true, but the server at {address} is not a Redis "
        "Cluster node (CLUSTER SLOTS answered no slots); use cluster=false or auto"
    )


def spark_no_tseek(address: str, name: str, reply: str) -> str:
    return (
        f"{SPARK_PREFIX}{name} needs the server's TSEEK command, which the server at "
        f"{address} does not have ({reply})"
    )


def spark_offsets_streams(
    name: str, missing: list[str], extra: list[str], hint: str = " (-2 = earliest, -1 = latest)"
) -> str:
    parts = []
    if missing:
        parts.append(f"it does not name {', '.join(map(repr, missing))}")
    if extra:
        parts.append(f"it names {', '.join(map(repr, extra))}, which the query does not read")
    return (
        f"{SPARK_PREFIX}{name} must name every stream the query reads and no other"
        f"{hint}: {'; '.join(parts)}"
    )


def spark_offset_beyond(stream: str, offset: int, next_offset: int) -> str:
    return (
        f"{SPARK_PREFIX}startingOffsets gives stream {stream!r} offset {offset}, beyond its "
        f"next offset {next_offset}"
    )


def spark_option_scope(name: str, side: str, other: str) -> str:
    return f"{SPARK_PREFIX}option '{name}' applies to {other}, not to {side}"


def spark_subscription_conflict(names: list[str]) -> str:
    return f"{SPARK_PREFIX}give only one of subscribe, subscribePattern and load(path); got {names}"


def spark_target_option_conflict(names: list[str]) -> str:
    return f"{SPARK_PREFIX}give only one of stream, topic and save(path); got {names}"


def spark_target_column_conflict(option: str, column: str) -> str:
    return (
        f"{SPARK_PREFIX}both the option '{option}' and a '{column}' column say where rows go; "
        f"drop the column (df.drop('{column}')) or remove the option"
    )


def spark_schema_column(name: str, allowed: str) -> str:
    return f"{SPARK_PREFIX}unknown column {name!r} in the schema; the columns are {allowed}"


def spark_schema_type(name: str, got: str, allowed: list[str]) -> str:
    return f"{SPARK_PREFIX}column {name!r} cannot be {got}; use {' or '.join(allowed)}"


def spark_write_column(name: str, problem: str) -> str:
    return f"{SPARK_PREFIX}column '{name}' {problem}"


def spark_data_loss(stream: str, start: int, end: int | None, why: str) -> str:
    span = f"offsets {start} to {end - 1}" if end is not None else f"offsets from {start} on"
    return (
        f"{SPARK_PREFIX}data loss in stream {stream!r}: {span} are no longer readable "
        f"({why}). Set failOnDataLoss=false to skip them"
    )


def spark_stream_recreated(stream: str, next_offset: int, checkpoint: int) -> str:
    return (
        f"{SPARK_PREFIX}stream {stream!r} was deleted or recreated: its next offset is now "
        f"{next_offset}, below the checkpoint's {checkpoint}; what it held from offset "
        f"{checkpoint} on is lost. Set failOnDataLoss=false to read it again from its earliest"
    )


def spark_stream_deleted(stream: str, checkpoint: int) -> str:
    return (
        f"{SPARK_PREFIX}stream {stream!r} was deleted; what it held from offset {checkpoint} "
        "on is lost. Set failOnDataLoss=false to go on without it"
    )


def spark_invalid_utf8(stream: str, offset: int) -> str:
    return (
        f"{SPARK_PREFIX}the message at offset {offset} of stream {stream!r} is not valid "
        "UTF-8; read value as BINARY and decode it yourself"
    )


def spark_not_a_stream(stream: str) -> str:
    return f"{SPARK_PREFIX}key {stream!r} is not a stream (WRONGTYPE)"


def spark_unreachable(address: str, seconds: float, doing: str, cause: str) -> str:
    return (
        f"{SPARK_PREFIX}cannot reach the server at {address} for {seconds:.1f}s while "
        f"{doing} (retryTimeoutMs); last error: {cause}"
    )


def spark_target_not_a_stream(target: str, kind: str) -> str:
    return f"{SPARK_PREFIX}cannot write to {target!r}: the key holds a {kind}, not a stream"


def spark_commit_too_large(target: str, rows: int, limit: int) -> str:
    return (
        f"{SPARK_PREFIX}a commit moves at most {limit} rows into one stream; this batch has "
        f"{rows} for {target!r}: use smaller batches (maxOffsetsPerTrigger, fewer rows per write)"
    )


def spark_commit_failed(target: str, batch: int, cause: str) -> str:
    return (
        f"{SPARK_PREFIX}the commit of batch {batch} to {target!r} failed ({cause}); nothing "
        "was appended, and running the batch again commits it once"
    )


def spark_staging_lost(stream: str, expected: int, found: int) -> str:
    return (
        f"{SPARK_PREFIX}staging stream {stream!r} holds {found} messages, the task wrote "
        f"{expected}: the server lost data; the batch fails so Spark can run it again"
    )


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


# --- directive values refused (ConfigError.reason: CONFIG SET's reply puts it
# after config_set_failed's prefix, start-up prints it under the FATAL banner)

CONFIG_NOT_MEMORY = "argument must be a memory value"
CONFIG_WRONG_ARGS = "wrong number of arguments"
CONFIG_NOT_BOOL = "argument must be 'yes' or 'no'"
CONFIG_NOT_INTEGER = "argument couldn't be parsed into an integer"
CONFIG_BAD_SAVE = "Invalid save parameters"
CONFIG_OBL_ARGS = "Wrong number of arguments in buffer limit configuration."
CONFIG_OBL_CLASS = "Invalid client class specified in buffer limit configuration."
CONFIG_OBL_VALUES = "Error in hard, soft or soft_seconds setting in buffer limit configuration."
CONFIG_UNKNOWN = "Unknown option"
CONFIG_DUPLICATE = "duplicate parameter"
CONFIG_IMMUTABLE = "can't set immutable config"
CONFIG_PROTECTED = "can't set protected config"
CONFIG_UNBALANCED_QUOTES = "Unbalanced quotes in configuration line"
CONFIG_INCLUDE_DEPTH = "include nested too deeply"
CONFIG_BAD_DIRECTIVE = "Bad directive or wrong number of arguments"
CONFIG_NO_FILE = "The server is running without a config file"


def config_out_of_range(low: int, high: int) -> str:
    return f"argument must be between {low} and {high} inclusive"


def config_not_choice(choices: tuple[str, ...]) -> str:
    return "argument(s) must be one of the following: " + ", ".join(choices)


def config_no_directory(path: str) -> str:
    return f"No such directory: {path}"


def config_same_file(directive: str, path: str, other: str) -> str:
    return f"{directive} ({path}) can't be the same file as {other}"


def config_cant_open(path: str, why: str | None) -> str:
    return f"Fatal error, can't open config file '{path}': {why}"


def config_rewrite_failed(why: str | None) -> str:
    return f"Rewriting config file: {why}"


def config_fatal(version: str, source: str | None, line: int | None, text: str, reason: str) -> str:
    """redis-server's start-up complaint about a directive: the banner, where
    it was read (None: the command line as a whole; "<command line>": one of
    its --name groups; else a file and line), the line as written, why."""
    where = "Reading the configuration"
    if source is None:
        where += ", at the command line"
    elif source == "<command line>":
        where += f" from the command line, at argument group {line}"
    else:
        where += f" file '{source}', at line {line}"
    return f"\n*** FATAL CONFIG FILE ERROR (rcp11 {version}) ***\n{where}\n>>> '{text}'\n{reason}\n"


# --- the data directory's file names (datafiles.py; reasons as above)


def filename_empty(directive: str) -> str:
    return f"{directive} can't be empty"


def filename_is_path(directive: str) -> str:
    return f"{directive} can't be a path, just a filename"


def filename_temp_prefix(directive: str, prefix: str) -> str:
    return f"{directive} can't start with '{prefix}' (the server's temporary files)"


def filename_is_lock(directive: str, lock_name: str) -> str:
    return f"{directive} can't be '{lock_name}' (the data directory's lock file)"


FILENAMES_SAME = "dbfilename and appendfilename can't name the same file"


def filename_offsets_clash(offsets_name: str) -> str:
    return f"dbfilename's offsets file ({offsets_name}) can't be the appendfilename"


def directory_in_use(directory: str, who: str, lock_path: str) -> str:
    return (
        f"the data directory {directory} is in use by another rcp11 server "
        f"({who}, holding {lock_path})"
    )
