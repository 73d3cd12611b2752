"""The C lane's event loop (src/netloop.c) inside the server: plain TCP and
unix socket connections are read, run through the C lane and answered in
C, with one Python call per batch of ready connections instead of one per
request.

    netloop = NetLoop(server)          # None of it if epoll is refused
    netloop.listen(sock, unix_path)    # accept here instead of asyncio
    ...
    netloop.flush() / drop_unflushed() # from Server.flush, after persistence

uvloop watches the C loop's epoll descriptor; when it is readable,
poll() sets what no request can change (lane_open_to_all(),
lane_writes()), lets C read every ready connection once and run the lane,
folds what the lane did into the server's state (count_lane(): counters,
AOF bytes, touched keys), and flushes. What the lane does not run reaches
the connection's own Connection.data_received() through the data callback,
exactly as asyncio would have delivered it; afterwards the connection tells
C whether the lane may run its next read (Connection.sync_lane()).

CTransport gives a Connection what it uses of an asyncio transport, so
connection.py runs the same on both; TLS connections stay asyncio's.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from typing import Any

from rcp11 import errors
from rcp11.commands.lane import (
    count_lane,
    lane_open_to_all,
    lane_writes,
    note_lane_slow,
    resolve_key,
)
from rcp11.errors import ProtocolError
from rcp11.limits import (
    DEFAULT_MAX_MULTIBULK_LEN,
    LANE_MAX_CARRY,
    LANE_MAX_COMMANDS,
    LANE_RUN_REPLY_BYTES,
)
from rcp11.resp import RequestParser
from rcp11.server.connection import Connection, Front
from rcp11.storage.lane import Answer
from rcp11.storage.netloop import CConnection, CLoop


class LoopOwner(Front):
    """What the C loop asks of the server (listeners.py's Server) beyond a
    connection's needs: written here so that this file does not look up at
    it."""

    flush_scheduled: bool  # a flush is queued for this loop iteration

    def flush(self) -> None:
        """Persistence first, then every connection's replies (Server.flush)."""


log = logging.getLogger("rcp11")

# The most bytes of one unfinished request C holds for the lane before the
# parser takes them (and applies client-query-buffer-limit): a Kafka-style
# batch of hundreds of entries fits many times over, a 512 MB value is the
# parser's.
CARRY_LIMIT = 4 << 20
# Polls the C loop makes per call from uvloop while the lane needs nothing
# of Python: one request at a time (-P 1, 50 clients), new requests arrive
# while a poll's replies are written, and serving them in C saves the
# callback, the switches and the fold of a batch per poll (server CPU per
# request: TWRITE 5.6 -> 5.0 us, TREAD 100 9.1 -> 7.8 us). Bounded in
# number and time so that timers and asyncio's connections keep their turn.
POLL_ROUNDS = 8
POLL_ROUNDS_USEC = 1000
# Connections accepted per listener callback (Redis: MAX_ACCEPTS_PER_CALL).
ACCEPTS_PER_CALL = 1000
# Out of descriptors: accepting pauses this long instead of spinning.
ACCEPT_PAUSE = 0.1

_LAST_COMMAND = {1: "twrite", 2: "tread"}


class _SocketView:
    """get_extra_info("socket") of a CTransport: the descriptor's number
    and setsockopt() (keepalive), without owning it (C closes it)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def setsockopt(self, *args: Any) -> None:
        sock = socket.socket(fileno=self._fd)
        try:
            sock.setsockopt(*args)
        finally:
            sock.detach()


class CTransport:
    """The asyncio.Transport methods a Connection uses, on a socket the C
    loop owns. Writes are Python's replies, called after the AOF flush
    (Server.flush), as asyncio's are."""

    def __init__(self, netloop: NetLoop, fd: int, peer: Any, local: Any) -> None:
        self.netloop = netloop
        self._conn: CConnection | None = CConnection(netloop.cloop, fd, self)
        self.protocol: Connection | None = None
        self._extra = {"peername": peer, "sockname": local, "socket": _SocketView(fd)}
        self._closing = False

    # -- what asyncio offers --------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def write(self, data: bytes) -> None:
        if self._conn is not None and data:
            self._conn.write(data)

    def get_write_buffer_size(self) -> int:
        return self._conn.pending() if self._conn is not None else 0

    def set_write_buffer_limits(self, high: int, low: int | None = None) -> None:
        # One mark for both, as the server sets them (TRANSPORT_WATER).
        if self._conn is not None:
            self._conn.set_water(high)

    def pause_reading(self) -> None:
        if self._conn is not None:
            self._conn.pause_reading(True)

    def resume_reading(self) -> None:
        if self._conn is not None:
            self._conn.pause_reading(False)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True
        if self._conn is not None:
            self._conn.close(abort=False)

    def abort(self) -> None:
        self._closing = True
        if self._conn is not None:
            self._conn.close(abort=True)

    # -- the C loop's own ------------------------------------------------------

    def set_lane(self, ok: bool, output_mark: int, parser: RequestParser) -> None:
        """Whether the lane may run this connection's next read (see
        Connection.sync_lane()). The start of a request the parser holds is
        handed back to C with it, as run_lane() carries it: a pipeline read
        in pieces that end mid-request stays in the lane."""
        conn = self._conn
        if conn is None:
            return
        limit = parser.query_buffer_limit
        carry = min(CARRY_LIMIT, limit) if limit else CARRY_LIMIT
        if ok and not parser.idle():
            # Only the start of one request goes back: complete requests
            # the parser was fed (while the client was blocked, say) are
            # run by process(), never left waiting in C for the next read.
            try:
                ready = parser.drain()
            except ProtocolError:
                ready = None  # it stays pending: process() answers it
            if ready:
                parser.push_back(ready)
            # At most LANE_MAX_CARRY, as run_lane() carries: a big request
            # the lane refuses late would otherwise go back and forth whole.
            held = parser.unparsed(min(carry, LANE_MAX_CARRY)) if ready == [] else None
            if held is None or not conn.carry(held):
                ok = False
            else:
                parser.skip(len(held))
        conn.set_lane(ok, max(output_mark, 0), carry)

    def carried(self) -> int:
        """Bytes of an unfinished request C holds (part of the query buffer)."""
        return self._conn.carried() if self._conn is not None else 0

    def refresh_client(self) -> None:
        """ClientState.refresh: the client's last command, last interaction
        and query buffer as C has them, where they are newer than what
        Python's own path set."""
        conn = self._conn
        protocol = self.protocol
        client = protocol.client if protocol is not None else None
        if conn is None or client is None:
            return
        # Python runs this connection's commands only after a hand-over,
        # which refreshes first: a command the lane ran since is the last.
        last, read_us = conn.activity()
        if last:
            client.last_command = _LAST_COMMAND[last]
        read_at = read_us / 1e6
        if read_at > client.last_interaction:
            client.last_interaction = read_at
        parser = protocol.parser  # type: ignore[union-attr]
        held = parser.buffered() if parser is not None else 0
        client.query_buffer_len = held + conn.carried()

    def on_closed(self, err: int) -> None:
        """The socket is closed: connection_lost() soon, as asyncio calls it."""
        netloop = self.netloop
        if not netloop.cloop.open:
            self.lost(err)  # the loop is gone: nothing runs it later
            return
        if not netloop.closed:
            netloop.server.loop.call_soon(netloop.settle)
        netloop.closed.append((self, err))

    def on_water(self, over: int) -> None:
        """Pending output passed the water mark (pause_writing, at once, as
        asyncio) or drained back to it (resume_writing, soon: it may run
        commands, which must not happen inside a C poll); or a flush would
        have taken it past the hard limit (2: closed as Python's write closes)."""
        protocol = self.protocol
        if protocol is None:
            return
        if over == 2:
            transport = protocol.transport
            pending = transport.get_write_buffer_size() if transport is not None else 0
            protocol.client_over_limit(f"hard limit {protocol.server.output_limits[0]}", pending)
        elif over:
            protocol.pause_writing()
        else:
            self.netloop.server.loop.call_soon(protocol.resume_writing)

    def lost(self, err: int) -> None:
        """connection_lost(), then the C connection is freed."""
        protocol = self.protocol
        exc = OSError(err, os.strerror(err)) if err else None
        try:
            if protocol is not None:
                protocol.connection_lost(exc)
        finally:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.free()


class _Listener:
    """A listening socket whose connections go to the C loop (what
    loop.create_server() was for them)."""

    def __init__(self, netloop: NetLoop, sock: socket.socket, unix_path: str | None) -> None:
        self.netloop = netloop
        self.sock = sock
        self.unix_path = unix_path
        self.closed = False
        sock.setblocking(False)
        netloop.server.loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        netloop = self.netloop
        # Connections that closed meanwhile leave first, so maxclients
        # counts only those still there (asyncio sees their end first too).
        netloop.poll()
        netloop.settle()
        for _ in range(ACCEPTS_PER_CALL):
            try:
                conn_sock, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("Accepting client connection: %s", exc.strerror or exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    loop = netloop.server.loop
                    loop.remove_reader(self.sock.fileno())
                    loop.call_later(ACCEPT_PAUSE, self._resume)
                return
            netloop.adopt(conn_sock, self.unix_path)

    def _resume(self) -> None:
        if not self.closed:
            self.netloop.server.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.netloop.server.loop.remove_reader(self.sock.fileno())
        self.sock.close()


class NetLoop:
    """The C loop of one server: its connections, the poll callback and the
    fold of each batch into the server's state."""

    def __init__(self, server: LoopOwner) -> None:
        self.server = server
        self.state = server.state
        self.cloop = CLoop(self)
        # Transports whose socket closed, with the error: connection_lost()
        # is called soon (settle()), as asyncio calls it, never inside C.
        self.closed: list[tuple[CTransport, int]] = []
        self.limits_changed()
        server.loop.add_reader(self.cloop.fd(), self.poll)

    def close(self) -> None:
        self.server.loop.remove_reader(self.cloop.fd())
        self.cloop.close()

    def limits_changed(self) -> None:
        """proto-max-bulk-len (the lane runs authenticated clients only:
        their parsers allow any argument count), the replies a poll builds,
        the output's hard limit and lane-coalesce-usec."""
        max_bulk = self.state.config.get("proto-max-bulk-len")
        self.cloop.set_limits(
            max_bulk, DEFAULT_MAX_MULTIBULK_LEN, LANE_MAX_COMMANDS, LANE_RUN_REPLY_BYTES
        )
        self.cloop.set_hard_limit(self.server.output_limits[0])
        self.cloop.set_coalesce(self.state.config.get("lane-coalesce-usec"))

    def listen(self, sock: socket.socket, unix_path: str | None = None) -> _Listener:
        return _Listener(self, sock, unix_path)

    def adopt(self, sock: socket.socket, unix_path: str | None) -> None:
        """A connection accepted on one of the listeners: the C loop owns
        its socket from now on; the Connection is made as asyncio makes it."""
        try:
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer, local = sock.getpeername(), sock.getsockname()
        except OSError:
            sock.close()  # gone before it was served
            return
        fd = sock.detach()
        try:
            transport = CTransport(self, fd, peer, local)
        except OSError as exc:
            os.close(fd)
            log.warning("Accepting client connection: %s", exc.strerror or exc)
            return
        protocol = Connection(self.server, unix_path)
        transport.protocol = protocol
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.sync_lane()

    # -- the batch ---------------------------------------------------------------

    def settle(self) -> None:
        """connection_lost() for every connection whose socket closed."""
        closed, self.closed = self.closed, []
        for transport, err in closed:
            transport.lost(err)

    def set_switches(self) -> None:
        state = self.state
        if lane_open_to_all(state):
            flags, room, memory_room = lane_writes(state)
            # A pinned append time holds in the lane as on the general path.
            self.cloop.lane_on(flags, room, memory_room, state.slow_usec, state.append_ms)
        else:
            self.cloop.lane_off()

    def poll(self) -> None:
        """uvloop's callback: the C loop's descriptor is readable."""
        server = self.server
        server.now = time.time()
        self.set_switches()
        cloop = self.cloop
        if server.flush_scheduled or not self.state.persistence.flushed():
            # Python's work is not flushed yet (AOF bytes, offset
            # reservations), or flushes fail (a reply must not show what
            # is not logged): the lane's replies wait for Server.flush.
            cloop.run(1, 0)
        else:
            cloop.run(POLL_ROUNDS, POLL_ROUNDS_USEC)
        if cloop.batch_pending():
            self.fold()
        if cloop.dirty() and not server.flush_scheduled:
            server.flush()

    def fold(self) -> None:
        """What the lane ran since the last fold, into the server's state:
        counters, AOF bytes, touched keys, each client's last command."""
        cloop = self.cloop
        state = self.state
        counts = cloop.counts()
        written: list[tuple[bytes, Any]] = []
        aof: list[tuple[int | None, bytes]] = []
        group_changes = counts.group_changes
        if counts.twrite_calls or group_changes:
            written = cloop.written()
            aof = cloop.aof_runs()
        count_lane(state, counts, written, aof, group_changes)  # type: ignore[arg-type]
        if counts.aof_failed:
            log.error("The C lane's AOF bytes could not be kept (no memory)")
            state.writes_refused = errors.UNLOGGED_CHANGE
        stats = state.stats
        stats.total_net_input_bytes += counts.net_input_bytes
        stats.total_net_output_bytes += counts.net_output_bytes
        for transport, request, usec in cloop.slow():
            protocol = transport.protocol if transport is not None else None
            if protocol is not None and protocol.client is not None:
                note_lane_slow(state, protocol.client, request, usec)
        # Each client's last command, idle time and query buffer stay in C
        # until something shows them (CTransport.refresh_client): no Python
        # work per request.
        cloop.reset_batch()

    def flush(self) -> None:
        """Write every connection's output (after persistence.flush())."""
        self.cloop.flush()

    def drop_unflushed(self) -> None:
        """The AOF could not take this batch's writes: no reply of it
        leaves, and those clients are closed (as Server.drop_unlogged())."""
        cloop = self.cloop
        if cloop.batch_pending():
            self.fold()
        closed, owners = cloop.drop_unflushed()
        for transport in owners:
            protocol = transport.protocol
            if protocol is not None and protocol.client is not None:
                protocol.client.closing = True
        cloop.reset_batch()
        if closed:
            log.warning(
                "Writes could not be logged to the AOF: dropped the replies of %d "
                "client(s) of the C lane and closed them.",
                closed,
            )

    # -- what the C loop asks (rcp11/storage/netloop.py's callbacks) -------------

    def resolve(self, key: bytes) -> Answer:
        # Lease reads and TACKs of acknowledged groups run in the lane too.
        return resolve_key(self.state, key, True)

    def on_data(self, transport: CTransport, data: bytes) -> None:
        """Bytes the lane did not run: the general path's, in order."""
        try:
            cloop = self.cloop
            if cloop.batch_pending():
                self.fold()  # the AOF and the counters first, in the order things ran
            else:
                cloop.resolved.clear()
            protocol = transport.protocol
            if protocol is not None:
                # What the lane ran comes before what Python runs now.
                transport.refresh_client()
                protocol.data_received(data)
                protocol.sync_lane()
            self.set_switches()
        except Exception:
            log.exception("Error serving a connection of the C lane's loop")


__all__ = ["CARRY_LIMIT", "CTransport", "NetLoop"]
