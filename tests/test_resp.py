"""rcp11.resp: reply encoding for both protocols and the request parser
(fed whole, split at every byte, and one byte at a time)."""

from __future__ import annotations

from collections.abc import Callable

import hiredis
import pytest
from conftest import mbulk
from hypothesis import given
from hypothesis import strategies as st

from rcp11.errors import ProtocolError
from rcp11.resp import (
    NULL_ARRAY,
    OK,
    Error,
    Push,
    QueryBufferLimitError,
    Raw,
    RequestParser,
    SimpleString,
    Verbatim,
    encode,
    split_args,
)

# -- encoding ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "resp2", "resp3"),
    [
        (None, b"$-1\r\n", b"_\r\n"),
        (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
        (0, b":0\r\n", b":0\r\n"),
        (-(2**63), b":-9223372036854775808\r\n", b":-9223372036854775808\r\n"),
        (True, b":1\r\n", b"#t\r\n"),
        (False, b":0\r\n", b"#f\r\n"),
        (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
        (b"a\r\nb", b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
        ("h\u00e9", b"$3\r\nh\xc3\xa9\r\n", b"$3\r\nh\xc3\xa9\r\n"),
        (OK, b"+OK\r\n", b"+OK\r\n"),
        (Error("ERR bad\r\nthing"), b"-ERR bad  thing\r\n", b"-ERR bad  thing\r\n"),
        (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
        (float("inf"), b"$3\r\ninf\r\n", b",inf\r\n"),
        (float("-inf"), b"$4\r\n-inf\r\n", b",-inf\r\n"),
        (float("nan"), b"$3\r\nnan\r\n", b",nan\r\n"),
        ([], b"*0\r\n", b"*0\r\n"),
        (
            [1, [b"x", None]],
            b"*2\r\n:1\r\n*2\r\n$1\r\nx\r\n$-1\r\n",
            b"*2\r\n:1\r\n*2\r\n$1\r\nx\r\n_\r\n",
        ),
        ((b"a",), b"*1\r\n$1\r\na\r\n", b"*1\r\n$1\r\na\r\n"),
        ({b"k": 1}, b"*2\r\n$1\r\nk\r\n:1\r\n", b"%1\r\n$1\r\nk\r\n:1\r\n"),
        ({7}, b"*1\r\n:7\r\n", b"~1\r\n:7\r\n"),
        (Verbatim("txt", "hi"), b"$2\r\nhi\r\n", b"=6\r\ntxt:hi\r\n"),
        (Push([b"message", 1]), b"*2\r\n$7\r\nmessage\r\n:1\r\n", b">2\r\n$7\r\nmessage\r\n:1\r\n"),
        (Raw(b"*1\r\n:5\r\n"), b"*1\r\n:5\r\n", b"*1\r\n:5\r\n"),
        ([Raw(b":5\r\n"), OK], b"*2\r\n:5\r\n+OK\r\n", b"*2\r\n:5\r\n+OK\r\n"),
    ],
)
def test_encode(reply: object, resp2: bytes, resp3: bytes) -> None:
    assert encode(reply, False) == resp2
    assert encode(reply, True) == resp3


def test_encoded_replies_read_back_with_hiredis() -> None:
    reply = [b"a", 1, [b"b", [2, None]], {b"k": [b"v"]}, OK, -5]
    for resp3 in (False, True):
        reader = hiredis.Reader()
        reader.feed(encode(reply, resp3))
        parsed = reader.gets()
        assert parsed[:3] == [b"a", 1, [b"b", [2, None]]]
        assert parsed[4:] == [b"OK", -5]
        assert parsed[3] == ({b"k": [b"v"]} if resp3 else [b"k", [b"v"]])


def test_encode_refuses_unknown_types() -> None:
    with pytest.raises(TypeError):
        encode(object(), False)


def test_error_without_code_gets_no_extra_dash() -> None:
    assert encode(Error("-ERR x"), False) == b"-ERR x\r\n"


# -- parsing helpers -------------------------------------------------------------


def parse_all(chunks: list[bytes], **limits: int) -> list[list[bytes]]:
    parser = RequestParser(**limits)
    commands = []
    for chunk in chunks:
        parser.feed(chunk)
        while (argv := parser.gets()) is not None:
            commands.append(argv)
    return commands


def take_all(chunks: list[bytes], **limits: int) -> list[list[bytes]]:
    """What the server does with each read: take() it, then drain() the rest."""
    parser = RequestParser(**limits)
    commands = []
    for chunk in chunks:
        commands += parser.take(chunk)
        while batch := parser.drain():
            commands += batch
    return commands


# Both ways into the parser must agree on every input.
PARSERS = pytest.mark.parametrize("parse", [parse_all, take_all], ids=["gets", "take"])


def every_split(data: bytes) -> list[list[bytes]]:
    """The data whole, split in two at every byte, and one byte at a time."""
    ways = [[data], [data[i : i + 1] for i in range(len(data))]]
    ways += [[data[:i], data[i:]] for i in range(1, len(data))]
    return ways


STREAM = (
    mbulk(b"TWRITE", b"s", b"hello")
    + mbulk(b"SET", b"k", b"\r\n\x00binary")
    + b"PING\r\n"
    + b"\r\n"  # empty inline line: ignored
    + b"*0\r\n"  # empty array: ignored
    + b"*-1\r\n"  # negative count: ignored, as Redis does
    + b"ECHO \"two words\" 'it\\'s'\n"
    + mbulk(b"GET", b"")
)
EXPECTED = [
    [b"TWRITE", b"s", b"hello"],
    [b"SET", b"k", b"\r\n\x00binary"],
    [b"PING"],
    [b"ECHO", b"two words", b"it's"],
    [b"GET", b""],
]


@PARSERS
def test_parse_every_split(parse: Callable[..., list[list[bytes]]]) -> None:
    for chunks in every_split(STREAM):
        assert parse(chunks) == EXPECTED, chunks


def test_parse_returns_bytes_objects() -> None:
    for argv in parse_all([STREAM]):
        assert all(type(arg) is bytes for arg in argv)


@PARSERS
def test_empty_requests_between_commands_are_skipped(
    parse: Callable[..., list[list[bytes]]],
) -> None:
    data = mbulk(b"PING") + b"*0\r\n" + mbulk(b"ECHO", b"x" * 200) + b"*0\r\n"
    assert parse([data]) == [[b"PING"], [b"ECHO", b"x" * 200]]
    assert parse([b"*0\r\n"]) == []


@pytest.mark.slow
@PARSERS
def test_parse_long_pipeline(parse: Callable[..., list[list[bytes]]]) -> None:
    commands = [[b"TWRITE", b"key%d" % i, b"x" * (i % 50)] for i in range(5000)]
    data = b"".join(mbulk(*argv) for argv in commands)
    assert parse([data]) == commands
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    assert parse(chunks) == commands


def test_parse_big_argument_arrives_in_pieces() -> None:
    payload = bytes(range(256)) * 4000
    data = mbulk(b"TWRITE", b"s", payload)
    chunks = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    assert parse_all(chunks) == [[b"TWRITE", b"s", payload]]


def test_parse_many_arguments() -> None:
    args = [b"TWRITE", b"s", b"ENTRIES"] + [b"m%d" % i for i in range(20000)]
    assert parse_all([mbulk(*args)]) == [args]


@given(st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=6), max_size=20), st.data())
def test_parse_any_split_of_any_commands(commands: list[list[bytes]], data: st.DataObject) -> None:
    raw = b"".join(mbulk(*argv) for argv in commands)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert parse_all(chunks) == commands
    assert take_all(chunks) == commands


# -- inline ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "args"),
    [
        (b"set a b", [b"set", b"a", b"b"]),
        (b"  set \t a   b  ", [b"set", b"a", b"b"]),
        (b'set "a b" c', [b"set", b"a b", b"c"]),
        (b'set "\\x41\\x4a\\n\\r\\t\\b\\a\\"\\\\\\z"', [b"set", b'AJ\n\r\t\b\a"\\z']),
        (b'set "\\x4g"', [b"set", b"x4g"]),
        (b"set 'a \\' b' \"\"", [b"set", b"a ' b", b""]),
        (b"set 'a\\nb'", [b"set", b"a\\nb"]),
        (b'set a"b c"d', None),  # closing quote must end the word
        (b'set a"b c" d', [b"set", b"ab c", b"d"]),
        (b"", []),
    ],
)
def test_split_args(line: bytes, args: list[bytes] | None) -> None:
    assert split_args(line) == args


