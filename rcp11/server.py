"""The network front end: `rcp11-server [redis.conf] [--directive value ...]`.

One asyncio (uvloop) protocol object per connection feeds bytes to its
RequestParser, runs each complete command through rcp11.commands.execute and
queues the encoded reply. Replies are not written at once: every connection
with output is flushed by one callback per event-loop iteration, which first
calls persistence.flush(). That is Redis's beforeSleep: the AOF holds every
write before its reply leaves, and with appendfsync always one fsync covers
all the commands of the iteration (group commit).

A cron at `hz` does what Redis's serverCron does here: blocked-client
timeouts, persistence ticks, idle-client timeouts, output buffer soft limits
and key expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import time
from time import perf_counter
from typing import Any

from rcp11 import __version__, errors, tls
from rcp11.commands import (
    Stop,
    client_disconnected,
    client_line,
    execute,
    expire_keys,
    late_reply,
    protocol_error_reply,
    run_lane,
    run_pipeline,
)
from rcp11.config import Config, ConfigError
from rcp11.errors import ProtocolError
from rcp11.limits import (
    OUTPUT_HIGH_WATER,
    RESERVED_FDS,
    TRANSPORT_WATER,
    TURN_SECONDS,
)
from rcp11.logs import VERBOSE, set_level, setup_logging
from rcp11.persistence import Persistence, PersistenceError
from rcp11.resp import Error, QueryBufferLimitError, RequestParser, encode
from rcp11.state import ClientState, ServerState

log = logging.getLogger("rcp11")

# The local end of these addresses is the machine itself; protected mode
# accepts only them (and unix sockets) while no password is set.
_LOOPBACK = ("127.0.0.1", "::1")

# Refusals written before a connection becomes a client.
DENIED = encode(Error(errors.DENIED), False)
MAX_CLIENTS = encode(Error(errors.MAX_CLIENTS), False)


USAGE = """Usage: rcp11-server [/path/to/redis.conf] [options]
       rcp11-server -v or --version
       rcp11-server -h or --help

A Redis-protocol server for antirez's RCP 11 stream data type.

Options are config directives written as --name value, applied after the
config file (a value may be several words, e.g. --save 3600 1 300 100).

Examples:
       rcp11-server                    (built-in defaults: 127.0.0.1:6379)
       rcp11-server /etc/rcp11/redis.conf
       rcp11-server --port 7777 --appendonly yes --appendfsync always
       rcp11-server redis.conf --loglevel verbose --save ""
