"""What TWRITE's and TREAD's option errors say (docs/PROTOCOL.md section 2),
byte for byte the same from rcp11-server and the Redis module: the user
most likely got something wrong, and the text says what, whichever server
answers. A refused command changes nothing."""

from __future__ import annotations

import random

import pytest
import redis
from conftest import RedisModuleServer, ServerProcess, error_of

FFFD = "\ufffd".encode()
UNKNOWN_TWRITE = b" (expected BACKLOG or ENTRIES)"

# (arguments after the key, the exact error line)
TWRITE_ERRORS: list[tuple[list[bytes | str], bytes]] = [
    # ENTRIES forgotten: the first word that is no option, and ENTRIES first
    (["BACKLOG", "3", "a", "b"], b"ENTRIES is missing, unknown option 'a'" + UNKNOWN_TWRITE),
    (["BACKLOG", "3", "a"], b"ENTRIES is missing, unknown option 'a'" + UNKNOWN_TWRITE),
    (["a", "b"], b"ENTRIES is missing, unknown option 'a'" + UNKNOWN_TWRITE),
    (["a", "b", "c"], b"ENTRIES is missing, unknown option 'a'" + UNKNOWN_TWRITE),
    (["backlog", "1", "x", "y", "z"], b"ENTRIES is missing, unknown option 'x'" + UNKNOWN_TWRITE),
    (["BACKLOG", "3"], b"ENTRIES is missing"),
    # an unknown option before ENTRIES (any case) is only unknown
    (["MAXLEN", "1", "ENTRIES", "x"], b"unknown option 'MAXLEN'" + UNKNOWN_TWRITE),
    (["x", "entries", "y"], b"unknown option 'x'" + UNKNOWN_TWRITE),
    (["x", "ENTRIES"], b"unknown option 'x'" + UNKNOWN_TWRITE),
    (["BACKLOG", "1", "BACKLOG", "2", "ENTRIES", "a"], b"BACKLOG given more than once"),
    (["BACKLOG", "1", "ENTRIES"], b"no entry after ENTRIES"),
    # the word quoted: invalid UTF-8 as U+FFFD (one per maximal invalid
    # subpart), CR/LF as spaces, a NUL byte ends it
    (
        [b"\xff\xfe", "x"],
        b"ENTRIES is missing, unknown option '" + FFFD * 2 + b"'" + UNKNOWN_TWRITE,
    ),
    ([b"\xe2\x82", "x"], b"ENTRIES is missing, unknown option '" + FFFD + b"'" + UNKNOWN_TWRITE),
    (
        [b"\xed\xa0\x80", "x"],
        b"ENTRIES is missing, unknown option '" + FFFD * 3 + b"'" + UNKNOWN_TWRITE,
    ),
    ([b"\xc0\xaf", "ENTRIES", "x"], b"unknown option '" + FFFD * 2 + b"'" + UNKNOWN_TWRITE),
    (
        [b"\xf4\x90\x80\x80", "x"],
        b"ENTRIES is missing, unknown option '" + FFFD * 4 + b"'" + UNKNOWN_TWRITE,
    ),
    (
        [b"\xe2\x82\xac\r\n", "x"],
        b"ENTRIES is missing, unknown option '\xe2\x82\xac  '" + UNKNOWN_TWRITE,
    ),
    ([b"a\x00b", "x"], b"ENTRIES is missing, unknown option 'a'" + UNKNOWN_TWRITE),
]
TWRITE_ERRORS = [(args, b"-ERR syntax error, " + line) for args, line in TWRITE_ERRORS] + [
    (["BACKLOG", "x", "ENTRIES", "a"], b"-ERR BACKLOG count must be an integer >= 0"),
    (["BACKLOG", "-1", "ENTRIES", "a"], b"-ERR BACKLOG count must be an integer >= 0"),
    (
        ["BACKLOG", "99999999999999999999", "ENTRIES", "a"],
        b"-ERR BACKLOG count must be an integer >= 0",
    ),
]

# (arguments after TREAD s, the exact error line)
TREAD_ERRORS: list[tuple[list[bytes | str], bytes]] = [
    (["0", "1", "FOO"], b"-ERR syntax error, unknown option 'FOO'"),
    (["0", "1", "WITHINFO", "foo"], b"-ERR syntax error, unknown option 'foo'"),
    (["0", "1", "FOO", "BLOCK"], b"-ERR syntax error, unknown option 'FOO'"),
    (["0", "1", b"\xe2\x82"], b"-ERR syntax error, unknown option '" + FFFD + b"'"),
    (["0", "1", b"a\r\nb"], b"-ERR syntax error, unknown option 'a  b'"),
    (["0", "1", b"a\x00b"], b"-ERR syntax error, unknown option 'a'"),
    (["0", "1", "WITHINFO", "withinfo"], b"-ERR syntax error, WITHINFO given more than once"),
    (["0", "1", "BLOCK", "1", "block", "2"], b"-ERR syntax error, BLOCK given more than once"),
    (["0", "1", "GROUP", "g", "GROUP", "h"], b"-ERR syntax error, GROUP given more than once"),
    (["0", "1", "block"], b"-ERR syntax error, BLOCK needs a value"),
    (["0", "1", "GROUP"], b"-ERR syntax error, GROUP needs a value"),
    (["0", "1", "BLOCK", "1", "GROUPNEW"], b"-ERR syntax error, GROUPNEW needs a value"),
    (["0", "1", "BLOCK", "x"], b"-ERR timeout is not an integer or out of range"),
    (["0", "1", "BLOCK", "1.5"], b"-ERR timeout is not an integer or out of range"),
    (["0", "1", "BLOCK", "-1"], b"-ERR timeout is negative"),
    (["0", "1", "GROUP", "g", "GROUPNEW", "h"], b"-ERR GROUP and GROUPNEW cannot be used together"),
    (["0", "1", "GROUP", "s"], b"-ERR the group key must be a different key than the stream key"),
    (["x", "1"], b"-ERR offset is not an integer or out of range"),
    (["0", "x"], b"-ERR count is not an integer or out of range"),
    (["0", "-1"], b"-ERR count must be >= 0"),
]


