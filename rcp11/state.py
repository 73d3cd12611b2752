"""Server-wide and per-connection state, shared by the command layer,
persistence and the network front end.

Nothing here does I/O. What reaches outside is wired in explicitly by whoever
builds the server: the server (rcp11/server/) fills in the callables that
reach sockets (ClientState.send, ClientState.close, ...), and the start-up
code sets ServerState.persistence to the persistence engine once both exist
(NullPersistence until then). The registry of blocked clients
(rcp11/blocking.py) and the keyspace (rcp11/keyspace.py, handed on from
here too) are part of the state from its construction.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rcp11 import errors
from rcp11.blocking import BlockingManager
from rcp11.diagnostics import SLOW_NEVER, LatencyMonitor, SlowLog, slow_threshold_usec
from rcp11.errors import CommandError
from rcp11.keyspace import Keyspace
from rcp11.libc import allocated_bytes
from rcp11.limits import LANE_MAX_COMMANDS
from rcp11.pause import ClientPause
from rcp11.storage import MAX_OFFSET, Stream, wall_ms
from rcp11.storage.lane import LaneCall

if TYPE_CHECKING:
    import asyncio

    from rcp11.config import Config


class PersistenceHooks(Protocol):
    """Everything the command layer and the server ask of persistence.
    rcp11.persistence.Persistence implements it for a real server;
    NullPersistence below keeps nothing (in-process use, and the state
    before start-up wires the real one in)."""

    # "off" while nothing is logged: callers may then skip propagate().
    aof_state: str

    def propagate(self, argv: list[bytes]) -> None:
        """Log one write command (already executed) to the AOF buffer."""

    def flush(self) -> bool:
        """Make everything propagated so far durable per appendfsync; the
        server calls it before it sends any reply. False when that failed:
        the replies of this iteration's writes must not leave."""

    def flushed(self) -> bool:
        """True when flush() would have nothing to log or sync and nothing
        failed: replies may then leave without it (the C loop's rounds)."""

    def before_stream_write(self, key: bytes, new_next_offset: int) -> None:
        """Called before a stream's next offset grows to new_next_offset.
        Raises rcp11.errors.CommandError (MISCONF) if the offset cannot be
        reserved durably; the write must then not happen."""

    def propagate_encoded(self, data: bytes) -> None:
        """Log write requests already in their AOF form (encode_command()
        of each, back to back): the C lane copies TWRITE requests verbatim."""

    def date_writes(self, ms: int) -> None:
        """The writes logged next were appended at unix time ms (the AOF
        logs an annotation when the last one said otherwise)."""

    def aof_room(self) -> int:
        """AOF bytes that may still be buffered before write_refused() must
        be asked again (it reserves the AOF's disk space ahead)."""

    def reserved_next_offset(self, key: bytes) -> int:
        """The highest next offset (capped at 2^63-1) the stream at key may
        reach without before_stream_write() (-1: every write must ask)."""

    def on_keys_removed(self, keys: Sequence[bytes]) -> None:
        """Keys (of any type) left the keyspace: DEL, FLUSH*, overwrite,
        RENAME source, TCONCAT's sources."""

    def write_refused(self) -> str | None:
        """The -MISCONF error text while writes must be refused, else None."""

    def info(self) -> dict[str, Any]:
        """Fields of INFO persistence, Redis's names."""

    def tick(self, now: float) -> None:
        """Periodic work (fsync everysec, save rules, rewrite, child reaping)."""

    def lastsave(self) -> int:
        """LASTSAVE: unix time of the last successful snapshot."""

    def save(self) -> str:
        """SAVE: a snapshot now; its status reply text. Raises CommandError."""

    def bgsave(self, schedule: bool) -> str:
        """BGSAVE [SCHEDULE]: its status reply text. Raises CommandError."""

    def bgrewriteaof(self) -> str:
        """BGREWRITEAOF: its status reply text. Raises CommandError."""

    def flushall(self) -> None:
        """FLUSHALL just emptied the keyspace (a snapshot in progress is stale)."""

    def shutdown(self, mode: str | None) -> bool:
        """Prepare to exit (mode "save", "nosave" or None: save if save rules
        exist). False when a required save failed: the server keeps running."""


