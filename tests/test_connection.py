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