@pytest.mark.parametrize("line", [b'set "abc', b"set 'abc", b"set 'a'b", b'set "a"b'])
def test_split_args_unbalanced(line: bytes) -> None:
    assert split_args(line) is None


def test_inline_with_crlf_and_lf() -> None:
    assert parse_all([b"PING\r\nPING\nECHO x\r\n"]) == [[b"PING"], [b"PING"], [b"ECHO", b"x"]]


def test_inline_after_multibulk_and_back() -> None:
    data = mbulk(b"A") + b"B c\r\n" + mbulk(b"D", b"e") + b"F\n"
    for chunks in every_split(data):
        assert parse_all(chunks) == [[b"A"], [b"B", b"c"], [b"D", b"e"], [b"F"]]


# -- protocol errors ---------------------------------------------------------------

BAD = [
    (b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n", "Protocol error: expected '$', got 'f'"),
    (b"*1\r\n+PING\r\n", "Protocol error: expected '$', got '+'"),
    (b"*1\r\n:1\r\n", "Protocol error: expected '$', got ':'"),
    (b"*1\r\n*1\r\n$1\r\na\r\n", "Protocol error: expected '$', got '*'"),
    (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$abc\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$03\r\nabc\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$+3\r\nabc\r\n", "Protocol error: invalid bulk length"),
    (b"*3000000000\r\n", "Protocol error: invalid multibulk length"),
    (b"*x\r\n", "Protocol error: invalid multibulk length"),
    (b'SET "unterminated\r\n', "Protocol error: unbalanced quotes in request"),
]


@pytest.mark.parametrize(("data", "message"), BAD)
@PARSERS
def test_protocol_errors(
    data: bytes, message: str, parse: Callable[..., list[list[bytes]]]
) -> None:
    for chunks in every_split(data):
        with pytest.raises(ProtocolError) as info:
            parse(chunks)
        assert info.value.message == message


@pytest.mark.parametrize(("data", "message"), BAD)
def test_protocol_errors_behind_a_long_pipeline(data: bytes, message: str) -> None:
    # Enough valid input ahead that hiredis parses the batch: what it accepts
    # but Redis would not must still end in Redis's error.
    prefix = b"".join(mbulk(b"ECHO", b"x" * 50) for _ in range(10))
    parser = RequestParser()
    parser.feed(prefix + data)
    for _ in range(10):
        assert parser.gets() == [b"ECHO", b"x" * 50]
    with pytest.raises(ProtocolError) as info:
        parser.gets()
    assert info.value.message == message


def test_commands_before_an_error_are_returned_first() -> None:
    parser = RequestParser()
    parser.feed(mbulk(b"PING") + b"PING\r\n" + b"*1\r\n:1\r\n" + mbulk(b"NEVER"))
    assert parser.gets() == [b"PING"]
    assert parser.gets() == [b"PING"]
    with pytest.raises(ProtocolError):
        parser.gets()
    with pytest.raises(ProtocolError):  # the parser stays failed
        parser.gets()


def test_inline_too_long() -> None:
    with pytest.raises(ProtocolError, match="too big inline request"):
        parse_all([b"a" * (64 * 1024 + 1)])
    # just under the limit without a newline is still waiting, not an error
    assert parse_all([b"a" * (64 * 1024)]) == []


def test_count_lines_too_long() -> None:
    with pytest.raises(ProtocolError, match="too big mbulk count string"):
        parse_all([b"*" + b"1" * (64 * 1024 + 1)])
    with pytest.raises(ProtocolError, match="too big bulk count string"):
        parse_all([b"*1\r\n$" + b"1" * (64 * 1024 + 1)])


# -- limits -------------------------------------------------------------------------


def test_bulk_length_limit_is_checked_on_the_header() -> None:
    # Only the header has arrived: refused before any payload is buffered.
    with pytest.raises(ProtocolError, match="invalid bulk length"):
        parse_all([b"*2\r\n$4\r\nECHO\r\n$1001\r\n"], max_bulk_len=1000)
    payload = b"x" * 1000
    assert parse_all([mbulk(b"ECHO", payload)], max_bulk_len=1000) == [[b"ECHO", payload]]


def test_bulk_length_limit_on_complete_commands() -> None:
    data = mbulk(b"ECHO", b"x" * 1001)
    for chunks in ([data], [data[:10], data[10:]]):
        with pytest.raises(ProtocolError, match="invalid bulk length"):
            parse_all(chunks, max_bulk_len=1000)


def test_multibulk_length_limit() -> None:
    with pytest.raises(ProtocolError, match="invalid multibulk length"):
        parse_all([b"*11\r\n"], max_multibulk_len=10)
    assert parse_all([mbulk(*[b"a"] * 10)], max_multibulk_len=10) == [[b"a"] * 10]


@pytest.mark.slow
def test_query_buffer_limit() -> None:
    parser = RequestParser(query_buffer_limit=1000)
    parser.feed(b"*2\r\n$4\r\nECHO\r\n$5000\r\n")
    assert parser.gets() is None
    with pytest.raises(QueryBufferLimitError):
        parser.feed(b"x" * 1000)


def test_query_buffer_counts_only_unparsed_bytes() -> None:
    parser = RequestParser(query_buffer_limit=1000)
    for _ in range(100):
        parser.feed(mbulk(b"ECHO", b"x" * 100))
        assert parser.gets() == [b"ECHO", b"x" * 100]
    assert parser.buffered() == 0


def test_unauthenticated_limits() -> None:
    parser = RequestParser()
    parser.unauthenticated = True
    parser.feed(b"*11\r\n")
    with pytest.raises(ProtocolError, match="unauthenticated multibulk length"):
        parser.gets()
    parser = RequestParser()
    parser.unauthenticated = True
    parser.feed(b"*2\r\n$4\r\nAUTH\r\n$16385\r\n")
    with pytest.raises(ProtocolError, match="unauthenticated bulk length"):
        parser.gets()
    parser = RequestParser()
    parser.unauthenticated = True
    parser.feed(mbulk(b"AUTH", b"secret"))
    assert parser.gets() == [b"AUTH", b"secret"]


def test_simple_string_subclass_is_a_str() -> None:
    # Handlers may return SimpleString where str is expected; it must still
    # encode as a status, not a bulk string.
    assert isinstance(SimpleString("OK"), str)
    assert encode([SimpleString("QUEUED")], False) == b"*1\r\n+QUEUED\r\n"


@PARSERS
def test_huge_counts_never_reach_hiredis_preallocation(
    parse: Callable[..., list[list[bytes]]],
) -> None:
    # hiredis would allocate a list of the announced size at once; these must
    # be refused or waited on without that (this test would take minutes and
    # gigabytes otherwise).
    with pytest.raises(ProtocolError, match="expected '\\$', got '\\*'"):
        parse([mbulk(b"PING") + b"*1\r\n*2000000000\r\n"])
    with pytest.raises(ProtocolError, match="expected '\\$', got '%'"):
        parse([b"*2\r\n$1\r\na\r\n%2000000000\r\n"])
    big = b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n*1999999999\r\n" + b"x" * 4000
    with pytest.raises(ProtocolError, match="expected '\\$', got '\\*'"):
        parse([big])
    parser = RequestParser()
    parser.feed(mbulk(b"PING") + b"*2000000000\r\n$4\r\nECHO\r\n")
    assert parser.gets() == [b"PING"]
    assert parser.gets() is None


@PARSERS
def test_payload_that_looks_like_a_huge_header(parse: Callable[..., list[list[bytes]]]) -> None:
    payload = b"line\n*1234567\r\nmore\n%9999999"
    commands = [[b"TWRITE", b"s", payload], [b"PING"], [b"ECHO", payload]]
    data = b"".join(mbulk(*argv) for argv in commands)
    for chunks in every_split(data):
        assert parse(chunks) == commands
    # Past the size where finds replace the regex, and past the '*' probes.
    stars = b"\n*" * 20 + b"\n*12345678\r\n" + b"y" * 2000
    commands = [[b"TWRITE", b"s", stars]] * 3
    assert parse([b"".join(mbulk(*argv) for argv in commands)]) == commands


def test_drain_and_push_back() -> None:
    parser = RequestParser()
    parser.feed(mbulk(b"A") + mbulk(b"B") + b"C\r\n" + mbulk(b"D"))
    commands = parser.drain()
    assert commands == [[b"A"], [b"B"], [b"C"], [b"D"]]
    parser.push_back(commands[2:])
    parser.feed(mbulk(b"E"))
    assert parser.drain() == [[b"C"], [b"D"]]
    assert parser.drain() == [[b"E"]]
    assert parser.drain() == []


def test_drain_returns_commands_then_the_error() -> None:
    parser = RequestParser()
    parser.feed(mbulk(b"A") + b"*1\r\n:1\r\n")
    assert parser.drain() == [[b"A"]]
    with pytest.raises(ProtocolError):
        parser.drain()


def test_unauthenticated_parses_one_command_at_a_time() -> None:
    # After AUTH succeeds, the next command is parsed with the normal limits,
    # even when it arrived in the same read.
    parser = RequestParser()
    parser.unauthenticated = True
    parser.feed(mbulk(b"AUTH", b"pw") + mbulk(*[b"x"] * 20))
    assert parser.drain() == [[b"AUTH", b"pw"]]
    parser.unauthenticated = False
    assert parser.drain() == [[b"x"] * 20]