class NullPersistence:
    """Persistence that keeps nothing. Writes go nowhere; SAVE, BGSAVE and
    BGREWRITEAOF answer that persistence is not available."""

    aof_state = "off"
    # Nothing is ever saved: LASTSAVE answers when this process started.
    _started = int(time.time())

    def propagate(self, argv: list[bytes]) -> None:
        pass

    def flush(self) -> bool:
        return True

    def flushed(self) -> bool:
        return True

    def before_stream_write(self, key: bytes, new_next_offset: int) -> None:
        pass

    def propagate_encoded(self, data: bytes) -> None:
        pass

    def date_writes(self, ms: int) -> None:
        pass

    def aof_room(self) -> int:
        return MAX_OFFSET

    def reserved_next_offset(self, key: bytes) -> int:
        return MAX_OFFSET

    def on_keys_removed(self, keys: Sequence[bytes]) -> None:
        pass

    def write_refused(self) -> str | None:
        return None

    def info(self) -> dict[str, Any]:
        return {}

    def tick(self, now: float) -> None:
        pass

    def lastsave(self) -> int:
        return self._started

    def save(self) -> str:
        raise CommandError(errors.NO_PERSISTENCE)

    def bgsave(self, schedule: bool) -> str:
        raise CommandError(errors.NO_PERSISTENCE)

    def bgrewriteaof(self) -> str:
        raise CommandError(errors.NO_PERSISTENCE)

    def flushall(self) -> None:
        pass

    def shutdown(self, mode: str | None) -> bool:
        return True


_client_ids = itertools.count(1)


@dataclass(eq=False)
class ClientState:
    """One connection. eq=False: clients are compared by identity and are
    hashable, so they can sit in sets and dict keys."""

    addr: str = "?"
    laddr: str = "?"
    # Connected over loopback (127.0.0.1, ::1) or the unix socket: what
    # enable-protected-configs local allows.
    local: bool = False
    fd: int = -1
    id: int = field(default_factory=lambda: next(_client_ids))
    name: bytes = b""
    resp: int = 2
    authenticated: bool = False
    db: int = 0
    created_at: float = field(default_factory=time.time)
    last_interaction: float = field(default_factory=time.time)
    last_command: str = "NULL"
    # MULTI/EXEC: queued is None outside a transaction; inside, each queued
    # command as (its row in the command table, argv, and for a command the
    # C lane runs its request encoded, which EXEC hands to the lane).
    # Whether a queued command may write a key / grow memory, noted as it is
    # queued, so EXEC's check does not look at every queued command again.
    queued: list[tuple[Any, list[bytes], bytes | None]] | None = None
    queued_outside_lane: list[int] = field(default_factory=list)  # their indexes in queued
    queued_write: bool = False
    queued_denyoom: bool = False
    multi_error: bool = False
    watched: set[bytes] = field(default_factory=set)
    dirty_cas: bool = False
    # Set by rcp11.blocking while this client waits; the server stops
    # reading this client's pipelined commands until it is cleared.
    blocked: Any = None
    # Set while EXEC runs the client's transaction: a blocking command then
    # answers at once instead of waiting (Redis's CLIENT_DENY_BLOCKING).
    deny_blocking: bool = False
    closing: bool = False
    # Filled by the server: send() encodes one reply for this client's
    # protocol and queues it on the socket; close() drops the connection
    # after pending output is written; on_unblocked() resumes the pipeline.
    send: Callable[[Any], None] = lambda reply: None
    close: Callable[[], None] = lambda: None
    on_unblocked: Callable[[], None] = lambda: None
    # refresh() brings last_interaction, last_command and query_buffer_len
    # up to date where the server keeps them elsewhere (the C lane's event
    # loop keeps them in C rather than pay a Python call per request):
    # called before they are shown or acted on.
    refresh: Callable[[], None] = lambda: None
    # Filled by the server too, for a command that builds its reply in
    # parts (EXEC): output_room() is how many bytes of reply the client may
    # still be given before it passes its hard output limit (None: it has
    # none); output_overflow(n) closes it at once, n bytes over, as Redis's
    # closeClientOnOutputBufferLimitReached() does from addReply.
    output_room: Callable[[], int | None] = lambda: None
    output_overflow: Callable[[int], None] = lambda pending: None
    # Reply bytes built for the client but not queued yet (EXEC's, while it
    # runs): output_room() counts them.
    output_building: int = 0
    # Set when the client passed its output limit and is being closed:
    # nothing built for it from then on would be sent, so commands still
    # run for what they change, but build no reply (Redis drops the
    # replies of a client marked CLOSE_ASAP).
    output_dropped: bool = False
    # Counters for CLIENT LIST / INFO.
    query_buffer_len: int = 0
    output_buffer_len: int = 0
    # CLIENT SETINFO (redis-py sends it on connect), shown by CLIENT LIST.
    lib_name: bytes = b""
    lib_ver: bytes = b""
    # MONITOR: this client is sent every command the server runs.
    monitor: bool = False
    # The unix socket's path for a client connected through it (MONITOR
    # names such clients "unix:<path>", as Redis does).
    unix_path: str = ""


