"""The command line's connection (redis-cli's options) and how it explains
a failure in one line with what to do about it."""

from __future__ import annotations

import argparse
import os

import redis

from rcp11.cli.acked import ACKED_GROUP_TYPE
from rcp11.cli.inspection import STREAM_TYPE
from rcp11.client import Client

PROG = "rcp11"


def _where(args: argparse.Namespace) -> str:
    if args.url:
        return args.url.split("@")[-1]
    return f"{args.host}:{args.port}"


def connect(args: argparse.Namespace) -> Client:
    """A Client for the connection options; fails early with advice when unreachable."""
    password = args.password if args.password is not None else os.environ.get("REDISCLI_AUTH")
    if args.url:
        kwargs: dict[str, object] = {}
        if password is not None:
            kwargs["password"] = password
        client = Client.from_url(args.url, **kwargs)
    else:
        client = Client(host=args.host, port=args.port, username=args.user, password=password)
    client.ping()
    return client


def explain(
    exc: redis.exceptions.RedisError, args: argparse.Namespace, client: Client | None = None
) -> str:
    """One line (two for a server that is not running) for a failure;
    client is the connection when there was one."""
    where = _where(args)
    text = str(exc)
    if isinstance(exc, redis.exceptions.AuthenticationError) or text.startswith(
        ("NOAUTH", "WRONGPASS", "invalid password", "invalid username-password")
    ):
        if args.password is None and not os.environ.get("REDISCLI_AUTH"):
            return (
                f"the server at {where} requires a password ({text}); "
                "pass it with -a PASSWORD or set REDISCLI_AUTH"
            )
        return f"the server at {where} refused the password ({text}); check -a / REDISCLI_AUTH"
    if isinstance(exc, redis.exceptions.ConnectionError) and client is not None:
        return f"lost the connection to {where}: {text} (did the server stop or restart?)"
    if isinstance(exc, redis.exceptions.ConnectionError):
        port = args.port if not args.url else "PORT"
        return (
            f"cannot connect to {where}: {text}\n"
            f"Is rcp11-server running? Start it with: rcp11-server redis.conf "
            f"(or: {PROG} server --port {port}), or point -h/-p/-u at it."
        )
    if isinstance(exc, redis.exceptions.TimeoutError):
        return f"the server at {where} did not answer in time: {text}"
    if "unknown command" in text and any(
        name in text.upper() for name in ("'TWRITE'", "'TREAD'", "'TEVICT'")
    ):
        return (
            f"the server at {where} does not know the RCP 11 stream commands ({text}); "
            "it is not an rcp11 server (a plain redis-server?). Check -h/-p/-u."
        )
    if "WRONGTYPE" in text:  # a pipeline's error says which command first
        return _wrong_type(args, client) or f"server error: {text}"
    return f"server error: {text}"


def _wrong_type(args: argparse.Namespace, client: Client | None) -> str | None:
    """Which key holds the wrong kind of value, asked of the server."""
    if client is None:
        return None
    try:
        kind = client.type(args.key).decode()
        group = getattr(args, "group", None) or getattr(args, "groupnew", None)
        group_kind = client.type(group).decode() if group else "none"
    except redis.exceptions.RedisError:
        return None
    if kind not in (STREAM_TYPE, "none"):
        return (
            f"key '{args.key}' holds a {kind}, not a stream; "
            f"{PROG} {args.command} needs a stream key: use another key name"
        )
    if group and group_kind not in ("string", "none", ACKED_GROUP_TYPE):
        shown = "stream" if group_kind == STREAM_TYPE else group_kind
        kept = (
            "an acknowledged group (--ack) is kept in a key of its own type"
            if getattr(args, "ack", False)
            else "a consumer group's offset is kept in a string key"
        )
        return f"group key '{group}' holds a {shown}; {kept}: use another key name"
    return None
