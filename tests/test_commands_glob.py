"""Glob patterns (KEYS, SCAN MATCH, CONFIG GET) answer like redis-server's
stringmatchlen(), in time linear in the key for a given pattern (issue 8,
item 2: `KEYS *a*a*a*a*a*a*b` over a 200-byte key ran for minutes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from re import _parser as sre_parser  # the parse tree, to prove segment shapes

import pytest
import redis
from conftest import RedisServer, ServerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rcp11.stringmatch import GlobPattern, compile_glob

# Bytes that mean something in a pattern, and a few that do not, in both cases.
_PATTERN_BYTES = b"*?[]^-\\aAbBzZ]09"
_KEY_BYTES = b"aAbBzZ09-^]\\*?[ "

keys_strategy = st.lists(
    st.binary(max_size=12).map(lambda b: bytes(_KEY_BYTES[x % len(_KEY_BYTES)] for x in b)),
    min_size=1,
    max_size=25,
    unique=True,
)
pattern_strategy = st.binary(min_size=0, max_size=12).map(
    lambda b: bytes(_PATTERN_BYTES[x % len(_PATTERN_BYTES)] for x in b)
)


@pytest.fixture
def both(
    shared_server: ServerProcess, redis_reference: RedisServer
) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    ours = shared_server.client()
    theirs = redis_reference.client()
    yield ours, theirs
    for client in (ours, theirs):
        client.flushall()
        client.close()


def load(clients: tuple[redis.Redis, redis.Redis], keys: list[bytes]) -> None:
    for client in clients:
        client.flushall()
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, b"v")
        pipe.execute()


@pytest.mark.slow
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keys_strategy, st.lists(pattern_strategy, min_size=1, max_size=8))
def test_keys_and_scan_match_answer_like_redis(
    both: tuple[redis.Redis, redis.Redis], keys: list[bytes], patterns: list[bytes]
) -> None:
    load(both, keys + [b""])  # the empty key too: only "" and "*" alone match it
    ours, theirs = both
    for pattern in patterns + [b"*", b"**", b"", b"[", b"[^", b"\\", b"[a-]", b"[\\]]"]:
        expected = sorted(theirs.keys(pattern))
        assert sorted(ours.keys(pattern)) == expected, pattern
        scanned = ours.scan(0, match=pattern, count=10_000)
        assert scanned[0] == 0 and sorted(scanned[1]) == expected, pattern


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(pattern_strategy, min_size=1, max_size=6))
def test_config_get_patterns_ignore_case_like_redis(
    both: tuple[redis.Redis, redis.Redis], patterns: list[bytes]
) -> None:
    ours, theirs = both
    common = set(ours.config_get("*")) & set(theirs.config_get("*"))  # names both know
    for pattern in patterns + [b"MAX*", b"*MEMORY", b"[M]axmemory", b"[^a-z]*", b"ma\\xmemory"]:
        text = pattern.decode()
        expected = set(theirs.config_get(text)) & common
        assert set(ours.config_get(text)) & common == expected, text


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        (b"*", b"anything", True),
        (b"h?llo", b"hello", True),
        (b"h?llo", b"hllo", False),
        (b"h[ae]llo", b"hallo", True),
        (b"h[^e]llo", b"hello", False),
        (b"h[a-c]llo", b"hbllo", True),
        (b"h[c-a]llo", b"hbllo", True),
        (b"h\\*llo", b"h*llo", True),
        (b"h\\*llo", b"hello", False),
        (b"a.c", b"abc", False),
        (b"user:*:name", b"user:42:name", True),
        (b"*", b"", False),
        (b"", b"", True),
        (b"", b"a", False),
        (b"a*", b"a", True),
        (b"*a", b"a", True),
        (b"a**b", b"ab", True),
        (b"[a-]", b"]", True),  # a range from 'a' down to ']'
        (b"[a-]", b"-", False),
        (b"[]a]", b"a", False),  # an empty class matches nothing
        (b"[^]", b"x", True),
        (b"[abc", b"c", True),  # unterminated: the class runs to the end
        (b"[ab*", b"zzz", False),  # the '*' is a class member, not a wildcard
        (b"[\\]]", b"]", True),
        (b"\\*", b"*", True),
        (b"\\*", b"x", False),
        (b"a\\", b"a\\", True),
        (b"[z-a]", b"m", True),
        (b"*a*a*a*a*a*a*b", b"a" * 200, False),
        (b"*a*a*a*a*a*a*b", b"a" * 200 + b"b", True),
        (b"a*b*c*d", b"aXbYcZd", True),
        (b"a*b*c*d", b"aXcYbZd", False),
        (b"*ab*ab*", b"abab", True),
        (b"*ab*ab*", b"aba", False),
    ],
)
def test_redis_pattern_edges(pattern: bytes, key: bytes, matches: bool) -> None:
    assert bool(compile_glob(pattern).match(key)) is matches


def test_nocase_keeps_escaped_class_members_exact() -> None:
    assert compile_glob(b"[\\A]", nocase=True).match(b"A")
    assert not compile_glob(b"[\\A]", nocase=True).match(b"a")
    assert compile_glob(b"[A]", nocase=True).match(b"a")
    assert compile_glob(b"MAX*", nocase=True).match(b"maxmemory")


# -- not exponential: counted, not timed ---------------------------------------------


class CountingSegment:
    """A compiled segment that counts the regex calls made through it."""

    def __init__(self, segment: re.Pattern[bytes], counter: list[int]) -> None:
        self.segment = segment
        self.counter = counter

    def match(self, *args: int | bytes) -> re.Match[bytes] | None:
        self.counter[0] += 1
        return self.segment.match(*args)

    def search(self, *args: int | bytes) -> re.Match[bytes] | None:
        self.counter[0] += 1
        return self.segment.search(*args)


def calls_to_match(glob: GlobPattern, key: bytes) -> tuple[bool, int]:
    counter = [0]
    glob.head = CountingSegment(glob.head, counter)  # type: ignore[assignment]
    glob.tail = CountingSegment(glob.tail, counter)  # type: ignore[assignment]
    glob.middles = [CountingSegment(s, counter) for s in glob.middles]  # type: ignore[misc]
    return bool(glob.match(key)), counter[0]


def repetition_free(segment: re.Pattern[bytes]) -> bool:
    """No repetition, alternation or group: matching it at one position
    looks at each of its bytes once, so a search is O(len(key) * width)."""
    allowed = {"IN", "LITERAL", "ANY", "NOT_LITERAL", "ASSERT_NOT"}
    return all(str(op) in allowed for op, _ in sre_parser.parse(segment.pattern))


@pytest.mark.parametrize(
    "pattern", [b"*a*a*a*a*a*a*b", b"*a?*[ab]*\\**x*a*a*", b"a*" * 30 + b"b", b"*[^a]*" * 20]
)
def test_matching_work_does_not_grow_with_stars_and_length(pattern: bytes) -> None:
    # The regex calls per key are bounded by the number of segments, the same
    # for a 10x longer key, and each call is on a repetition-free segment.
    counts = []
    for size in (200, 2000):
        glob = compile_glob(pattern)
        assert all(map(repetition_free, [glob.head, glob.tail, *glob.middles]))
        matched, calls = calls_to_match(glob, b"a" * size)
        assert not matched
        counts.append(calls)
    assert counts[0] == counts[1] <= len(glob.middles) + 2


def test_single_star_patterns_are_one_regex_with_one_repetition() -> None:
    for pattern in (b"user:*", b"*:name", b"a[bc]*d?", b"*"):
        tree = sre_parser.parse(compile_glob(pattern).match.__self__.pattern)  # type: ignore[attr-defined]
        repeats = [op for op, _ in tree if str(op) in ("MAX_REPEAT", "MIN_REPEAT")]
        assert len(repeats) == 1, pattern


def test_keys_with_many_stars_over_a_long_key_answers(shared_server: ServerProcess) -> None:
    client = shared_server.client(socket_timeout=60)
    client.flushall()
    client.set(b"a" * 200, b"v")
    client.set(b"a" * 2000 + b"b", b"v")
    assert client.keys("*a*a*a*a*a*a*b") == [b"a" * 2000 + b"b"]
    cursor, found = client.scan(0, match="*a*a*a*a*a*a*a*a*a*a*c", count=100)
    assert (cursor, found) == (0, [])
    assert client.ping()
    client.flushall()