class InstantaneousRates:
    """Redis's instantaneous_* INFO fields: the mean per-second rate of a
    counter over the last 16 samples, taken by the server cron."""

    SAMPLES = 16

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}
        self._rates: dict[str, deque[float]] = {}

    def sample(self, name: str, value: int, now: float) -> None:
        last = self._last.get(name)
        if last is not None and now > last[0]:
            rates = self._rates.setdefault(name, deque(maxlen=self.SAMPLES))
            rates.append((value - last[1]) / (now - last[0]))
        self._last[name] = (now, value)

    def rate(self, name: str) -> float:
        rates = self._rates.get(name)
        return sum(rates) / len(rates) if rates else 0.0


@dataclass
class Stats:
    total_connections_received: int = 0
    total_commands_processed: int = 0
    rejected_connections: int = 0
    total_net_input_bytes: int = 0
    total_net_output_bytes: int = 0
    keyspace_hits: int = 0
    keyspace_misses: int = 0
    expired_keys: int = 0
    evicted_keys: int = 0
    total_messages_written: int = 0
    total_messages_read: int = 0
    total_messages_evicted: int = 0
    # What retention and the streams-oldest memory policy evicted
    # (rcp11/retention.py): readable messages, their payload bytes, and the
    # cron steps and memory evictions that evicted something.
    retention_evicted_messages: int = 0
    retention_evicted_bytes: int = 0
    retention_runs: int = 0
    used_memory_peak: int = 0
    rates: InstantaneousRates = field(default_factory=InstantaneousRates)
    # INFO commandstats: command name -> [calls, usec, rejected, failed]
    commands: dict[str, list[int]] = field(default_factory=dict)
    # Every error reply sent, and INFO errorstats: error code -> count
    # (commands.core.count_error).
    total_error_replies: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    errors_enabled: bool = True


# Resident memory one more idle connection costs (its Connection, ClientState,
# parser and transport), measured as RSS growth over 2,000 connections. Like
# Redis's client buffers it counts toward maxmemory, so `maxmemory 1` refuses
# the first write, as redis-server does.
CLIENT_OVERHEAD_BYTES = 3 * 1024


