"""Where requests end in a client's raw buffer: the sizes of bulk
arguments and array headers, and the scans that find a command hiredis
parsed, or a header too large for the fast path, without parsing twice."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import Any

from rcp11.limits import (
    INT64_MAX,
    INT64_MIN,
)


def line_end(buf: bytes, pos: int, char: bytes) -> int:
    """Where the next `char` is, as C's strchr() finds it in Redis's query
    buffer: a NUL byte ends the search, so a line holding one is not a line
    yet (Redis waits for more, up to its 64 KB line limit). -1: not found."""
    found = buf.find(char, pos)
    if found > pos and buf.find(b"\0", pos, found) >= 0:
        return -1
    return found


def parse_int(data: bytes) -> int | None:
    # Redis's string2ll: optional '-', digits, no '+', no spaces, no leading
    # zeros (except "0" itself), fits in a signed 64-bit integer.
    if not data or len(data) > 20:
        return None
    digits = data[1:] if data[:1] == b"-" else data
    if not digits.isdigit() or (len(digits) > 1 and digits[:1] == b"0"):
        return None
    value = int(data)
    if not INT64_MIN <= value <= INT64_MAX:
        return None
    return value


# Encoded size of one bulk argument ("$<len>\r\n<data>\r\n") by payload
# length, and of an array header by argument count: the fast path uses them
# to find where the commands hiredis parsed end in the raw buffer.
_BULK_SIZES = [len(b"$%d\r\n" % n) + n + 2 for n in range(1 << 14)]
_ARRAY_HEADER_SIZES = [len(b"*%d\r\n" % n) for n in range(1 << 14)]
# '*' characters huge_header() checks one by one before it hands the rest
# of the buffer to the regex (a pipeline holds one per command).
_STAR_PROBES = 8
# Below this many bytes one regex scan costs less than the finds.
_HUGE_REGEX_BELOW = 1024
# Commands of up to 99999 arguments take the hiredis path.
FAST_MAX_COUNT_DIGITS = 5
_HUGE_AGGREGATE = re.compile(rb"\n[*%%~>|]\d{%d}" % (FAST_MAX_COUNT_DIGITS + 1))


def huge_header(buf: bytes, start: int, size: int) -> int:
    """Where the parse must stop so that no aggregate header after start
    announcing a huge count reaches hiredis: the header's position, or size.

    memchr-speed finds for the usual case (a few '*' headers, none of the
    RESP3 aggregate types); the regex for anything else.
    """
    if size - start < _HUGE_REGEX_BELOW:
        return _huge_regex_cut(buf, start, size)
    find = buf.find
    if (
        find(b"%", start, size) >= 0
        or find(b"~", start, size) >= 0
        or find(b">", start, size) >= 0
        or find(b"|", start, size) >= 0
    ):
        return _huge_regex_cut(buf, start, size)
    star = find(b"*", start, size)
    for _ in range(_STAR_PROBES):
        if star < 0:
            return size
        if buf[star - 1] == 10 and find(b"\r", star, star + FAST_MAX_COUNT_DIGITS + 2) < 0:
            return star
        star = find(b"*", star + 1, size)
    return _huge_regex_cut(buf, star, size) if star >= 0 else size


def _huge_regex_cut(buf: bytes, start: int, size: int) -> int:
    huge = _HUGE_AGGREGATE.search(buf, start - 1, size)
    return size if huge is None else huge.start() + 1


def bulk_size_of(length: int) -> int:
    if length < 16384:
        return _BULK_SIZES[length]
    return len(b"$%d\r\n" % length) + length + 2


def array_header_size_of(count: int) -> int:
    if count < 16384:
        return _ARRAY_HEADER_SIZES[count]
    return len(b"*%d\r\n" % count)


# Up to this many arguments a single command is checked in a Python loop.
_LOOP_MAX_ARGS = 8


def framed_end(
    buf: bytes,
    pos: int,
    commands: list[Any],
    bulk_size: Callable[[int], int] = _BULK_SIZES.__getitem__,
    header_size: Callable[[int], int] = _ARRAY_HEADER_SIZES.__getitem__,
) -> int:
    """Where `commands`, as hiredis parsed them from buf[pos:], end if they
    were sent as plain arrays of bulk strings; -1 when they were not.

    hiredis reads any RESP value, and several are bytes too (+status,
    (bignum, =verbatim), so sizes alone can add up by accident. But hiredis
    accepts only canonical `*<n>` and `$<n>` headers, so an element it read
    as a bulk string occupies exactly its canonical size. Hence the check:
    the byte at every start computed from those sizes must be '*' (a
    command) or '$' (an argument). Element by element, each start is then
    the true one and each element a bulk string. All in C loops (map,
    accumulate, itemgetter); pipelines of commands with one argument count
    (the usual case) skip the per-command iterators.

    Raises TypeError for an element without a length (an integer, None),
    IndexError for sizes the default tables do not hold (16 KB or more);
    the caller then lets a slower path judge.
    """
    if len(commands) == 1 and len(commands[0]) <= _LOOP_MAX_ARGS:
        # One small command (a client waiting for each reply): a plain loop
        # costs less than setting up the iterators.
        argv = commands[0]
        at = pos + header_size(len(argv))
        for arg in argv:
            if at >= len(buf) or buf[at] != 36:  # '$'
                return -1
            at += bulk_size(len(arg))
        return at if at <= len(buf) and buf[pos] == 42 else -1
    counts = list(map(len, commands))
    n = len(counts)
    width = counts[0]
    if counts.count(width) == n:
        # zip() pulls `width` argument sizes after each command's header size.
        arg_sizes = map(bulk_size, map(len, chain.from_iterable(commands)))
        sizes = chain.from_iterable(
            zip(repeat(header_size(width), n), *[arg_sizes] * width, strict=False)
        )
        expected = (b"*" + b"$" * width) * n
    else:
        sizes = chain.from_iterable(
            map(
                chain,
                zip(map(header_size, counts)),
                map(partial(map, bulk_size), map(partial(map, len), commands)),
            )
        )
        expected = b"".join(map(b"*".__add__, map(b"$".__mul__, counts)))
    starts = list(accumulate(sizes, initial=pos))
    end = starts.pop()
    if end > len(buf):
        return -1
    found = itemgetter(*starts)(buf)
    if (bytes(found) if len(starts) > 1 else bytes((found,))) != expected:
        return -1
    return end
