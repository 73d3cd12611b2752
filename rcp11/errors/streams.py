"""The stream commands' texts (TWRITE, TREAD, TSEEK, TCONCAT, consumer
groups): rcp11's own commands, so worded here, in the style of Redis's
errors, saying what is wrong and where.
"""

from rcp11.errors.wire import quoted_arg

OFFSET_OVERFLOW = "ERR stream offset would exceed 2^63-1"
TSEEK_TIME = "ERR time is not an integer or out of range"
GROUP_IS_KEY = "ERR the group key must be a different key than the stream key"
GROUP_AND_GROUPNEW = "ERR GROUP and GROUPNEW cannot be used together"
NEGATIVE_COUNT = "ERR count must be >= 0"
NEGATIVE_TIMEOUT = "ERR timeout is negative"
TREAD_OFFSET = "ERR offset is not an integer or out of range"
TREAD_COUNT = "ERR count is not an integer or out of range"
TREAD_TIMEOUT = "ERR timeout is not an integer or out of range"
BACKLOG_COUNT = "ERR BACKLOG count must be an integer >= 0"
# Acknowledged groups (LEASE, TACK, TGROUP).
LEASE_TIME = "ERR LEASE must be an integer from 1 to 2147483647 (milliseconds)"
LEASE_NEEDS_GROUP = "ERR LEASE needs GROUP or GROUPNEW"
NONULLS_LEASE = "ERR NONULLS cannot be used with LEASE"
WITHTIMES_LEASE = "ERR WITHTIMES cannot be used with LEASE"
PACKED_LEASE = "ERR PACKED cannot be used with LEASE"
CONSUMER_NEEDS_LEASE = "ERR CONSUMER needs LEASE"
ACK_NEEDS_LEASE = "ERR ACK needs LEASE"
CONSUMER_TOO_LONG = "ERR consumer name is longer than 256 bytes"
NEGATIVE_OFFSET = "ERR offset must be >= 0"
NO_SUCH_GROUP_KEY = "ERR no such key"
BAD_LEASE_RECORD = "ERR bad RCP11.LEASE arguments"


def _key_name(key: bytes) -> str:
    return quoted_arg(key, 128)


def group_not_offset(group: bytes) -> str:
    return f"ERR group key '{_key_name(group)}' does not hold a valid offset (an integer >= 0)"


def group_is_acknowledged(group: bytes) -> str:
    """A GROUP read without LEASE of an acknowledged group: it would lose
    what it read."""
    return f"ERR group key '{_key_name(group)}' holds an acknowledged group: read it with LEASE"


def group_of_other_stream(group: bytes, stream: bytes) -> str:
    return f"ERR group key '{_key_name(group)}' belongs to stream '{_key_name(stream)}'"


def internal_command(name: str) -> str:
    """A command only the AOF (and, in the Redis module, a primary) sends."""
    return f"ERR {name} is internal: only a primary's replication stream and the AOF may send it"


def tconcat_source_is_destination(key: bytes) -> str:
    return f"ERR source key '{_key_name(key)}' is the destination key"


def tconcat_source_twice(key: bytes) -> str:
    return f"ERR source key '{_key_name(key)}' is given more than once"


def syntax_error(problem: str) -> str:
    """A syntax error that says what is wrong (TWRITE, TREAD)."""
    return f"ERR syntax error, {problem}"


ENTRIES_MISSING = syntax_error("ENTRIES is missing")
NO_ENTRY_AFTER_ENTRIES = syntax_error("no entry after ENTRIES")
ACK_NEEDS_RANGE = syntax_error("ACK needs a start and a count")
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


def tconcat_too_many(limit: int) -> str:
    return (
        f"ERR TCONCAT would append more than {limit} messages at once; "
        "concatenate fewer sources per call"
    )
