"""Inline commands (a request line without RESP framing, as redis-cli
and telnet send): split into words the way Redis's sdssplitargs does."""

from __future__ import annotations

_WHITESPACE = b" \t\n\r\v\f"
_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}
_HEX = b"0123456789abcdefABCDEF"


def split_args(line: bytes) -> list[bytes] | None:
    """Split an inline command the way Redis's sdssplitargs does: words
    separated by whitespace; "double quotes" with \\n \\r \\t \\b \\a \\xHH
    and \\<any> escapes; 'single quotes' where only \\' is an escape. A closing
    quote must be followed by whitespace or the end. Returns None for
    unbalanced quotes."""
    if b'"' not in line and b"'" not in line:
        # No quoting: bytes.split() splits on exactly C's isspace() set.
        return line.split()
    args: list[bytes] = []
    pos = 0
    end = len(line)
    while True:
        while pos < end and line[pos] in _WHITESPACE:
            pos += 1
        if pos >= end:
            return args
        current = bytearray()
        in_double = in_single = False
        while True:
            if in_double:
                if pos >= end:
                    return None
                ch = line[pos]
                if (
                    ch == 92
                    and pos + 3 < end
                    and line[pos + 1] == ord("x")
                    and line[pos + 2] in _HEX
                    and line[pos + 3] in _HEX
                ):
                    current.append(int(line[pos + 2 : pos + 4], 16))
                    pos += 3
                elif ch == 92 and pos + 1 < end:
                    pos += 1
                    escaped = line[pos]
                    current.append(_ESCAPES.get(escaped, escaped))
                elif ch == 34:
                    if pos + 1 < end and line[pos + 1] not in _WHITESPACE:
                        return None
                    pos += 1
                    break
                else:
                    current.append(ch)
            elif in_single:
                if pos >= end:
                    return None
                ch = line[pos]
                if ch == 92 and pos + 1 < end and line[pos + 1] == 39:
                    current.append(39)
                    pos += 1
                elif ch == 39:
                    if pos + 1 < end and line[pos + 1] not in _WHITESPACE:
                        return None
                    pos += 1
                    break
                else:
                    current.append(ch)
            else:
                if pos >= end:
                    break
                ch = line[pos]
                if ch in _WHITESPACE:
                    break
                if ch == 34:
                    in_double = True
                elif ch == 39:
                    in_single = True
                else:
                    current.append(ch)
            pos += 1
        args.append(bytes(current))
