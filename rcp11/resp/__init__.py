"""RESP, the protocol: request parsing (hiredis) and reply encoding, RESP2
and RESP3. Every RESP byte the server reads or writes is framed here.

    replies.py    reply values and their encoding; encode_command() (AOF)
    requests.py   RequestParser: a connection's bytes -> argv lists
    framing.py    where requests end in the raw buffer (the fast path)
    inline.py     inline commands split as Redis's sdssplitargs does
"""

from rcp11.resp.inline import split_args
from rcp11.resp.replies import (
    NULL_ARRAY,
    OK,
    PONG,
    QUEUED,
    Error,
    Parts,
    Push,
    Raw,
    SimpleString,
    Verbatim,
    array_header,
    encode,
    encode_command,
    encode_raw_error,
)
from rcp11.resp.requests import QueryBufferLimitError, RequestParser

__all__ = [
    "NULL_ARRAY",
    "OK",
    "PONG",
    "QUEUED",
    "Error",
    "Parts",
    "Push",
    "QueryBufferLimitError",
    "Raw",
    "RequestParser",
    "SimpleString",
    "Verbatim",
    "array_header",
    "encode",
    "encode_command",
    "encode_raw_error",
    "split_args",
]
