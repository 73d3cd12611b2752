"""One client connection: the read path, the pipeline's turn, and the
client's output.

The read path is data_received() -> process(): the bytes read go to the
connection's RequestParser, and the complete commands it hands out run
through the command layer's one entry point, rcp11.commands.run_pipeline(),
which queues their encoded replies in `out`. Nothing here knows a command's
name or formats a reply: that is the command layer's. Replies are written
by the server's flush, once per event-loop iteration, after persistence
(listeners.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from time import perf_counter
from typing import Any, Protocol

from rcp11.commands import (
    Stop,
    client_line,
    late_reply,
    protocol_error_reply,
    run_buffered,
    run_lane,
    run_pipeline,
)
from rcp11.commands.lane import lane_open_to
from rcp11.errors import ProtocolError
from rcp11.limits import TRANSPORT_WATER, TURN_SECONDS
from rcp11.logs import VERBOSE
from rcp11.resp import QueryBufferLimitError, RequestParser
from rcp11.server.admission import admit
from rcp11.server.output_limits import limit_passed, next_output_mark
from rcp11.state import ClientState, ServerState

log = logging.getLogger("rcp11")


class Front(Protocol):
    """What a connection asks of the server that accepted it (listeners.py's
    Server): written here so that this file does not look up at it."""

    state: ServerState
    loop: asyncio.AbstractEventLoop
    now: float  # time.time() at the last read or cron tick
    output_limits: tuple[int, int, int]  # client-output-buffer-limit normal
    connections: dict[int, Connection]

    def want_flush(self, conn: Connection) -> None:
        """Write conn's queued replies at the end of this loop iteration."""

    def forget(self, client: ClientState) -> None:
        """The connection is gone: drop its client everywhere."""

    def set_keepalive(self, sock: Any) -> None:
        """TCP keepalive per the tcp-keepalive directive."""


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

    def __init__(self, server: Front, unix_path: str | None = None) -> None:
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
        self.output_mark = next_output_mark(server.output_limits, 0)
        # Since when the output has been over the soft limit (0: it is not).
        self.soft_limit_since = 0.0
        self.check_auth = False
        # A transport of the C lane's loop (rcp11/server/netloop.py) takes
        # this connection's lane switch; None for asyncio's.
        self._set_lane: Any = None

    # -- asyncio callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        state = server.state
        config = state.config
        self.transport = transport  # type: ignore[assignment]
        self._set_lane = getattr(transport, "set_lane", None)
        client = admit(state, transport, self.unix_path)
        if client is None:
            self.closed = True
            return
        client.send = self.send
        client.close = self.close_soon
        client.on_unblocked = self.on_unblocked
        client.output_room = self.output_room
        client.output_overflow = self.output_overflow
        refresh = getattr(transport, "refresh_client", None)
        if refresh is not None:
            client.refresh = refresh
        self.client = client
        sock = transport.get_extra_info("socket")
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
        """The read path, the one place bytes read become commands: the C
        lane (commands.run_lane) runs the TWRITEs and TREADs it can straight
        from the read buffer (with the start of a request the parser holds
        from the last read), for a runnable client; what it did not run goes
        to the parser unchanged, and the complete commands it hands out to
        process() -> run_pipeline()."""
        client = self.client
        if client is None or self.closed:
            return
        server = self.server
        server.state.stats.total_net_input_bytes += len(data)
        client.last_interaction = server.now = time.time()
        parser = self.parser
        runnable = client.blocked is None and not client.closing and self.held is None
        commands: list[list[bytes]] | None = None
        if runnable and self.backlog is None and self._set_lane is None:
            # (The C lane's loop ran its lane on these bytes already.)
            queued = self.out_bytes
            consumed, self.out_bytes = run_lane(
                server.state, client, parser, data, self.out, queued, self.lane_mark()
            )
            if self.out_bytes != queued:
                server.want_flush(self)
            if consumed:
                if consumed == len(data):
                    client.query_buffer_len = parser.buffered()  # type: ignore[union-attr]
                    return
                # The rest waits in the parser: process() gives the lane
                # another go at it (it stopped for its budget, or at a
                # request it leaves to the general path).
                try:
                    parser.feed(data[consumed:])  # type: ignore[union-attr]
                except QueryBufferLimitError:
                    self.query_buffer_over_limit()
                    return
                self.process()
                return
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
            self.query_buffer_over_limit()
            return
        if runnable:
            self.process(commands)

    def query_buffer_over_limit(self) -> None:
        client, parser = self.client, self.parser
        if client is None or parser is None:
            return
        log.warning(
            "Closing client that reached max query buffer length: id=%d addr=%s qbuf=%d",
            client.id,
            client.addr,
            parser.buffered(),
        )
        self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.out.clear()
        self.out_bytes = 0
        self.backlog = None
        if self.parser is not None:
            self.parser.drop()
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
                    # What the parser holds goes to the C lane first, as a
                    # read does (data_received): a long pipeline runs there
                    # across its turns, not only in its first read.
                    consumed, out_bytes = run_buffered(state, client, parser, out, out_bytes, mark)
                    if consumed:
                        ran = True
                        if out_bytes > mark:
                            self.out_bytes = out_bytes
                            if not self.may_go_on(base + out_bytes, False):
                                break  # closed, or held until its output drains
                            mark = self.output_mark - base
                        continue
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
        limits = self.server.output_limits
        reason, self.soft_limit_since = limit_passed(
            limits, pending, self.soft_limit_since, time.time()
        )
        if reason is not None:
            self.client_over_limit(reason, pending)
            return False
        self.output_mark = next_output_mark(limits, pending)
        if pending > self.output_mark:
            self.hold("output")
            return False
        return True

    def hold(self, reason: str) -> None:
        """Stop running this client's commands (the rest wait in backlog)
        and reading its socket until release()."""
        self.held = reason
        self.sync_lane()
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
        self.sync_lane()

    # -- hooks installed into ClientState -------------------------------------

    def send(self, reply: Any) -> None:
        """A reply produced outside this client's own pipeline (blocking)."""
        client = self.client
        if client is None or self.closed:
            return
        data = late_reply(client, reply)
        self.out.append(data)
        self.out_bytes += len(data)
        self.sync_lane()
        self.server.want_flush(self)

    def output_room(self) -> int | None:
        """Bytes of reply the client may still be given before it passes
        its hard output limit (ClientState.output_room); None: no limit."""
        hard = self.server.output_limits[0]
        if not hard or self.transport is None or self.client is None:
            return None
        pending = self.transport.get_write_buffer_size() + self.out_bytes
        return hard - pending - self.client.output_building

    def output_overflow(self, extra: int) -> None:
        """extra bytes of reply, not queued here, took the client past its
        hard output limit: close it at once (ClientState.output_overflow)."""
        pending = extra + self.out_bytes
        if self.transport is not None:
            pending += self.transport.get_write_buffer_size()
        if self.client is not None:
            pending += self.client.output_building
        self.client_over_limit(f"hard limit {self.server.output_limits[0]}", pending)

    def close_soon(self) -> None:
        """Close once the output queued so far is written (CLIENT KILL)."""
        if self.client is not None:
            self.client.closing = True
        self.close_after_write = True
        self.sync_lane()
        self.server.want_flush(self)

    def on_unblocked(self) -> None:
        # Not inline: the blocking manager calls this while it iterates its
        # own structures, and running the pipeline may block again.
        self.server.loop.call_soon(self._resume)

    def _resume(self) -> None:
        client = self.client
        if client is None or client.blocked is not None or client.closing:
            return
        parser = self.parser
        if self.backlog is not None or (parser is not None and not parser.idle()):
            self.process()  # its pipeline went on behind the blocked read
        self.sync_lane()

    def sync_lane(self) -> None:
        """Tell the C lane's loop (src/netloop.c) whether its lane may run
        this connection's next read: only while nothing of the connection
        waits in Python (parsed commands, replies not handed to the
        transport yet; the start of a request goes back to C) and the
        client could run a lane request now. C turns it off at every
        hand-over; this turns it on."""
        set_lane = self._set_lane
        if set_lane is None:
            return
        client = self.client
        parser = self.parser
        if client is None or parser is None:
            set_lane(False, 0, 0)
            return
        set_lane(
            not self.closed
            and not self.close_after_write
            and not client.closing
            and client.blocked is None
            and self.held is None
            and self.backlog is None
            and not self.out
            and not parser.unauthenticated
            and lane_open_to(self.server.state, client),
            self.output_mark,
            parser,
        )

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
        self.output_mark = next_output_mark(self.server.output_limits, buffered)
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
        self.sync_lane()

    def check_output_limits(self, now: float) -> None:
        """The soft limit's timer, from the cron and after each write (the
        hard limit is checked before every command and every write)."""
        transport = self.transport
        client = self.client
        if transport is None or client is None or self.closed:
            return
        pending = transport.get_write_buffer_size() + self.out_bytes
        client.output_buffer_len = pending
        reason, self.soft_limit_since = limit_passed(
            self.server.output_limits, pending, self.soft_limit_since, now
        )
        if reason is not None:
            self.client_over_limit(reason, pending)

    def client_over_limit(self, reason: str, pending: int) -> None:
        client = self.client
        if client is not None:
            client.output_buffer_len = pending
            client.output_dropped = True
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