"""


def _format_addr(sockaddr: Any, unix_path: str | None) -> str:
    if unix_path is not None:
        return f"{unix_path}:0"
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        host = sockaddr[0]
        if ":" in host:
            return f"[{host}]:{sockaddr[1]}"
        return f"{host}:{sockaddr[1]}"
    return "?"


class Connection(asyncio.Protocol):
    """One client connection. Its ClientState is what commands see.

    Output is held to account before every command, as Redis's
    processInputBuffer() does: the replies queued here (`out`, not written
    before the next flush) plus the transport's unsent buffer are the
    client's pending output. Over the hard limit the client is closed at
    once; over the soft limit for its seconds too; and with no hard limit,
    past a high-water mark the client's commands stop until the output
    drains (backpressure), so a pipeline of big TREADs that is never read
    cannot grow the server. A client also runs commands for at most
    TURN_SECONDS before other clients get a turn.
    """

    def __init__(self, server: Server, unix_path: str | None = None) -> None:
        self.server = server
        self.unix_path = unix_path
        self.transport: asyncio.Transport | None = None
        self.client: ClientState | None = None
        self.parser: RequestParser | None = None
        self.out: list[bytes] = []
        self.out_bytes = 0  # len(b"".join(self.out)), kept as replies are queued
        self.queued_for_flush = False
        self.close_after_write = False
        self.closed = False
        # Why reading from the socket is paused: "write" (the transport's
        # buffer is full) and/or "held" (see `held`).
        self.read_pauses: set[str] = set()
        # Why this client's commands wait: None, "turn" (others run first;
        # resumes from the ready queue) or "output" (pending output over
        # the high-water mark; resumes once it drains).
        self.held: str | None = None
        # Commands already parsed that wait for the client's next turn.
        self.backlog: list[list[bytes]] | None = None
        self.backlog_index = 0
        # Pending output above which process() must look at the limits.
        self.output_mark = self.next_output_mark(0)
        # Since when the output has been over the soft limit (0: it is not).
        self.soft_limit_since = 0.0
        self.check_auth = False

    # -- asyncio callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        state = server.state
        config = state.config
        self.transport = transport  # type: ignore[assignment]
        state.stats.total_connections_received += 1
        peer = transport.get_extra_info("peername")
        if len(state.clients) >= config.get("maxclients"):
            state.stats.rejected_connections += 1
            log.log(VERBOSE, "Error registering client: max number of clients reached")
            transport.write(MAX_CLIENTS)
            transport.close()
            self.closed = True
            return
        if (
            self.unix_path is None
            and config.get("protected-mode")
            and not config.get("requirepass")
            and not (isinstance(peer, tuple) and peer[0] in _LOOPBACK)
        ):
            state.stats.rejected_connections += 1
            transport.write(DENIED)
            transport.close()
            self.closed = True
            return
        client = ClientState()
        client.addr = _format_addr(peer, self.unix_path)
        client.local = self.unix_path is not None or (
            isinstance(peer, tuple) and peer[0] in _LOOPBACK
        )
        client.laddr = _format_addr(transport.get_extra_info("sockname"), self.unix_path)
        sock = transport.get_extra_info("socket")
        client.fd = sock.fileno() if sock is not None else -1
        client.authenticated = not config.get("requirepass")
        client.send = self.send
        client.close = self.close_soon
        client.on_unblocked = self.on_unblocked
        client.unix_path = self.unix_path or ""
        self.client = client
        if sock is not None and self.unix_path is None:
            server.set_keepalive(sock)
        self.parser = RequestParser(
            max_bulk_len=config.get("proto-max-bulk-len"),
            query_buffer_limit=config.get("client-query-buffer-limit"),
        )
        self.check_auth = not client.authenticated
        self.parser.unauthenticated = self.check_auth
        transport.set_write_buffer_limits(TRANSPORT_WATER, TRANSPORT_WATER)
        state.clients[client.id] = client
        server.connections[client.id] = self
        log.log(VERBOSE, "Accepted %s", client.addr)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None or self.closed:
            return
        server = self.server
        server.state.stats.total_net_input_bytes += len(data)
        client.last_interaction = server.now = time.time()
        parser = self.parser
        runnable = client.blocked is None and not client.closing and self.held is None
        commands: list[list[bytes]] | None = None
        if runnable and self.backlog is None:
            # The C lane first: it runs the TWRITEs and TREADs it can from
            # the start of the read, the parser and run_pipeline() the rest.
            consumed, self.out_bytes = run_lane(
                server.state, client, parser, data, self.out, self.out_bytes, self.lane_mark()
            )
            if consumed:
                server.want_flush(self)
                if consumed == len(data):
                    client.query_buffer_len = 0
                    return
                data = data[consumed:]
        try:
            if runnable:
                commands = parser.take(data)  # type: ignore[union-attr]
            else:
                # Only buffered (and held to the query buffer limit) until
                # the client can run commands again.
                parser.feed(data)  # type: ignore[union-attr]
        except ProtocolError:
            pass  # the parser keeps it: process() gets it from drain()
        except QueryBufferLimitError:
            log.warning(
                "Closing client that reached max query buffer length: id=%d addr=%s qbuf=%d",
                client.id,
                client.addr,
                parser.buffered(),  # type: ignore[union-attr]
            )
            self.abort()
            return
        if runnable:
            self.process(commands)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.out.clear()
        self.out_bytes = 0
        self.backlog = None
        client = self.client
        if client is None:
            return
        self.server.forget(client)
        log.log(VERBOSE, "Client closed connection %s", client.addr)

    def pause_writing(self) -> None:
        # The client is not reading its replies: stop reading its requests
        # so a pipelining client cannot grow our memory without bound.
        self.pause_reading("write")

    def resume_writing(self) -> None:
        self.resume_reading("write")
        if self.held == "output":
            self.release()

    def pause_reading(self, reason: str) -> None:
        if not self.read_pauses and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self.read_pauses.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self.read_pauses:
            return
        self.read_pauses.discard(reason)
        if not self.read_pauses and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # -- request processing --------------------------------------------------

    def process(self, first: list[list[bytes]] | None = None) -> None:
        """Run the complete commands buffered for this client (first: those
        the parser already handed out), until it blocks, closes, is held
        for its output or has had its turn."""
        client = self.client
        parser = self.parser
        if client is None or parser is None or self.closed:
            return
        if self.held is not None:
            if first:
                parser.push_back(first)
            return
        server = self.server
        state = server.state
        out = self.out
        out_bytes = self.out_bytes
        transport = self.transport
        # Nothing is written to the transport until the next flush, so its
        # buffer is fixed meanwhile: `mark` is what `out` may reach before
        # the limits must be looked at.
        base = transport.get_write_buffer_size() if transport is not None else 0
        mark = self.output_mark - base
        deadline = perf_counter() + TURN_SECONDS
        index = 0
        commands: list[list[bytes]] | None = None
        if self.backlog is not None:
            commands, index = self.backlog, self.backlog_index
            self.backlog = None
            if first:
                parser.push_back(first)
        elif first is not None:
            commands = first
        ran = False
        try:
            while True:
                if commands is None:
                    if ran and perf_counter() > deadline:
                        break  # the rest is parsed on the client's next turn
                    commands = parser.drain()
                    index = 0
                if not commands:
                    break
                ran = True
                index, out_bytes, stop = run_pipeline(
                    state, client, commands, index, out, out_bytes, mark
                )
                if stop is Stop.OUTPUT or stop is Stop.CLOCK:
                    self.out_bytes = out_bytes
                    turn_over = stop is Stop.CLOCK and perf_counter() > deadline
                    if self.may_go_on(base + out_bytes, turn_over):
                        mark = self.output_mark - base
                        continue
                    if not self.closed:
                        self.backlog, self.backlog_index = commands, index
                elif stop is not Stop.DONE:
                    if stop is Stop.CLOSING:
                        self.close_after_write = True
                    # The rest of the pipeline waits until the client is
                    # unblocked (or is dropped with the connection).
                    parser.push_back(commands[index:])
                if self.check_auth and client.authenticated:
                    self.check_auth = parser.unauthenticated = False
                if stop is not Stop.DONE:
                    break
                commands = None
        except ProtocolError as exc:
            log.log(VERBOSE, "Protocol error (%s) from client: %s", exc.message, client.addr)
            data = protocol_error_reply(state, exc.message)
            out.append(data)
            out_bytes += len(data)
            self.close_after_write = True
            client.closing = True
        self.out_bytes = out_bytes
        client.query_buffer_len = parser.buffered()
        if (ran or self.close_after_write) and not self.closed:
            server.want_flush(self)
            if self.held is None and perf_counter() > deadline:
                # This read took the turn: other clients go first, before
                # the event loop reads more of this client's pipeline.
                self.hold("turn")

    def lane_mark(self) -> int:
        """The pending output the lane's replies may reach before the
        output limits must be looked at (as process() computes it)."""
        transport = self.transport
        base = transport.get_write_buffer_size() if transport is not None else 0
        return self.output_mark - base

    def may_go_on(self, pending: int, turn_over: bool) -> bool:
        """Between two commands, once pending output passed output_mark or
        the clock was read: whether the next command may run now. If not,
        the client was closed, or is held (and resumes by itself)."""
        if pending > self.output_mark and not self.output_allows(pending):
            return False
        if turn_over:
            self.hold("turn")
            return False
        return True

    def output_allows(self, pending: int) -> bool:
        """Redis's checkClientOutputBufferLimits() before the next command,
        and backpressure: False when the client was closed or is now held
        until its output drains. Sets output_mark for the next check."""
        hard, soft, seconds = self.server.output_limits
        if hard and pending > hard:
            self.client_over_limit(f"hard limit {hard}", pending)
            return False
        if soft and pending > soft:
            now = time.time()
            if not self.soft_limit_since:
                self.soft_limit_since = now
            elif now - self.soft_limit_since > seconds:
                self.client_over_limit(f"soft limit {soft} for {seconds}s", pending)
                return False
        else:
            self.soft_limit_since = 0.0
        self.output_mark = self.next_output_mark(pending)
        if pending > self.output_mark:
            self.hold("output")
            return False
        return True

    def next_output_mark(self, pending: int) -> int:
        """The pending output at which to look again: the soft limit while
        under it, then the hard limit, or without one the high-water mark
        at which commands stop until the output drains (never below the
        soft limit, so that the soft limit's timer can run)."""
        hard, soft, _ = self.server.output_limits
        if soft and pending <= soft:
            return soft
        if hard:
            return hard
        return max(OUTPUT_HIGH_WATER, soft + 1)

    def hold(self, reason: str) -> None:
        """Stop running this client's commands (the rest wait in backlog)
        and reading its socket until release()."""
        self.held = reason
        self.pause_reading("held")
        server = self.server
        # Its replies so far go out first, before its next turn.
        server.want_flush(self)
        if reason == "turn":
            server.loop.call_soon(self.release)

    def release(self) -> None:
        if self.held is None or self.closed:
            return
        self.held = None
        self.resume_reading("held")
        client = self.client
        if client is not None and client.blocked is None and not client.closing:
            self.process()

    # -- hooks installed into ClientState -------------------------------------

    def send(self, reply: Any) -> None:
        """A reply produced outside this client's own pipeline (blocking)."""
        client = self.client
        if client is None or self.closed:
            return
        data = late_reply(client, reply)
        self.out.append(data)
        self.out_bytes += len(data)
        self.server.want_flush(self)

    def close_soon(self) -> None:
        """Close once the output queued so far is written (CLIENT KILL)."""
        if self.client is not None:
            self.client.closing = True
        self.close_after_write = True
        self.server.want_flush(self)

    def on_unblocked(self) -> None:
        # Not inline: the blocking manager calls this while it iterates its
        # own structures, and running the pipeline may block again.
        self.server.loop.call_soon(self._resume)

    def _resume(self) -> None:
        client = self.client
        if client is not None and client.blocked is None and not client.closing:
            self.process()

    # -- output ----------------------------------------------------------------

    def write_pending(self) -> None:
        transport = self.transport
        out = self.out
        if transport is None or self.closed:
            out.clear()
            self.out_bytes = 0
            return
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self.out_bytes = 0
            hard = self.server.output_limits[0]
            if hard and transport.get_write_buffer_size() + len(data) > hard:
                # Like Redis, a reply that would push the output buffer past
                # the hard limit closes the client before any of it is sent,
                # so one huge TREAD cannot balloon the server either.
                self.client_over_limit(f"hard limit {hard}", len(data))
                return
            transport.write(data)
            self.server.state.stats.total_net_output_bytes += len(data)
        if self.close_after_write:
            self.closed = True
            transport.close()
            return
        buffered = transport.get_write_buffer_size()
        self.output_mark = self.next_output_mark(buffered)
        if self.held == "output" and buffered <= TRANSPORT_WATER:
            # The kernel took it (the transport did not pause): go on. Over
            # TRANSPORT_WATER the transport paused, and resume_writing()
            # releases the client once it drained.
            self.server.loop.call_soon(self.release)
        # The usual case: the kernel took everything, nothing to watch.
        if buffered or self.soft_limit_since:
            self.check_output_limits(self.server.now)
        elif self.client is not None:
            self.client.output_buffer_len = 0

    def check_output_limits(self, now: float) -> None:
        """The soft limit's timer, from the cron and after each write (the
        hard limit is checked before every command and every write)."""
        transport = self.transport
        client = self.client
        if transport is None or client is None or self.closed:
            return
        pending = transport.get_write_buffer_size() + self.out_bytes
        client.output_buffer_len = pending
        hard, soft, seconds = self.server.output_limits
        if hard and pending > hard:
            reason = f"hard limit {hard}"
        elif soft and pending > soft:
            if not self.soft_limit_since:
                self.soft_limit_since = now
                return
            if now - self.soft_limit_since <= seconds:
                return
            reason = f"soft limit {soft} for {seconds}s"
        else:
            self.soft_limit_since = 0.0
            return
        self.client_over_limit(reason, pending)

    def client_over_limit(self, reason: str, pending: int) -> None:
        client = self.client
        if client is not None:
            client.output_buffer_len = pending
            log.warning(
                "Client %s scheduled to be closed ASAP for overcoming of output buffer limits.",
                client_line(client, time.time()),
            )
        log.warning("(output buffer %s passed with %d bytes pending)", reason, pending)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        self.out.clear()
        self.out_bytes = 0
        self.backlog = None
        if self.client is not None:
            self.client.closing = True
        if self.transport is not None:
            self.transport.abort()


class Server:
    """Listeners, connections, the flush callback and the cron."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.loop = loop
        self.connections: dict[int, Connection] = {}
        self.listeners: list[asyncio.AbstractServer] = []
        # (host, port) -> its listener (None until create_server finished).
        self.tcp_listeners: dict[tuple[str, int], Any] = {}
        self.unix_path: str | None = None
        self.tls: tls.Bound | None = None
        # Bound at start-up before loading, served after (bind_*, serve).
        self._bound_tcp: dict[tuple[str, int], socket.socket] = {}
        self._bound_unix: socket.socket | None = None
        self.pending: list[Connection] = []
        self.flush_scheduled = False
        self.now = time.time()
        self.block_timer: asyncio.TimerHandle | None = None
        self.block_timer_at = 0.0
        self.cron_handle: asyncio.TimerHandle | None = None
        self.stopping = False
        self.exit_code = 0
        self.output_limits = state.config.get("client-output-buffer-limit")["normal"]
        config = state.config
        config.on_change("client-output-buffer-limit", self._limits_changed)
        config.on_change("proto-max-bulk-len", self._parser_limits_changed)
        config.on_change("client-query-buffer-limit", self._parser_limits_changed)
        config.on_change("loglevel", set_level)
        config.on_change("dir", self._dir_changed)
        config.on_change("port", self._rebind)
        config.on_change("bind", self._rebind)
        state.request_shutdown = self.request_shutdown

    # -- config reactions -------------------------------------------------------

    def _limits_changed(self, value: dict[str, tuple[int, int, int]]) -> None:
        self.output_limits = value["normal"]
        for conn in self.connections.values():
            conn.output_mark = conn.next_output_mark(0)  # looked at again by the next command

    def _parser_limits_changed(self, _value: Any) -> None:
        config = self.state.config
        for conn in self.connections.values():
            if conn.parser is not None:
                conn.parser.max_bulk_len = config.get("proto-max-bulk-len")
                conn.parser.query_buffer_limit = config.get("client-query-buffer-limit")

    @staticmethod
    def _dir_changed(path: str) -> None:
        # As Redis: the working directory is where files are written.
        try:
            os.chdir(path)
        except OSError as exc:
            raise ConfigError(f"Can't chdir to '{path}': {exc.strerror}") from None

    def set_keepalive(self, sock: Any) -> None:
        interval = self.state.config.get("tcp-keepalive")
        if interval <= 0:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if hasattr(socket, "TCP_KEEPIDLE"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, interval)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, interval // 3))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        except OSError:
            pass  # keepalive is an optimisation; a socket that refuses it still works

    # -- listening ------------------------------------------------------------

    # Start-up binds before it loads anything (as redis-server: a port in
    # use is reported at once, not after loading the data) and serves after.

    def bind_tcp(self) -> None:
        """Bind and listen on the configured TCP addresses (connections wait
        in the kernel's backlog until serve()). Raises SystemExit."""
        config = self.state.config
        port = config.get("port")
        if not port and not config.get("unixsocket") and not config.get("tls-port"):
            raise SystemExit("Configured to not listen anywhere, exiting.")
        if port:
            try:
                _, sockets = self._bind_tcp(config.get("bind"), port, {})
            except OSError as exc:
                raise SystemExit(f"Failed listening on port {port} (tcp), aborting.") from exc
            if not sockets:
                raise SystemExit(f"Failed listening on port {port} (tcp), aborting.")
            self._bound_tcp = sockets
        self.tls = tls.bind(self)  # tls-port: TLS listeners beside the TCP ones

    def bind_unix(self) -> None:
        """Bind and listen on the unix socket, if configured. A socket file
        that a live server answers on is not taken over. Raises SystemExit."""
        config = self.state.config
        path = config.get("unixsocket")
        if not path:
            return
        if _unix_socket_answers(path):
            raise SystemExit(f"Failed opening Unix socket: {path}: Address already in use")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(511)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise SystemExit(f"Failed opening Unix socket: {exc}") from exc
        perm = config.get("unixsocketperm")
        if perm:
            os.chmod(path, perm)
        self._bound_unix = sock
        self.unix_path = path

    async def serve(self) -> None:
        """Start accepting on everything bind_tcp()/bind_unix() bound."""
        for address, sock in self._bound_tcp.items():
            await self._serve_tcp(address, sock)
        self._bound_tcp = {}
        if self._bound_unix is not None:
            path = self.unix_path
            listener = await self.loop.create_unix_server(
                lambda: Connection(self, path), sock=self._bound_unix, backlog=511
            )
            self._bound_unix = None
            self.listeners.append(listener)
        if self.tls is not None:
            await self.tls.serve(self)
        if not self.listeners:
            raise SystemExit("Configured to not listen anywhere, exiting.")
        self.state.tcp_port = self.state.config.get("port")

    def _bind_tcp(
        self, binds: list[str], port: int, keep: dict[tuple[str, int], Any]
    ) -> tuple[set[tuple[str, int]], dict[tuple[str, int], socket.socket]]:
        """Every (address, port) the bind list means, and listening sockets
        for those not in keep, bound now (so a failure is known at once).
        Raises OSError, after closing what it bound, when a required
        address fails."""
        wanted: set[tuple[str, int]] = set()
        bound: dict[tuple[str, int], socket.socket] = {}
        try:
            for entry in binds:
                optional = entry.startswith("-")
                host = entry[1:] if optional else entry
                host = {"*": "0.0.0.0", "::*": "::"}.get(host, host)
                try:
                    infos = socket.getaddrinfo(
                        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                    )
                    for family, kind, proto, _name, sockaddr in infos:
                        address = (sockaddr[0], port)
                        wanted.add(address)
                        if address in keep or address in bound:
                            continue
                        sock = socket.socket(family, kind, proto)
                        try:
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                            if family == socket.AF_INET6:
                                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                            sock.bind(sockaddr)
                            sock.listen(511)
                            sock.setblocking(False)
                        except OSError:
                            sock.close()
                            raise
                        bound[address] = sock
                except (OSError, UnicodeError) as exc:
                    errno_ = getattr(exc, "errno", None)
                    if optional and errno_ in (
                        errno.EADDRNOTAVAIL,
                        errno.EAFNOSUPPORT,
                        errno.EPROTONOSUPPORT,
                        None,
                    ):
                        log.log(VERBOSE, "Skipping optional bind address %s: %s", host, exc)
                        continue
                    log.warning(
                        "Warning: Could not create server TCP listening socket %s:%d: %s",
                        host,
                        port,
                        getattr(exc, "strerror", None) or exc,
                    )
                    raise OSError(errno_, f"cannot listen on {host}:{port}") from exc
        except OSError:
            for sock in bound.values():
                sock.close()
            raise
        return wanted, bound

    async def _serve_tcp(self, address: tuple[str, int], sock: socket.socket) -> None:
        listener = await self.loop.create_server(lambda: Connection(self), sock=sock, backlog=511)
        self.listeners.append(listener)
        self.tcp_listeners[address] = listener

    def _rebind(self, _value: Any = None) -> None:
        """CONFIG SET port / bind: listen on the new addresses (bound before
        the reply, so a failure refuses the change), then close the old."""
        config = self.state.config
        port = config.get("port")
        if not port and not self.unix_path and not config.get("tls-port"):
            # Redis takes it and can no longer be reached by anyone.
            raise ConfigError(errors.PORT_ZERO_UNREACHABLE)
        wanted: set[tuple[str, int]] = set()
        bound: dict[tuple[str, int], socket.socket] = {}
        if port:
            try:
                wanted, bound = self._bind_tcp(config.get("bind"), port, self.tcp_listeners)
            except OSError:
                raise ConfigError("Failed to bind to specified addresses.") from None
            if not wanted:
                raise ConfigError("Failed to bind to specified addresses.")
        for address in [a for a in self.tcp_listeners if a not in wanted]:
            listener = self.tcp_listeners.pop(address)
            if listener is not None:
                listener.close()
                self.listeners.remove(listener)
        for address, sock in bound.items():
            self.tcp_listeners[address] = None  # serving once create_server is done
            self.loop.create_task(self._serve_tcp(address, sock))
        self.state.tcp_port = port

    # -- output ----------------------------------------------------------------

    def want_flush(self, conn: Connection) -> None:
        if not conn.queued_for_flush:
            conn.queued_for_flush = True
            self.pending.append(conn)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Once per loop iteration: persistence first (the AOF rule), then
        every reply queued since the last flush."""
        self.flush_scheduled = False
        logged = self._flush_persistence()
        pending = self.pending
        self.pending = []
        if not logged:
            self.drop_unlogged(pending)
        else:
            for conn in pending:
                conn.queued_for_flush = False
                conn.write_pending()
        self.arm_block_timer()

    def _flush_persistence(self) -> bool:
        """The AOF rule before replies leave; False when the writes of this
        iteration could not be logged."""
        try:
            return self.state.persistence.flush()
        except Exception:
            log.exception("Persistence flush failed")
            return False

    def drop_unlogged(self, pending: list[Connection]) -> None:
        """The AOF could not take this iteration's writes: no reply of the
        iteration may leave, since any of them may acknowledge or show data
        that is not logged (a TWRITE's offset, a TREAD of it, a blocked
        reader it served). Those clients are closed without them, so none
        takes an unlogged write for done; later writes get -MISCONF."""
        for conn in pending:
            conn.queued_for_flush = False
            conn.out.clear()
            conn.close_after_write = True
            if conn.client is not None:
                conn.client.closing = True
            conn.write_pending()  # nothing left to write: just closes
        if pending:
            log.warning(
                "Writes could not be logged to the AOF: dropped the replies of %d "
                "client(s) and closed them.",
                len(pending),
            )

    def arm_block_timer(self) -> None:
        """Wake exactly at the next BLOCK timeout instead of at the next cron
        tick, so short timeouts are not rounded up to 1/hz."""
        blocking = self.state.blocking
        if not blocking.deadlines:
            return
        deadline = blocking.next_deadline()
        if deadline is None:
            return
        if self.block_timer is not None and self.block_timer_at <= deadline:
            return
        if self.block_timer is not None:
            self.block_timer.cancel()
        self.block_timer_at = deadline
        delay = max(0.0, deadline - time.monotonic())
        self.block_timer = self.loop.call_later(delay, self._block_timeout)

    def _block_timeout(self) -> None:
        self.block_timer = None
        self.state.blocking.expire(time.monotonic())
        if self.pending and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)
        self.arm_block_timer()

    # -- connections -----------------------------------------------------------

    def forget(self, client: ClientState) -> None:
        state = self.state
        state.clients.pop(client.id, None)
        self.connections.pop(client.id, None)
        client.closing = True
        client_disconnected(state, client)

    # -- cron --------------------------------------------------------------------

    def start_cron(self) -> None:
        self.cron_handle = self.loop.call_later(1 / self.state.config.get("hz"), self.cron)

    def cron(self) -> None:
        state = self.state
        now = self.now = time.time()
        try:
            state.blocking.expire(time.monotonic())
            state.persistence.tick(now)
            expire_keys(state)
            self.client_timeouts(now)
            state.used_memory_peak()
            state.sample_rates(time.monotonic())
        except Exception:
            log.exception("Error in the server cron")
        if self.pending and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)
        if not self.stopping:
            self.start_cron()

    def client_timeouts(self, now: float) -> None:
        timeout = self.state.config.get("timeout")
        if not timeout and not self.output_limits[1]:
            # Nothing time-based to check (hard limits are checked on write):
            # skip the walk over every connection.
            return
        for conn in list(self.connections.values()):
            client = conn.client
            if client is None or conn.closed:
                continue
            if timeout and client.blocked is None and now - client.last_interaction > timeout:
                log.log(VERBOSE, "Closing idle client %s", client.addr)
                conn.abort()
                continue
            conn.check_output_limits(now)

    # -- shutdown ---------------------------------------------------------------

    def request_shutdown(self, mode: str | None = None) -> bool:
        """SHUTDOWN [SAVE|NOSAVE] and SIGTERM/SIGINT. Returns False (and keeps
        running) if persistence could not finish its final save."""
        if self.stopping:
            return True
        log.warning("User requested shutdown...")
        # Replies of this iteration go out below, after the final save: the
        # AOF must hold their writes first, as in every other iteration.
        logged = self._flush_persistence()
        try:
            ok = self.state.persistence.shutdown(mode)
        except Exception:
            log.exception("Error in persistence shutdown")
            ok = False
        if not ok:
            log.warning(
                "Errors trying to shut down the server. Check the logs for more information."
            )
            return False
        self.stopping = True
        for listener in self.listeners:
            listener.close()
        if self.unix_path:
            log.info("Removing the unix socket file.")
            try:
                os.unlink(self.unix_path)
            except OSError:
                pass
        if not logged:
            self.drop_unlogged(self.pending)
        self.pending = []
        for conn in list(self.connections.values()):
            conn.write_pending()
            if conn.transport is not None and not conn.closed:
                conn.closed = True
                conn.transport.close()
        if self.cron_handle is not None:
            self.cron_handle.cancel()
        self.loop.call_soon(self.loop.stop)
        return True

    def on_signal(self, signame: str) -> None:
        log.warning("Received %s scheduling shutdown...", signame)
        self.request_shutdown(None)


# ---------------------------------------------------------------------------
# Start-up
# ---------------------------------------------------------------------------


def _unix_socket_answers(path: str) -> bool:
    """Whether a server listens on the unix socket at path (a stale socket
    file left by a dead server refuses the connection)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def parse_command_line(argv: list[str]) -> tuple[str | None, list[str]]:
    """[config file] [--directive value ...] as redis-server takes them."""
    if argv and not argv[0].startswith("--"):
        return argv[0], argv[1:]
    return None, argv


def load_config(argv: list[str]) -> Config:
    path, args = parse_command_line(argv)
    config = Config()
    if path is not None:
        config.load_file(path)
    config.apply_args(args)
    config.check()
    apply_renames(config)
    return config


def apply_renames(config: Config) -> None:
    """The file's and the arguments' rename-command lines, in their order
    (as Redis applies them while it reads the file)."""
    from rcp11.commands import rename_command

    for old, new, source, line, text in config.renames:
        try:
            rename_command(old, new)
        except ValueError as exc:
            raise ConfigError(str(exc), source=source, line=line, text=text) from None


def daemonize() -> None:
    """Detach like redis-server: double fork so the daemon is not a session
    leader (cannot reacquire a terminal), stdio to /dev/null."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)


def write_pidfile(path: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(f"{os.getpid()}\n")
        return True
    except OSError as exc:
        log.warning("Failed to write PID file: %s", exc.strerror)
        return False


def adjust_open_files_limit(config: Config) -> None:
    """Raise the soft RLIMIT_NOFILE so maxclients connections fit; if the
    hard limit does not allow it, lower maxclients as Redis does."""
    try:
        import resource
    except ImportError:
        return
    wanted = config.get("maxclients") + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError):
        pass
    if soft < wanted:
        allowed = max(1, soft - RESERVED_FDS)
        log.warning(
            "You requested maxclients of %d requiring at least %d max file descriptors; "
            "the limit is %d, so maxclients is now %d.",
            config.get("maxclients"),
            wanted,
            soft,
            allowed,
        )
        config.set("maxclients", str(allowed))
    else:
        log.log(VERBOSE, "Increased maximum number of open files to %d", soft)


def persistence_mode(config: Config) -> str:
    parts = []
    if config.get("appendonly"):
        parts.append(
            f"AOF ({config.get('appendfilename')}, appendfsync {config.get('appendfsync')})"
        )
    rules = config.get("save")
    if rules:
        parts.append("snapshots (save " + " ".join(f"{s} {c}" for s, c in rules) + ")")
    return " + ".join(parts) if parts else "none (data is lost on restart)"


def run(config: Config) -> int:
    """Everything after the configuration is known; returns the exit code."""
    if config.get("daemonize"):
        daemonize()
    setup_logging(config)
    pid = os.getpid()
    log.info("oO0OoO0OoO0Oo rcp11 is starting oO0OoO0OoO0Oo")
    log.info("rcp11 version=%s, bits=64, pid=%d, just started", __version__, pid)
    if config.path:
        log.info("Configuration loaded (file '%s')", config.path)
    else:
        log.warning(
            "Warning: no config file specified, using the default config. In order to "
            "specify a config file use rcp11-server /path/to/redis.conf"
        )
    adjust_open_files_limit(config)
    # Relative pidfile and logfile paths mean the directory the server was
    # started from, not `dir`.
    pidfile = os.path.abspath(config.get("pidfile")) if config.get("pidfile") else ""
    try:
        os.chdir(config.get("dir"))
    except OSError as exc:
        log.warning("Can't chdir to '%s': %s", config.get("dir"), exc.strerror)
        return 1
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    # Wired here, explicitly: the state, the front end on it, and the
    # persistence engine, which replays the AOF through the command layer.
    state = ServerState(config)
    server = Server(state, loop)
    persistence = Persistence(state, execute)
    state.persistence = persistence
    # The order matters (as redis-server): the port first, so "Address
    # already in use" comes before any data is read; then the data
    # directory's lock, so a second server on a directory in use stops
    # before it touches a file there (it once deleted the running server's
    # temporary files); then the unix socket and the pidfile; then the data.
    try:
        server.bind_tcp()
        persistence.lock_dir()
        server.bind_unix()
    except (SystemExit, PersistenceError) as exc:
        log.warning("%s", exc)
        loop.close()
        return 1
    if pidfile:
        if not write_pidfile(pidfile):
            pidfile = ""
    log.info("rcp11 %s running standalone, port %d, pid %d", __version__, config.get("port"), pid)
    log.info("Persistence: %s", persistence_mode(config))
    log.info("Server initialized")
    try:
        persistence.load()
        state.apply_stream_settings()
    except Exception as exc:
        log.warning("Fatal error loading the data on disk: %s. Exiting.", exc)
        log.debug("Details:", exc_info=True)
        _remove_pidfile(pidfile)
        loop.close()
        return 1

    try:
        loop.run_until_complete(server.serve())
    except SystemExit as exc:
        log.warning("%s", exc)
        _remove_pidfile(pidfile)
        loop.close()
        return 1
    for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
        loop.add_signal_handler(signum, server.on_signal, name)
    server.start_cron()
    if config.get("port"):
        log.info("Ready to accept connections tcp")
    if server.unix_path:
        log.info("Ready to accept connections unix")
    try:
        loop.run_forever()
    finally:
        _remove_pidfile(pidfile)
        log.warning("rcp11 is now ready to exit, bye bye...")
        loop.close()
    return server.exit_code


def _remove_pidfile(path: str) -> None:
    if path:
        log.info("Removing the pid file.")
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args and args[0] in ("-v", "--version"):
        print(
            f"rcp11 server v={__version__} python={sys.version.split()[0]} "
            f"bits={64 if sys.maxsize > 2**32 else 32}"
        )
        return 0
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(exc.fatal_message(), file=sys.stderr)
        return 1
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