class RetentionHooks(Protocol):
    """What the server asks of retention (rcp11/retention.py's Retention,
    which sits above this module: it reads and evicts through the state)."""

    def cron(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """One bounded step from the server cron."""

    def cancel(self) -> None:
        """Drop a step scheduled to continue (at shutdown)."""


class ServerState:
    """Everything server-wide. One instance per running server."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.blocking = BlockingManager()
        # CLIENT PAUSE (rcp11/pause.py): what waits, and who.
        self.pause = ClientPause()
        self.keyspace = Keyspace(self, self.blocking)
        self.clients: dict[int, ClientState] = {}
        # The process's memory besides the data (the interpreter, buffers):
        # measured by allocated_memory() (the cron, INFO), counted by
        # used_memory() against maxmemory as Redis counts all of used_memory.
        self.process_overhead = 0
        # Clients in MONITOR mode, in the order they asked.
        self.monitors: list[ClientState] = []
        self.stats = Stats()
        # Wired in by start-up once the engine exists (it needs this state).
        self.persistence: PersistenceHooks = NullPersistence()
        # Wired in by start-up (rcp11/retention.py); None runs no retention.
        self.retention: RetentionHooks | None = None
        # How long one wake-up of blocked readers may serve before other
        # clients get a turn (the server sets limits.SERVE_SECONDS and
        # serves the rest in the next event-loop iterations); None serves
        # them all at once (in process, where no loop comes back for them).
        self.serve_seconds: float | None = None
        # The streams-oldest policy's index of streams by oldest append time
        # (rcp11/retention.py: OldestIndex), made by its first eviction.
        self.oldest_index: Any = None
        self.start_time = time.time()
        self.run_id = os.urandom(20).hex()
        self.dirty = 0  # changes since the last successful save
        self.loading = False  # True while AOF/snapshot replay runs
        # Set when a change could not be logged (commands.core.call): every
        # write is then refused with this text until the server restarts.
        self.writes_refused: str | None = None
        self.tcp_port = 0
        # INFO's multiplexing_api: what runs the event loop (the server
        # sets it; "none" in process, where nothing does).
        self.multiplexing_api = "none"
        # The transaction whose propagated commands go between MULTI and
        # EXEC (transaction_log()); None outside EXEC.
        self._transaction: _TransactionLog | None = None
        # The append time of the messages written now when it is pinned: for
        # all the writes of a transaction (one AOF date for them all), and
        # while the loader replays writes the AOF dated. None: the wall clock.
        self.append_ms: int | None = None
        for name in (
            "stream-compression",
            "stream-compression-level",
            "stream-compression-depth",
            "stream-node-max-entries",
        ):
            config.on_change(name, self.apply_stream_settings)
        # SLOWLOG and LATENCY (rcp11/diagnostics.py): a command that ran at
        # least slow_usec microseconds is looked at (commands.diagnostics.
        # note_slow); the dispatch compares, nothing more, for the others.
        self.slowlog = SlowLog()
        self.latency = LatencyMonitor()
        self.slow_usec = SLOW_NEVER
        for name in ("slowlog-log-slower-than", "latency-monitor-threshold"):
            config.on_change(name, self.apply_slow_threshold)
        self.apply_slow_threshold()
        # The C lane's call (its buffers and the limits it was last given),
        # run by rcp11/commands/lane.py: one per server, so that two servers
        # in one process never share it.
        self.lane = LaneCall(LANE_MAX_COMMANDS)
        # Installed by the server: called by SHUTDOWN with "save"|"nosave"|None;
        # False when the server keeps running (its final save failed).
        self.request_shutdown: Callable[[str | None], bool] = lambda mode: True

    def used_memory(self) -> int:
        """What maxmemory is held against, as in Redis: INFO's used_memory.
        The dataset and the clients are counted as they change (a write
        adds its bytes at once); the rest of the process (the interpreter,
        buffers) is the share last measured by allocated_memory(), which the
        cron and INFO call. Measuring the whole heap costs a system call and
        a walk of malloc's arenas, too much for every write."""
        return self.data_memory() + self.process_overhead

    def data_memory(self) -> int:
        """The dataset plus what each connected client costs the server."""
        return self.keyspace.used_bytes + CLIENT_OVERHEAD_BYTES * len(self.clients)

    def allocated_memory(self) -> int:
        """INFO's used_memory, measured now: all the process has allocated
        (rcp11.libc.allocated_bytes), or the data's share where the system
        does not say. Remembers the part that is not data, so that
        used_memory() stays equal to it between measurements."""
        data = self.data_memory()
        measured = allocated_bytes()
        if measured is None:
            self.process_overhead = 0
            return data
        self.process_overhead = max(measured - data, 0)
        return data + self.process_overhead

    def sample_rates(self, now: float) -> None:
        """Feed the instantaneous_* rates (called by the cron)."""
        stats = self.stats
        rates = stats.rates
        rates.sample("ops", stats.total_commands_processed, now)
        rates.sample("input", stats.total_net_input_bytes, now)
        rates.sample("output", stats.total_net_output_bytes, now)

    def used_memory_peak(self, used: int | None = None) -> int:
        """The highest INFO used_memory seen (by the cron and INFO, which
        passes what it measured) since start or CONFIG RESETSTAT."""
        used = self.allocated_memory() if used is None else used
        if used > self.stats.used_memory_peak:
            self.stats.used_memory_peak = used
        return self.stats.used_memory_peak

    def compression_level(self) -> int:
        """zlib level for sealed nodes from the config (0: off)."""
        if self.config.get("stream-compression") == "zlib":
            return int(self.config.get("stream-compression-level"))
        return 0

    def new_stream(self) -> Stream:
        return Stream(
            int(self.config.get("stream-node-max-entries")),
            self.compression_level(),
            int(self.config.get("stream-compression-depth")),
        )

    def apply_slow_threshold(self, _changed: Any = None) -> None:
        self.slow_usec = slow_threshold_usec(
            int(self.config.get("slowlog-log-slower-than")),
            int(self.config.get("latency-monitor-threshold")),
        )

    def apply_stream_settings(self, _changed: Any = None) -> None:
        """Every stream follows the configured node size and compression (as
        CONFIG SET and a restart with other settings mean, and as
        redis-server applies stream-node-max-entries): node size for nodes
        filled from now on; compression level and depth for existing nodes
        too, gradually (the core conforms one node per node sealed, or per
        Stream.compress_step())."""
        level = self.compression_level()
        depth = int(self.config.get("stream-compression-depth"))
        max_entries = int(self.config.get("stream-node-max-entries"))
        for value in self.keyspace.data.values():
            if isinstance(value, Stream):
                value.set_compression(level)
                value.set_compression_depth(depth)
                value.set_max_entries(max_entries)

    def write_time(self) -> int:
        """The append time (unix ms) of messages written now: the pinned
        one (append_ms) or the wall clock."""
        ms = self.append_ms
        return wall_ms() if ms is None else ms

    def propagate(self, argv: list[bytes], append_ms: int | None = None) -> None:
        """Log a write (AOF) and count it for save rules. Handlers call this
        for exactly what they changed, in a form whose replay is
        deterministic (TREAD GROUP logs SET groupkey <offset>); a write that
        appended messages passes their append time (write_time()), which
        the AOF dates it with so that a replay gives them the same."""
        if not self.loading:
            self._before_logging(append_ms)
            self.persistence.propagate(argv)
        # Counted once logged: dispatch reads `dirty` to know whether a
        # handler that raised had logged its change.
        self.dirty += 1

    def propagate_encoded(self, data: bytes, append_ms: int | None) -> None:
        """Log write requests already in their AOF form (the C lane's
        TWRITEs, copied verbatim), appended at append_ms, inside a
        transaction's MULTI ... EXEC as propagate() logs them. The caller
        counts them in `dirty`."""
        if not self.loading:
            self._before_logging(append_ms)
            self.persistence.propagate_encoded(data)

    def _before_logging(self, append_ms: int | None) -> None:
        """The writes logged next: dated (when they appended messages), and
        inside a transaction after its MULTI, logged on the first of them."""
        if append_ms is not None:
            self.persistence.date_writes(append_ms)
        transaction = self._transaction
        if transaction is not None and not transaction.opened:
            transaction.opened = True
            self.persistence.propagate([b"MULTI"])

    @property
    def in_transaction_log(self) -> bool:
        """Whether propagated commands go inside a MULTI ... EXEC now."""
        return self._transaction is not None

    @contextlib.contextmanager
    def transaction_log(self) -> Iterator[None]:
        """Everything propagated inside goes to the log between MULTI and
        EXEC, so a replay applies it all or nothing; nothing propagated,
        nothing logged (not even the MULTI). Nested uses join the outer."""
        if self._transaction is not None:
            yield
            return
        transaction = self._transaction = _TransactionLog()
        pinned = self.append_ms is None
        if pinned:
            self.append_ms = wall_ms()
        try:
            yield
        finally:
            self._transaction = None
            if pinned:
                self.append_ms = None
            if transaction.opened and not self.loading:
                self.persistence.propagate([b"EXEC"])


class _TransactionLog:
    __slots__ = ("opened",)

    def __init__(self) -> None:
        self.opened = False  # MULTI was logged (something was propagated)
