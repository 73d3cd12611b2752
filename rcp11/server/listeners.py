"""The server's front: listeners (bound before the data loads, served after,
rebound by CONFIG SET port/bind), the connections, the flush that writes
every reply once per event-loop iteration, the cron and shutdown.

Replies are not written when a command runs: every connection with output
is flushed by one callback per event-loop iteration, which first calls
persistence.flush(). That is Redis's beforeSleep: the AOF holds every write
before its reply leaves, and with appendfsync always one fsync covers all
the commands of the iteration (group commit).

A cron at `hz` does what Redis's serverCron does here: blocked-client
timeouts, persistence ticks, idle-client timeouts, output buffer soft limits
and key expiry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

from rcp11 import errors, tls
from rcp11.commands import client_disconnected, expire_keys, serve_ready
from rcp11.config import ConfigError
from rcp11.logs import VERBOSE, set_level
from rcp11.server.connection import Connection
from rcp11.server.netloop import NetLoop
from rcp11.server.output_limits import next_output_mark
from rcp11.server.sockets import bind_tcp_addresses, bind_unix_socket
from rcp11.server.trim import MemoryTrim
from rcp11.state import ClientState, ServerState

log = logging.getLogger("rcp11")

# The longest wait of CLIENT PAUSE's timer before it looks again (a pause
# may be given for longer than the event loop's timers take).
PAUSE_RECHECK = 3600.0


class Server:
    """Listeners, connections, the flush callback and the cron."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.loop = loop
        self.connections: dict[int, Connection] = {}
        self.listeners: list[Any] = []  # asyncio's servers, the C loop's listeners
        # The C lane's event loop (netloop.py): plain TCP and unix socket
        # connections are its own unless lane-sockets is no.
        self.netloop: NetLoop | None = None
        # (host, port) -> its listener (None until create_server finished).
        self.tcp_listeners: dict[tuple[str, int], Any] = {}
        self.unix_path: str | None = None
        self.tls: tls.Bound | None = None
        # Bound at start-up before loading, served after (bind_*, serve).
        self._bound_tcp: dict[tuple[str, int], socket.socket] = {}
        self._bound_unix: socket.socket | None = None
        self.pending: list[Connection] = []
        self.flush_scheduled = False
        self.serve_scheduled = False
        self.now = time.time()
        self.block_timer: asyncio.TimerHandle | None = None
        self.block_timer_at = 0.0
        self.pause_timer: asyncio.TimerHandle | None = None
        self.cron_handle: asyncio.TimerHandle | None = None
        self.stopping = False
        self.exit_code = 0
        self.trim = MemoryTrim()
        # When the cron next measures the heap for used_memory_peak (below).
        self.memory_due = 0.0
        self.output_limits = state.config.get("client-output-buffer-limit")["normal"]
        config = state.config
        config.on_change("client-output-buffer-limit", self._limits_changed)
        config.on_change("proto-max-bulk-len", self._parser_limits_changed)
        config.on_change("client-query-buffer-limit", self._parser_limits_changed)
        config.on_change("loglevel", set_level)
        config.on_change("dir", self._dir_changed)
        config.on_change("port", self._rebind)
        config.on_change("bind", self._rebind)
        config.on_change("lane-coalesce-usec", self._coalesce_changed)
        state.request_shutdown = self.request_shutdown
        state.pause.arm = self._arm_pause
        state.pause.on_end = self._pause_ended

    # -- config reactions -------------------------------------------------------

    def _limits_changed(self, value: dict[str, tuple[int, int, int]]) -> None:
        self.output_limits = value["normal"]
        if self.netloop is not None:
            self.netloop.limits_changed()
        for conn in self.connections.values():
            conn.output_mark = next_output_mark(
                self.output_limits, 0
            )  # looked at again by the next command
            conn.sync_lane()

    def _coalesce_changed(self, _value: Any) -> None:
        if self.netloop is not None:
            self.netloop.limits_changed()

    def _parser_limits_changed(self, _value: Any) -> None:
        config = self.state.config
        if self.netloop is not None:
            self.netloop.limits_changed()
        for conn in self.connections.values():
            if conn.parser is not None:
                conn.parser.max_bulk_len = config.get("proto-max-bulk-len")
                conn.parser.query_buffer_limit = config.get("client-query-buffer-limit")
            conn.sync_lane()

    @staticmethod
    def _dir_changed(path: str) -> None:
        # As Redis: the working directory is where files are written.
        try:
            os.chdir(path)
        except OSError as exc:
            raise ConfigError(errors.cant_chdir(path, exc.strerror or str(exc))) from None

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
                _, sockets = bind_tcp_addresses(config.get("bind"), port, {})
            except OSError as exc:
                raise SystemExit(f"Failed listening on port {port} (tcp), aborting.") from exc
            if not sockets:
                raise SystemExit(f"Failed listening on port {port} (tcp), aborting.")
            self._bound_tcp = sockets
        # tls-port: TLS listeners beside the TCP ones
        self.tls = tls.bind(config, lambda binds, port: bind_tcp_addresses(binds, port, {})[1])

    def bind_unix(self) -> None:
        """Bind and listen on the unix socket, if configured. A socket file
        that a live server answers on is not taken over. Raises SystemExit."""
        config = self.state.config
        path = config.get("unixsocket")
        if not path:
            return
        self._bound_unix = bind_unix_socket(path, config.get("unixsocketperm"))
        self.unix_path = path

    async def serve(self) -> None:
        """Start accepting on everything bind_tcp()/bind_unix() bound."""
        if self.state.config.get("lane-sockets"):
            try:
                self.netloop = NetLoop(self)
            except OSError as exc:
                log.warning("Serving every connection through asyncio: %s", exc)
        for address, sock in self._bound_tcp.items():
            await self._serve_tcp(address, sock)
        self._bound_tcp = {}
        if self._bound_unix is not None:
            path = self.unix_path
            if self.netloop is not None:
                listener: Any = self.netloop.listen(self._bound_unix, path)
            else:
                listener = await self.loop.create_unix_server(
                    lambda: Connection(self, path), sock=self._bound_unix, backlog=511
                )
            self._bound_unix = None
            self.listeners.append(listener)
        if self.tls is not None:
            self.listeners += await self.tls.serve(self.loop, lambda: Connection(self))
        if not self.listeners:
            raise SystemExit("Configured to not listen anywhere, exiting.")
        self.state.tcp_port = self.state.config.get("port")

    async def _serve_tcp(self, address: tuple[str, int], sock: socket.socket) -> None:
        if self.netloop is not None:
            listener: Any = self.netloop.listen(sock)
        else:
            listener = await self.loop.create_server(
                lambda: Connection(self), sock=sock, backlog=511
            )
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
                wanted, bound = bind_tcp_addresses(config.get("bind"), port, self.tcp_listeners)
            except OSError:
                raise ConfigError(errors.BIND_FAILED) from None
            if not wanted:
                raise ConfigError(errors.BIND_FAILED)
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
        netloop = self.netloop
        if not logged:
            if netloop is not None:
                netloop.drop_unflushed()
            self.drop_unlogged(pending)
        else:
            for conn in pending:
                conn.queued_for_flush = False
                conn.write_pending()
            if netloop is not None:
                netloop.flush()  # the C lane's replies
        if self.state.blocking.ready and not self.serve_scheduled:
            # A wake-up that ran out of its slice (state.serve_seconds):
            # the next iteration serves on, after other clients' turns.
            self.serve_scheduled = True
            self.loop.call_soon(self._serve_more)
        self.arm_block_timer()

    def _serve_more(self) -> None:
        self.serve_scheduled = False
        try:
            serve_ready(self.state)
        except Exception:
            log.exception("Error serving blocked clients")
        if self.state.blocking.ready and not self.flush_scheduled:
            # Nothing served needs a flush, yet readers are left: go on.
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

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
        if not blocking.deadlines and not blocking.key_wakes:
            return
        deadline = blocking.next_deadline(with_wakes=not self.state.pause.writes_paused)
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
        self._expire_blocked()
        if self.pending and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)
        self.arm_block_timer()

    def _expire_blocked(self) -> None:
        """BLOCK timeouts, and the readers of keys whose wake-up time came
        (a lease ran out) served as a write would serve them (not while
        CLIENT PAUSE holds writes: serving a group reader moves its group)."""
        state = self.state
        state.blocking.expire(time.monotonic(), with_wakes=not state.pause.writes_paused)
        if state.blocking.ready:
            serve_ready(state)  # their replies wait for the flush, AOF first

    def _arm_pause(self, when: float) -> None:
        """CLIENT PAUSE: end it at `when` (time.monotonic() seconds); a very
        long one is looked at again every PAUSE_RECHECK seconds."""
        if self.pause_timer is not None:
            self.pause_timer.cancel()
        delay = min(max(0.0, when - time.monotonic()), PAUSE_RECHECK)
        self.pause_timer = self.loop.call_later(delay, self._pause_timeout)

    def _pause_timeout(self) -> None:
        self.pause_timer = None
        pause = self.state.pause
        if pause.current():  # not over yet (ends the pause when it is)
            self._arm_pause(pause.end_at)

    def _pause_ended(self) -> None:
        """The pause is over (timeout or CLIENT UNPAUSE): lease wake-ups
        that waited for it are served, and the timer goes."""
        if self.pause_timer is not None:
            self.pause_timer.cancel()
            self.pause_timer = None
        self.loop.call_soon(self._block_timeout)

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
            self._expire_blocked()
            state.persistence.tick(now)
            if expire_keys(state) and state.blocking.ready:
                # A deleted group or stream key may let waiting readers go on.
                serve_ready(state)
            if state.retention is not None:
                state.retention.cron(self.loop)
            self.client_timeouts(now)
            clock = time.monotonic()  # steps of the wall clock change no interval
            if clock >= self.memory_due:
                # mallinfo2() walks malloc's free blocks, more of them as the
                # data grows (1.5% of the server's CPU at 10 Hz with 60M
                # entries; 3% of a 2 s profile of TWRITE ENTRIES 100 one
                # request at a time): measured at most ~0.5% of the time. INFO
                # measures on its own.
                started = time.perf_counter()
                state.used_memory_peak()
                self.memory_due = clock + 200 * (time.perf_counter() - started)
            self.trim.tick(state.used_memory(), clock)
            state.sample_rates(clock)
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
            if timeout:
                client.refresh()
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
        if self.state.retention is not None:
            self.state.retention.cancel()
        self.loop.call_soon(self.loop.stop)
        return True

    def on_signal(self, signame: str) -> None:
        log.warning("Received %s scheduling shutdown...", signame)
        self.request_shutdown(None)
