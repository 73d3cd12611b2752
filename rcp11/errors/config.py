"""The configuration's texts: CONFIG SET's replies, why a directive value
is refused (ConfigError.reason: CONFIG SET's reply puts it after
config_set_failed's prefix, start-up prints it under config_fatal's
banner), and what the start-up, the listeners and the data directory say
when they cannot do what the configuration asks. Redis 7's wording where
redis-server has the same check.
"""

# --- CONFIG SET's replies


def config_set_unknown(name: str) -> str:
    return f"ERR Unknown option or number of arguments for CONFIG SET - '{name}'"


def config_set_failed(name: str, reason: str) -> str:
    return f"ERR CONFIG SET failed (possibly related to argument '{name}') - {reason}"


# --- CONFIG SET reasons (ConfigError; the reply is config_set_failed)

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


# --- start-up refusals (server/listeners.py) and the data directory's file
# names (datafiles.py; reasons as above)

PORT_ZERO_UNREACHABLE = (
    "port 0 would leave the server unreachable: neither unixsocket nor tls-port is configured"
)


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
