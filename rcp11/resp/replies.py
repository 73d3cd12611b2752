"""RESP replies: the values handlers return and how each encodes in RESP2
and RESP3, and encode_command(), the request framing the AOF logs.

Reply values handlers return, and how they encode:

    None                 null bulk string   ($-1 / _)
    NULL_ARRAY           null array         (*-1 / _)   e.g. TREAD BLOCK timeout
    int / bool           integer            (:n)        (bool -> RESP3 #t/#f)
    float                RESP3 double, RESP2 bulk string
    bytes / str          bulk string
    SimpleString("OK")   +OK
    Error("ERR ...")     -ERR ...   (text includes the error code)
    list / tuple         array
    dict                 RESP3 map, RESP2 flat array of key, value, ...
    set / frozenset      RESP3 set, RESP2 array
    Verbatim("txt", s)   RESP3 verbatim string, RESP2 bulk string
    Push(list)           RESP3 push, RESP2 array
    Raw(bytes)           pre-encoded bytes written as they are (TREAD's reply
                         built by the C core)
    Parts(list, size)    pre-encoded bytes in pieces, written one after the
                         other (EXEC's reply, built as its commands run)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class SimpleString(str):
    """A +status reply."""


@dataclass(frozen=True, slots=True)
class Error:
    """A -error reply; message starts with its code, e.g. 'ERR syntax error'."""

    message: str


@dataclass(frozen=True, slots=True)
class Verbatim:
    format: str
    text: str


@dataclass(frozen=True, slots=True)
class Push:
    items: list


@dataclass(frozen=True, slots=True)
class Raw:
    data: bytes


@dataclass(frozen=True, slots=True)
class Parts:
    """A reply already encoded, in pieces (EXEC's: its array header, then
    each command's reply as it ran), queued for the client as they are:
    a large one is never copied into one buffer. size: their total length."""

    parts: list[bytes]
    size: int


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY = _NullArray()
OK = SimpleString("OK")
QUEUED = SimpleString("QUEUED")
PONG = SimpleString("PONG")


# ---------------------------------------------------------------------------
# Reply encoding
# ---------------------------------------------------------------------------

_NULL2 = b"$-1\r\n"
_NULL3 = b"_\r\n"
_NULL_ARRAY2 = b"*-1\r\n"
_TRUE3 = b"#t\r\n"
_FALSE3 = b"#f\r\n"
_CRLF_TABLE = bytes.maketrans(b"\r\n", b"  ")


def _line(text: str) -> bytes:
    # Status and error lines cannot carry CR/LF: a newline inside would end
    # the reply early and desynchronise the client, so it becomes a space.
    data = text.encode("utf-8", "replace")
    if b"\r" in data or b"\n" in data:
        data = data.translate(_CRLF_TABLE)
    return data


def _double(value: float) -> bytes:
    if value != value:
        return b"nan"
    if value in (_INF, -_INF):
        return b"inf" if value > 0 else b"-inf"
    return repr(value).encode()


_INF = float("inf")


_STATUS_CACHE = {status: b"+%s\r\n" % status.encode() for status in (OK, PONG, QUEUED)}


def encode(reply: Any, resp3: bool) -> bytes:
    """Encode one reply value (see the module docstring) for RESP2 or RESP3."""
    kind = type(reply)
    # The common replies first: bulk strings, integers, OK.
    if kind is bytes:
        return b"$%d\r\n%b\r\n" % (len(reply), reply)
    if kind is int:
        return b":%d\r\n" % reply
    if kind is SimpleString:
        encoded = _STATUS_CACHE.get(reply)
        if encoded is None:
            encoded = b"+" + _line(reply) + b"\r\n"
        return encoded
    if kind is Raw:
        return reply.data
    if kind is Parts:
        return b"".join(reply.parts)
    if reply is None:
        return _NULL3 if resp3 else _NULL2
    parts: list[bytes] = []
    _encode_into(reply, resp3, parts)
    return b"".join(parts)


def array_header(count: int) -> bytes:
    """The header of an array of count elements (the elements follow)."""
    return b"*%d\r\n" % count


def encode_raw_error(text: str) -> bytes:
    """An error reply whose text may quote raw request bytes (a protocol
    error): latin-1, so each such byte goes out as itself, as Redis writes
    it; CR and LF still cannot end the line early."""
    return b"-" + text.encode("latin-1", "replace").translate(_CRLF_TABLE) + b"\r\n"


# Bulk headers ("$<len>" without CRLF) for the argument sizes most commands
# have, so that encoding a 100-entry TWRITE formats no integer per entry.
_BULK_HEADERS = [b"$%d" % size for size in range(4096)]
_bulk_header = _BULK_HEADERS.__getitem__


def encode_command(argv: Iterable[bytes]) -> bytes:
    """A request: the RESP array of bulk strings a client sends for argv, and
    what the AOF logs (as Redis writes it).

    Measured for TWRITE b ENTRIES <100 x 100 B>: 8 us, against 22 us for
    one formatted part per argument."""
    args = argv if type(argv) is list else list(argv)
    if len(args) == 3:  # TWRITE key value, SET key value: the common record
        a, b, c = args
        headers = _BULK_HEADERS
        try:
            return b"*3\r\n%b\r\n%b\r\n%b\r\n%b\r\n%b\r\n%b\r\n" % (
                headers[len(a)],
                a,
                headers[len(b)],
                b,
                headers[len(c)],
                c,
            )
        except IndexError:
            pass
    elif args:
        # One join over [*n, $len0, arg0, $len1, arg1, ..., b""] with CRLF;
        # slice assignment fills it without a tuple per argument.
        n = len(args)
        parts = [b""] * (2 * n + 2)
        parts[0] = b"*%d" % n
        try:
            parts[1:-1:2] = map(_bulk_header, map(len, args))
        except IndexError:
            pass
        else:
            parts[2:-1:2] = args
            return b"\r\n".join(parts)
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


# Arrays at least this long try encode_command() first (see _encode_into).
_BULK_RUN = 16


def _encode_into(reply: Any, resp3: bool, out: list[bytes]) -> None:
    kind = type(reply)
    if kind is bytes:
        out.append(b"$%d\r\n%b\r\n" % (len(reply), reply))
    elif kind is int:
        out.append(b":%d\r\n" % reply)
    elif reply is None:
        out.append(_NULL3 if resp3 else _NULL2)
    elif kind is list or kind is tuple:
        if len(reply) >= _BULK_RUN:
            # A long array of bulk strings (KEYS, SCAN, MGET without misses)
            # is exactly a request's encoding: one join instead of a call per
            # element (0.1 instead of 1.2 us each). Anything but bytes in it
            # (None, a number, a nested array) raises TypeError first.
            try:
                out.append(encode_command(reply))
                return
            except TypeError:
                pass
        out.append(b"*%d\r\n" % len(reply))
        for item in reply:
            _encode_into(item, resp3, out)
    elif kind is SimpleString:
        out.append(b"+" + _line(reply) + b"\r\n")
    elif kind is str:
        data = reply.encode("utf-8", "surrogateescape")
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif kind is Raw:
        out.append(reply.data)
    elif kind is Parts:
        out.extend(reply.parts)
    elif kind is Error:
        message = reply.message
        out.append(b"-" + _line(message[1:] if message.startswith("-") else message) + b"\r\n")
    elif kind is bool:
        if resp3:
            out.append(_TRUE3 if reply else _FALSE3)
        else:
            out.append(b":1\r\n" if reply else b":0\r\n")
    elif reply is NULL_ARRAY:
        out.append(_NULL3 if resp3 else _NULL_ARRAY2)
    elif kind is dict:
        out.append((b"%%%d\r\n" if resp3 else b"*%d\r\n") % (len(reply) * (1 if resp3 else 2)))
        for key, value in reply.items():
            _encode_into(key, resp3, out)
            _encode_into(value, resp3, out)
    elif kind is set or kind is frozenset:
        out.append((b"~%d\r\n" if resp3 else b"*%d\r\n") % len(reply))
        for item in reply:
            _encode_into(item, resp3, out)
    elif kind is float:
        text = _double(reply)
        if resp3:
            out.append(b"," + text + b"\r\n")
        else:
            out.append(b"$%d\r\n%b\r\n" % (len(text), text))
    elif kind is Verbatim:
        data = reply.text.encode("utf-8", "surrogateescape")
        if resp3:
            fmt = reply.format.encode()[:3].ljust(3)
            out.append(b"=%d\r\n%b:%b\r\n" % (len(data) + 4, fmt, data))
        else:
            out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif kind is Push:
        out.append((b">%d\r\n" if resp3 else b"*%d\r\n") % len(reply.items))
        for item in reply.items:
            _encode_into(item, resp3, out)
    elif isinstance(reply, (bytearray, memoryview)):
        data = bytes(reply)
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif isinstance(reply, SimpleString):
        out.append(b"+" + _line(reply) + b"\r\n")
    elif isinstance(reply, bool):
        _encode_into(bool(reply), resp3, out)
    elif isinstance(reply, int):
        out.append(b":%d\r\n" % int(reply))
    elif isinstance(reply, str):
        _encode_into(str(reply), resp3, out)
    elif isinstance(reply, float):
        _encode_into(float(reply), resp3, out)
    elif isinstance(reply, (list, tuple)):
        _encode_into(list(reply), resp3, out)
    elif isinstance(reply, dict):
        _encode_into(dict(reply), resp3, out)
    elif isinstance(reply, (set, frozenset)):
        _encode_into(set(reply), resp3, out)
    else:
        raise TypeError(f"cannot encode {kind.__name__} as a RESP reply")
