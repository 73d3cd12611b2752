"""Connections for Spark tasks and the driver: reconnect with back-off
through short outages, a clear error after ``retryTimeoutMs``.

redis-py's own retry is switched off: it would resend a TWRITE whose reply
was lost and so write it twice. Every caller here says what a retry means
for its command instead (reads: read again; staging writes: continue after
what the server has; the commit: start it over, it is idempotent).
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError
from redis.retry import Retry

from rcp11 import errors
from rcp11.client import Client
from rcp11.spark.options import RETRY_BACKOFF_MAX_MS, Endpoint

log = logging.getLogger("rcp11.spark")

T = TypeVar("T")

# Failures worth a reconnect: the server went away, is restarting (LOADING)
# or did not answer in time. Everything else (WRONGTYPE, MISCONF, ...) is
# an answer, and is raised at once.
RETRYABLE: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ConnectionError,
    TimeoutError,
)
# Replies of a Redis Cluster that mean "ask the cluster where the key is
# now": the slot moved (MOVED, ASK during a migration), or the cluster is
# between owners (CLUSTERDOWN, TRYAGAIN) for the moment of a failover.
REDIRECTS: tuple[type[BaseException], ...] = (
    MovedError,
    AskError,
    ClusterDownError,
    TryAgainError,
)
# TREADs a partition reader keeps in flight on one connection, so the
# server formats the next reply while this task converts the last one.
READ_PIPELINE_DEPTH = 4
# Longest time to wait for a connection to open.
CONNECT_TIMEOUT_S = 5.0


class ServerUnreachableError(ConnectionError):
    """The server stayed unreachable for longer than retryTimeoutMs."""


def socket_timeout(endpoint: Endpoint) -> float | None:
    # A reply slower than the whole retry budget counts as an outage.
    return endpoint.retry_timeout_ms / 1000 if endpoint.retry_timeout_ms else None


def _connection_options(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "host": endpoint.host,
        "port": endpoint.port,
        "username": endpoint.username,
        "password": endpoint.password,
        "socket_timeout": socket_timeout(endpoint),
        "socket_connect_timeout": min(CONNECT_TIMEOUT_S, socket_timeout(endpoint) or 1e9),
        "retry": Retry(NoBackoff(), 0),
        # RESP2, whatever redis-py's default: no HELLO round trip on connect,
        # and a TREAD ... WITHTIMES reply is one flat list (message, time,
        # ...), which a reader slices instead of walking pairs.
        "protocol": 2,
    }


def new_client(endpoint: Endpoint) -> Client:
    return Client(**_connection_options(endpoint))


class Session:
    """One client that reconnects when an operation fails on the network.

    ``call(doing, operation)`` runs ``operation(client)`` and, while the
    failure is a lost connection, waits (doubling back-off with jitter),
    reconnects and runs it again, until retryTimeoutMs has passed since the
    first failure; then ServerUnreachableError says what it was doing.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = new_client(self.endpoint)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, doing: str, operation: Callable[[Client], T]) -> T:
        outage = Outage(self.endpoint, doing)
        while True:
            try:
                return operation(self.client)
            except RETRYABLE as exc:
                self.close()
                outage.wait(exc)


