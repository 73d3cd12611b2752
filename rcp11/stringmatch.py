"""Redis glob patterns (KEYS, SCAN MATCH, CONFIG GET, COMMAND LIST FILTERBY
PATTERN) with the semantics of Redis's stringmatchlen() and no exponential
or high-polynomial time.

Semantics, as util.c reads a pattern byte by byte:

    *        any run of bytes; consecutive stars are one star
    ?        any one byte
    [abc]    one byte of the set; [^abc] one byte not in it
    [a-z]    a range, its ends swapped when given high to low; a '-' is a
             range marker only with two more bytes after it, so in [a-]
             the range runs from 'a' to ']' and the class goes on
    [\\]]    a backslash escapes the next byte inside a class
    [abc     a class without its ']' runs to the end of the pattern
    \\x      the byte x itself; a lone trailing backslash is itself
    x        the byte x (nocase: ASCII letters either case; escaped class
             members stay case-sensitive, as in util.c)

and one edge: the empty string matches only the empty pattern (util.c's
loop never runs for it, so even "*" does not match ""; KEYS and SCAN skip
matching for the pattern "*" alone).

Every non-star element matches exactly one byte, so a pattern is
fixed-width segments joined by stars. The first segment must sit at the
start, the last at the end, and the ones between are each found leftmost
after the previous one: a leftmost match never leaves less room for what
follows, so there is no need to backtrack into an earlier choice (the
classic single-backtrack glob algorithm). Each segment is a regular
expression of single-byte classes only (no repetition, no alternation),
so searching one costs O(len(key) * len(segment)) and a whole match
O(len(key) * len(pattern)). Patterns with at most one star compile to one
regex with one `.*` (no nested repetition, same bound), so KEYS over many
keys filters at C speed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

_STAR = None  # the star token; every other token is the set of bytes it matches
_ANY = frozenset(range(256))


def _lower(byte: int) -> int:
    # C's tolower() in the "C" locale (Redis never sets LC_CTYPE).
    return byte + 32 if 65 <= byte <= 90 else byte


def _literal(byte: int, nocase: bool) -> frozenset[int]:
    if nocase:
        low = _lower(byte)
        return frozenset(c for c in range(256) if _lower(c) == low)
    return frozenset((byte,))


def _tokens(pattern: bytes, nocase: bool) -> list[frozenset[int] | None]:
    """The pattern as util.c walks it: _STAR or the set of bytes each
    one-byte element accepts."""
    tokens: list[frozenset[int] | None] = []
    n = len(pattern)
    i = 0
    while i < n:
        c = pattern[i]
        if c == 42:  # '*'
            if not tokens or tokens[-1] is not _STAR:
                tokens.append(_STAR)
        elif c == 63:  # '?'
            tokens.append(_ANY)
        elif c == 91:  # '['
            i += 1
            negate = i < n and pattern[i] == 94  # '^'
            if negate:
                i += 1
            members: set[int] = set()
            while True:
                if i < n and pattern[i] == 92 and n - i >= 2:  # '\\' escapes
                    i += 1
                    members.add(pattern[i])  # case-sensitive even with nocase
                elif i < n and pattern[i] == 93:  # ']'
                    break
                elif i >= n:
                    i = n - 1  # unterminated: the class ends with the pattern
                    break
                elif n - i >= 3 and pattern[i + 1] == 45:  # 'x-y'
                    start, end = sorted((pattern[i], pattern[i + 2]))
                    if nocase:
                        start, end = _lower(start), _lower(end)
                        members.update(c for c in range(256) if start <= _lower(c) <= end)
                    else:
                        members.update(range(start, end + 1))
                    i += 2
                else:
                    members.update(_literal(pattern[i], nocase))
                i += 1
            tokens.append(_ANY - members if negate else frozenset(members))
        else:
            if c == 92 and n - i >= 2:  # '\\' escapes the next byte
                i += 1
            tokens.append(_literal(pattern[i], nocase))
        i += 1
    return tokens


def _class(accepted: frozenset[int]) -> bytes:
    """One regex element matching exactly the accepted bytes."""
    if not accepted:
        return rb"(?!)"
    if len(accepted) == 256:
        return rb"."
    if len(accepted) == 1:
        return re.escape(bytes(accepted))
    ranges: list[bytes] = []
    ordered = sorted(accepted)
    low = prev = ordered[0]
    for byte in ordered[1:] + [-1]:
        if byte == prev + 1:
            prev = byte
            continue
        ranges.append(b"\\x%02x" % low if low == prev else b"\\x%02x-\\x%02x" % (low, prev))
        low = prev = byte
    return b"[" + b"".join(ranges) + b"]"


def _segment(tokens: list[frozenset[int]]) -> bytes:
    return b"".join(map(_class, tokens))


class GlobPattern:
    """A compiled pattern: `match(key)` is truthy when key matches;
    `filter(keys)` keeps the matching keys in order.

    With two stars or more, `head`, `middles` and `tail` are the compiled
    fixed-width segments `match` uses (a test counts the calls it makes).
    """

    __slots__ = ("pattern", "match", "head", "tail", "middles", "widths")

    def __init__(self, pattern: bytes, nocase: bool = False) -> None:
        self.pattern = pattern
        segments: list[list[frozenset[int]]] = [[]]
        for token in _tokens(pattern, nocase):
            if token is _STAR:
                segments.append([])
            else:
                segments[-1].append(token)
        flags = re.DOTALL
        self.match: Callable[[bytes], object]
        if not pattern:
            self.match = _is_empty
        elif len(segments) == 1:
            self.match = re.compile(_segment(segments[0]), flags).fullmatch
        elif len(segments) == 2:
            # One star: a single `.*`, and (?=.) for util.c's empty-string edge.
            body = b"(?=.)" + _segment(segments[0]) + b".*" + _segment(segments[1])
            self.match = re.compile(body, flags).fullmatch
        else:
            self.head = re.compile(_segment(segments[0]), flags)
            self.tail = re.compile(_segment(segments[-1]), flags)
            self.middles = [re.compile(_segment(s), flags) for s in segments[1:-1]]
            # (head width, tail width, shortest matching key)
            self.widths = (len(segments[0]), len(segments[-1]), sum(map(len, segments)))
            self.match = self._match_segments

    def _match_segments(self, key: bytes) -> bool:
        head_width, tail_width, shortest = self.widths
        size = len(key)
        # shortest >= 1: stars are merged, so a middle segment is never empty.
        if size < shortest or self.head.match(key) is None:
            return False
        end = size - tail_width
        if self.tail.match(key, end) is None:
            return False
        pos = head_width
        for segment in self.middles:
            found = segment.search(key, pos, end)
            if found is None:
                return False
            pos = found.end()
        return True

    def filter(self, keys: Iterable[bytes]) -> list[bytes]:
        """The keys that match, in order (KEYS, SCAN)."""
        return list(filter(self.match, keys))


def _is_empty(key: bytes) -> bool:
    return not key


def compile_glob(pattern: bytes, nocase: bool = False) -> GlobPattern:
    """Compile once, match many (KEYS over every key)."""
    return GlobPattern(pattern, nocase)


def stringmatch(pattern: bytes, string: bytes, nocase: bool = False) -> bool:
    """Redis's stringmatchlen(pattern, string, nocase) as a yes/no."""
    return bool(GlobPattern(pattern, nocase).match(string))
