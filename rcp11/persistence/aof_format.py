"""Reading the AOF: complete RESP commands one by one from a file, with
where each starts and ends, and what is wrong where the file stops being a
clean sequence of commands (a torn tail, or bytes that are not RESP).

The AOF is written with resp.encode_command; the records only the loader
knows are RAISE_NEXT (docs/PERSISTENCE.md, offset reservations) and the
append-time annotation, a line between commands as Redis 7 writes its
`#TS:<seconds>` ones (docs/PERSISTENCE.md, append times):

    #RCP11-MS:1700000000123\r\n     the writes after it were appended at
                                    this unix time in ms (until the next)

Other lines starting with '#' are skipped, as Redis's loader skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

# `RCP11-RAISE-NEXT key offset`: after a crash, a stream's next offset was
# raised to its reservation; later commands replay onto those offsets.
RAISE_NEXT = b"RCP11-RAISE-NEXT"

# The argv[0] iter_aof_commands() yields for an annotation line (argv[1]:
# the line without '#' and CRLF). A command name never starts with '#'.
ANNOTATION = b"#"
APPEND_TIME_PREFIX = b"RCP11-MS:"
# An annotation line is at most this long (CRLF included): a longer one is
# bytes that are not AOF, not an annotation to skip.
ANNOTATION_MAX_BYTES = 256
# The largest append time an annotation may carry (the core's int64 ms).
APPEND_TIME_MAX = 2**63 - 1


def encode_append_time(ms: int) -> bytes:
    """The annotation that dates the writes logged after it."""
    return b"#%s%d\r\n" % (APPEND_TIME_PREFIX, ms)


def parse_append_time(text: bytes) -> int | None:
    """The time of an annotation's text (argv[1] of an ANNOTATION), None
    for an annotation of another kind. ValueError when it is ours but its
    time is not an integer from 0 to 2^63-1."""
    if not text.startswith(APPEND_TIME_PREFIX):
        return None
    digits = text[len(APPEND_TIME_PREFIX) :]
    # isdigit() also refuses a sign, spaces and an empty number.
    if not digits.isdigit() or len(digits) > 19 or int(digits) > APPEND_TIME_MAX:
        raise ValueError(f"bad append time {digits[:30]!r}")
    return int(digits)


class TornTail(Exception):
    """The file ends inside a command (a crash cut it short)."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


class BadBytes(Exception):
    """Bytes that are not a RESP command where one should start."""

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(offset, problem)
        self.offset = offset
        self.problem = problem


class _Incomplete(Exception):
    """The buffer ends inside a command."""


def _parse_command(buf: bytes, pos: int) -> tuple[list[bytes], int]:
    """Parse one RESP array of bulk strings at pos; returns (argv, end).
    Raises _Incomplete or ValueError (with a relative description)."""
    size = len(buf)
    if buf[pos] == 35:  # '#': an annotation line
        # It ends at its LF, as Redis's loader reads it (fgets): a bare-LF
        # line of another tool must not swallow the CRLF line after it (a
        # date would be lost). This package writes CRLF.
        newline = buf.find(b"\n", pos, pos + ANNOTATION_MAX_BYTES)
        if newline < 0:
            if size - pos < ANNOTATION_MAX_BYTES:
                raise _Incomplete
            raise ValueError("annotation line too long")
        text_end = newline - 1 if buf[newline - 1] == 13 else newline  # '\r'
        return [ANNOTATION, buf[pos + 1 : text_end]], newline + 1
    if buf[pos] != 42:  # '*'
        raise ValueError(f"expected '*', got {bytes([buf[pos]])!r}")
    newline = buf.find(b"\r\n", pos, pos + 24)
    if newline < 0:
        if size - pos < 24:
            raise _Incomplete
        raise ValueError("bad array header")
    count_text = buf[pos + 1 : newline]
    if not count_text.isdigit() or int(count_text) < 1:
        raise ValueError(f"bad argument count {count_text!r}")
    count = int(count_text)
    pos = newline + 2
    argv: list[bytes] = []
    for _ in range(count):
        if pos >= size:
            raise _Incomplete
        if buf[pos] != 36:  # '$'
            raise ValueError(f"expected '$', got {bytes([buf[pos]])!r}")
        newline = buf.find(b"\r\n", pos, pos + 24)
        if newline < 0:
            if size - pos < 24:
                raise _Incomplete
            raise ValueError("bad bulk header")
        length_text = buf[pos + 1 : newline]
        if not length_text.isdigit():
            raise ValueError(f"bad bulk length {length_text!r}")
        start = newline + 2
        end = start + int(length_text)
        if end + 2 > size:
            raise _Incomplete
        if buf[end : end + 2] != b"\r\n":
            raise ValueError("bulk string not followed by CRLF")
        argv.append(buf[start:end])
        pos = end + 2
    return argv, pos


def iter_aof_commands(
    file: BinaryIO, start: int, chunk: int = 16 << 20
) -> Iterator[tuple[list[bytes], int, int]]:
    """Yield (argv, start_offset, end_offset) for each complete command of
    file from byte `start`. At the end: if bytes remain that do not form a
    complete command, raises TornTail(offset); bytes that are not RESP raise
    BadBytes(offset, problem). An annotation line comes as
    [ANNOTATION, text]."""
    file.seek(start)
    buf = b""
    base = start  # file offset of buf[0]
    pos = 0
    eof = False
    while True:
        if pos >= len(buf) and eof:
            return
        try:
            if pos >= len(buf):
                raise _Incomplete
            argv, end = _parse_command(buf, pos)
        except _Incomplete:
            if eof:
                raise TornTail(base + pos) from None
            more = file.read(max(chunk, 2 * (len(buf) - pos)))
            if not more:
                eof = True
            buf = buf[pos:] + more
            base += pos
            pos = 0
            continue
        except ValueError as exc:
            raise BadBytes(base + pos, str(exc)) from None
        yield argv, base + pos, base + end
        pos = end


__all__ = [
    "ANNOTATION",
    "RAISE_NEXT",
    "BadBytes",
    "TornTail",
    "encode_append_time",
    "iter_aof_commands",
    "parse_append_time",
]