class Outage:
    """Back-off bookkeeping for one operation across its reconnects."""

    def __init__(self, endpoint: Endpoint, doing: str) -> None:
        self.endpoint = endpoint
        self.doing = doing
        self.started: float | None = None
        self.pause = endpoint.retry_backoff_ms / 1000

    def wait(self, exc: BaseException) -> None:
        """Sleep before the next attempt, or raise when time is up."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
            log.warning(
                "rcp11 at %s unreachable while %s (%s); retrying for up to %d ms",
                self.endpoint.address,
                self.doing,
                exc,
                self.endpoint.retry_timeout_ms,
            )
        left = self.started + self.endpoint.retry_timeout_ms / 1000 - now
        if left <= 0:
            message = errors.spark_unreachable(
                self.endpoint.address, now - self.started, self.doing, f"{exc}"
            )
            raise ServerUnreachableError(message) from exc
        time.sleep(min(left, self.pause * random.uniform(0.5, 1.0)))
        self.pause = min(self.pause * 2, RETRY_BACKOFF_MAX_MS / 1000)


def raw_connection(endpoint: Endpoint) -> redis.Connection:
    """A bare redis-py connection (AUTH done on connect): replies come back
    as hiredis (or redis-py) parsed them, with no callbacks in between."""
    conn = redis.Connection(**_connection_options(endpoint))
    conn.connect()
    return conn


class _Resend(Exception):  # noqa: N818 - control flow, not an error
    """The requests in flight must be sent again (in another form)."""


def pipelined_treads(
    endpoint: Endpoint,
    key: str,
    start: int,
    end: int,
    batch: int,
    doing: str,
    relocate: Callable[[BaseException], Endpoint] | None = None,
    withtimes: bool = False,
) -> Iterator[tuple[int, Any]]:
    """``(offset, reply, packed)`` for ``TREAD key offset n WITHINFO PACKED``
    over [start, end) (``WITHTIMES`` too with ``withtimes``): the info,
    then the lengths and the messages (and times) as bulk strings
    (docs/PROTOCOL.md, PACKED). A server older than PACKED answers
    "unknown option": the requests then go without it (``packed`` False),
    and each reply is the info and one element per offset (message, time,
    ... with ``withtimes``).

    Keeps READ_PIPELINE_DEPTH requests in flight; requests below a reply's
    first readable offset are skipped (evicted), so offsets between two
    replies may be missing. A reply that comes back short (the stream ends
    earlier than planned) stops the walk after it is yielded; the caller
    decides whether either is data loss. A lost connection resumes at the
    first request whose reply was not yielded. With ``relocate`` (a
    cluster), a redirection reply (MOVED...) is retried too, and after each
    failure ``relocate(error)`` says which node to ask next.
    """
    outage = Outage(endpoint, doing)
    options = ("WITHINFO", "WITHTIMES", "PACKED") if withtimes else ("WITHINFO", "PACKED")
    retry: tuple[type[BaseException], ...] = RETRYABLE
    if relocate is not None:
        retry += REDIRECTS
    resume = start
    while resume < end:
        conn: redis.Connection | None = None
        try:
            conn = raw_connection(endpoint)
            in_flight: deque[tuple[int, int]] = deque()
            position = resume
            while position < end or in_flight:
                requests = []
                while position < end and len(in_flight) < READ_PIPELINE_DEPTH:
                    count = min(batch, end - position)
                    requests.append(("TREAD", key, position, count, *options))
                    in_flight.append((position, count))
                    position += count
                if requests:
                    conn.send_packed_command(conn.pack_commands(requests))
                offset, count = in_flight.popleft()
                try:
                    reply = conn.read_response(disable_decoding=True)
                    if isinstance(reply, redis.ResponseError):  # redis-py may return it
                        raise reply
                except redis.ResponseError as exc:
                    if "unknown option 'PACKED'" in str(exc) and options[-1] == "PACKED":
                        options = options[:-1]  # an older server: one element per offset
                        raise _Resend() from None
                    raise
                resume = offset + count
                yield offset, reply, options[-1] == "PACKED"
                info = reply[0]
                if int(info[3]) < count:
                    return  # the stream ends before the range does
                # Everything below the first readable offset was evicted:
                # ask for what is readable, not for a run of nulls.
                position = max(position, min(int(info[0]), end))
            return
        except _Resend:
            pass  # from `resume` again, on a new connection (replies in flight are dropped)
        except retry as exc:
            outage.wait(exc)
            if relocate is not None:
                endpoint = relocate(exc)
        finally:
            if conn is not None:
                conn.disconnect()
