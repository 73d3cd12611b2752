"""The server's Connection in process, driven through a fake transport:
the AOF is flushed before any reply of a loop iteration is written, and
a write the AOF could not take is never acknowledged (docs/PROTOCOL.md
section 8). The same through the network: test_crash_kill9.py."""

from __future__ import annotations

from conftest import mbulk

from rcp11.state import NullPersistence


class FakeTransport:
    """Just enough of an asyncio transport to drive a Connection in-process."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass  # a held client (its turn is over): nothing is read here anyway

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class RecordingPersistence(NullPersistence):
    aof_state = "on"

    def __init__(self, outcome: bool) -> None:
        self.outcome = outcome
        self.logged: list[list[bytes]] = []
        self.flushed_before_write: list[bool] = []
        self.transport: FakeTransport | None = None

    def propagate(self, argv: list[bytes]) -> None:
        self.logged.append(argv)

    def flush(self) -> bool:
        assert self.transport is not None
        # nothing of this iteration may have reached the socket yet
        self.flushed_before_write.append(not self.transport.written)
        return self.outcome


def make_connection(persistence: object) -> tuple[object, object, FakeTransport]:
    import asyncio

    from rcp11 import server as server_module
    from rcp11.config import Config
    from rcp11.state import ServerState

    config = Config()
    config.apply_args(["--save", ""])
    state = ServerState(config)
    state.persistence = persistence  # type: ignore[assignment]
    srv = server_module.Server(state, asyncio.new_event_loop())
    conn = server_module.Connection(srv)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return srv, conn, transport


def test_persistence_flush_runs_before_any_reply_is_written() -> None:
    persistence = RecordingPersistence(outcome=True)
    srv, conn, transport = make_connection(persistence)
    persistence.transport = transport
    conn.data_received(mbulk(b"TWRITE", b"s", b"a") + mbulk(b"TWRITE", b"s", b"b"))
    assert transport.written == []  # replies wait for the end of the iteration
    srv.flush()
    assert persistence.flushed_before_write == [True]
    assert b"".join(transport.written) == b":0\r\n:1\r\n"
    assert [argv[0] for argv in persistence.logged] == [b"TWRITE", b"TWRITE"]


def test_unlogged_writes_are_never_acknowledged() -> None:
    persistence = RecordingPersistence(outcome=False)
    srv, conn, transport = make_connection(persistence)
    persistence.transport = transport
    conn.data_received(mbulk(b"TWRITE", b"s", b"a"))
    srv.flush()
    assert transport.written == []
    assert transport.closed


def drive(srv: object) -> None:
    """Run what the event loop has queued (one iteration)."""
    loop = srv.loop  # type: ignore[attr-defined]
    loop.call_soon(loop.stop)
    loop.run_forever()


def test_a_big_wake_up_is_served_in_slices_and_the_writer_waits_for_it() -> None:
    """50 group readers woken by one TWRITE, served one per slice (the
    server's slices are limits.SERVE_SECONDS; 0 here): another client's
    PING is answered while most still wait, and the writer's pipelined read
    of the group runs only after all of them, as if served at once."""
    from rcp11.server import Connection

    srv, writer, written = make_connection(NullPersistence())
    state = srv.state  # type: ignore[attr-defined]
    state.serve_seconds = 0.0
    readers = []
    for _ in range(50):
        conn, transport = Connection(srv), FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(mbulk(b"TREAD", b"s", b"0", b"1", b"BLOCK", b"0", b"GROUP", b"g"))
        readers.append(transport)
    assert state.blocking.blocked_clients == 50
    payloads = [b"m%02d" % i for i in range(50)]
    writer.data_received(  # type: ignore[attr-defined]
        mbulk(b"TWRITE", b"s", b"ENTRIES", *payloads)
        + mbulk(b"TREAD", b"s", b"0", b"5", b"GROUP", b"g")
        + mbulk(b"GET", b"g")
    )
    pinger, pinged = Connection(srv), FakeTransport()
    pinger.connection_made(pinged)  # type: ignore[arg-type]
    pinger.data_received(b"PING\r\n")
    srv.flush()  # type: ignore[attr-defined]
    assert b"".join(pinged.written) == b"+PONG\r\n"
    assert state.blocking.blocked_clients > 40  # answered while the wake-up goes on
    for _ in range(200):
        if b"".join(written.written).count(b"\r\n") >= 4:
            break
        drive(srv)
    assert b"".join(written.written) == b":0\r\n*0\r\n$2\r\n50\r\n"
    assert state.blocking.blocked_clients == 0
    assert [b"".join(t.written) for t in readers] == [b"*1\r\n$3\r\n%s\r\n" % p for p in payloads]
