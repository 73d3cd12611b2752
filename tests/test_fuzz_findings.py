"""What the Python fuzzers found, as regression tests (issue 8).

Each reproduction is the smallest input found; the same inputs sit in
fuzz/proto/corpus/raw/finding-* so every fuzzer run replays them first.
They pass once issue 8 items 1 (request elements that are not bulk strings),
2 (KEYS/SCAN glob) and 4 (AOF replay and TTLs) are fixed, and the attribute
line below.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fuzz.proto.harness import Target, parse_every_way
from fuzz.proto.targets import raw

ROOT = Path(__file__).resolve().parent.parent

# A RESP request whose elements are not all bulk strings: redis-server
# answers "-ERR Protocol error: expected '$', got 'X'" and closes.
NOT_BULK = [
    (b"*2\r\n$4\r\nECHO\r\n*1\r\n+\r\n", "*"),  # a nested array
    (b"*2\r\n$4\r\nECHO\r\n+OK\r\n", "+"),  # a status
    (b"*2\r\n$4\r\nECHO\r\n:1\r\n", ":"),  # an integer
    (b"*3\r\n$3\r\nSET\r\n$3\r\nbad\r\n*1\r\n+\r\n", "*"),
    (b"*3\r\n+TWRITE\r\n+k\r\n*2\r\n:65\r\n:66\r\n", "+"),
    # hiredis raised TypeError (unhashable list) for a map keyed by an
    # array, out of the parser and through the connection.
    (b"*2\r\n$4\r\nECHO\r\n%1\r\n*0\r\n:1\r\n", "%"),
    (b"*4\r\n$5\r\nTREAD\r\n$2\r\ng1\r\n%3\r\n>2\r\n", "%"),
    (b"*2\r\n$4\r\nECHO\r\n~1\r\n*0\r\n", "~"),
    (b"*2\r\n$4\r\nECHO\r\n>1\r\n$1\r\na\r\n", ">"),
    (b"*2\r\n$4\r\nECHO\r\n|1\r\n+a\r\n+b\r\n$1\r\na\r\n", "|"),
    (b"*2\r\n$4\r\nECHO\r\n_\r\n", "_"),
    # After an empty inline line the hiredis path took a verbatim string as
    # the argument "a" and then ran the rest of the bytes again as [b"k2"].
    (b"\n*2\r\n=5\r\ntxt:a\r\n$2\r\nk2\r\n", "="),
    (b"\n*2\r\n!1\r\na\r\n$2\r\nk2\r\n", "!"),
    (b"\n*2\r\n(12\r\n$2\r\nk2\r\n", "("),
]


@pytest.mark.parametrize("data, got", NOT_BULK, ids=[d[:40].decode() for d, _ in NOT_BULK])
def test_a_request_element_that_is_not_a_bulk_string_is_a_protocol_error(
    data: bytes, got: str
) -> None:
    # The commands before it run; then the error, however the bytes arrive.
    before = b"*1\r\n$4\r\nPING\r\n"
    commands, error = parse_every_way(before + data)
    assert commands == [[b"PING"]]
    assert error == f"Protocol error: expected '$', got '{got}'"
    raw(before + data)  # and nothing reaches a handler


def test_an_attribute_line_between_requests_is_an_inline_command_not_dropped() -> None:
    # The hiredis path swallowed "|0" (an empty RESP3 attribute) between two
    # requests read at once; read byte by byte it is an inline command, as
    # in redis-server (which answers "unknown command '|0'"). A client that
    # sent three requests must get three replies.
    data = b"*1\r\n$7\r\nDISCARD\r\n|0\r\n*1\r\n$4\r\nPING\r\n"
    commands, error = parse_every_way(data)
    assert commands == [[b"DISCARD"], [b"|0"], [b"PING"]] and error is None


def test_a_key_recreated_after_its_ttl_replays_as_it_was_live() -> None:
    # SET, PEXPIRE, APPEND: live, the key keeps its TTL and expires with it.
    # The AOF replayed after the deadline used to delete the key at its
    # PEXPIREAT and let APPEND recreate it without a TTL, forever.
    target = Target(1)
    target.run(0, [[b"SET", b"k", b"v"], [b"PEXPIRE", b"k", b"2000"], [b"APPEND", b"k", b"x"]])
    target.run(0, [[b"TWRITE", b"s", b"a"], [b"PEXPIRE", b"s", b"2000"], [b"TWRITE", b"s", b"b"]])
    target.finish()  # replays the AOF a day later and compares


def test_an_aof_renaming_a_key_whose_ttl_since_passed_still_loads() -> None:
    # Found by the struct fuzzer: RENAME logged while k2 lived; replayed
    # after its deadline, PEXPIREAT deleted k2 first, RENAME failed ("no
    # such key") and the server refused to start.
    target = Target(1)
    target.run(0, [[b"SET", b"k2", b"v"], [b"PEXPIRE", b"k2", b"22"], [b"RENAME", b"k2", b"k1"]])
    target.run(0, [[b"TWRITE", b"s", b"a"], [b"PEXPIRE", b"s", b"22"], [b"RENAME", b"s", b"t"]])
    target.run(0, [[b"TWRITE", b"t", b"b"]])
    target.finish()


GLOB_PROGRAM = textwrap.dedent(
    """
    from fuzz.proto.harness import Target
    target = Target(1)
    target.run(0, [[b"SET", b"a" * 200, b"v"]])
    for argv in ([b"KEYS", b"*a*a*a*a*a*a*b"], [b"SCAN", b"0", b"MATCH", b"*a*a*a*a*a*a*a*a*b"],
                 [b"KEYS", b"*a*a*a*a*a*a*a*a*a*a*a*a?"], [b"KEYS", b"*[a]*a*[^b]*a*a*a*a*b"]):
        target.run(0, [argv])
    key = b"a" * 200
    assert target.replies[0][1:] == [[], [b"0", []], [key], []], target.replies[0][1:]
    print("ok")
    """
)


@pytest.mark.slow
def test_keys_and_scan_match_are_not_exponential() -> None:
    # KEYS *a*a*a*a*a*a*b on a 200-byte key ran for minutes at 100% CPU and
    # froze every client; redis-server answers at once. A hang is the
    # finding, so the bound is generous (the run takes milliseconds).
    proc = subprocess.run(
        [sys.executable, "-c", GLOB_PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok", proc.stdout
