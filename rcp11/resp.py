"""RESP: request parsing (hiredis) and reply encoding, RESP2 and RESP3.

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
"""

from __future__ import annotations

from dataclasses import dataclass


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


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY = _NullArray()
OK = SimpleString("OK")
QUEUED = SimpleString("QUEUED")
PONG = SimpleString("PONG")