def _id(args: list[bytes | str]) -> str:
    return " ".join(a if isinstance(a, str) else repr(a) for a in args)


@pytest.mark.parametrize(("args", "line"), TWRITE_ERRORS, ids=[_id(a) for a, _ in TWRITE_ERRORS])
def test_twrite_option_errors(
    stream_server: ServerProcess, stream_client: redis.Redis, args: list[bytes], line: bytes
) -> None:
    assert stream_server.command_bytes("TWRITE", "s", *args) == line + b"\r\n"
    assert stream_client.exists("s") == 0


@pytest.mark.parametrize(("args", "line"), TREAD_ERRORS, ids=[_id(a) for a, _ in TREAD_ERRORS])
def test_tread_option_errors(
    stream_server: ServerProcess, stream_client: redis.Redis, args: list[bytes], line: bytes
) -> None:
    stream_client.execute_command("TWRITE", "s", "m")
    assert stream_server.command_bytes("TREAD", "s", *args) == line + b"\r\n"
    # Nothing read for a group, no group key made, the stream as it was.
    assert stream_client.keys("*") == [b"s"]
    assert stream_client.execute_command("TREAD", "s", 0, 5) == [b"m"]


def test_keys_in_errors_are_quoted_like_options(stream_client: redis.Redis) -> None:
    """The same quoting names keys: TCONCAT's sources, a group key that
    holds no offset (at most 128 bytes of them)."""
    assert error_of(stream_client, "TCONCAT", "d", b"a\x00x", b"a\x00x") == (
        "source key 'a' is given more than once"
    )
    assert error_of(stream_client, "TCONCAT", "d", b"\xe2\x82", b"\xe2\x82") == (
        "source key '\ufffd' is given more than once"
    )
    stream_client.set(b"g\x00h", "not an offset")
    assert error_of(stream_client, "TREAD", "s", 0, 1, "GROUP", b"g\x00h") == (
        "group key 'g' does not hold a valid offset (an integer >= 0)"
    )
    long_key = b"k" * 127 + "\u20ac".encode()  # the 128-byte cut splits the euro sign
    stream_client.set(long_key, "x")
    assert error_of(stream_client, "TREAD", "s", 0, 1, "GROUP", long_key) == (
        "group key '" + "k" * 127 + "\ufffd' does not hold a valid offset (an integer >= 0)"
    )


def test_both_servers_quote_any_bytes_alike(
    shared_server: ServerProcess, msrv: RedisModuleServer
) -> None:
    """Random words of the bytes UTF-8 decoding turns on (leads, continuation
    ranges, CR, LF, NUL) as an unknown TWRITE option: rcp11-server and the
    module answer the same bytes."""
    edges = [0x00, 0x0A, 0x0D, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2]
    edges += [0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
    rng = random.Random(11)
    words = [bytes(rng.choice(edges) for _ in range(rng.randint(1, 8))) for _ in range(300)]
    with shared_server.raw() as ours, msrv.raw() as module:
        for word in words:
            assert ours.call("TWRITE", "s", word, "x") == module.call("TWRITE", "s", word, "x"), (
                word
            )


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        (["a", "b", "a", "d"], "source key 'a' is given more than once"),
        (["a", "d", "b", "a"], "source key 'd' is the destination key"),
        (["b", "a", "c", "a", "b"], "source key 'a' is given more than once"),
        (["a", "b", "c", "b", "d", "a"], "source key 'b' is given more than once"),
    ],
)
def test_tconcat_names_the_first_bad_source_in_argument_order(
    stream_client: redis.Redis, sources: list[str], message: str
) -> None:
    """Both servers name the first source, in argument order, that is the
    destination or repeats an earlier one (the module sorts its sources to
    find them: checking them pairwise, 100k sources took 48 s)."""
    assert error_of(stream_client, "TCONCAT", "d", *sources) == message


def test_tconcat_of_many_sources_with_a_repeat_at_the_end(stream_client: redis.Redis) -> None:
    sources = [f"s{n}" for n in range(20_000)]
    assert error_of(stream_client, "TCONCAT", "d", *sources, "s7") == (
        "source key 's7' is given more than once"
    )
