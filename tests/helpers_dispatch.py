"""A server without network for in-process tests: execute() on a
ServerState whose persistence records what was propagated and reserved,
and clients whose late replies (blocking) land in a list.

Shared by the test files that drive the command layer directly
(test_dispatch.py, test_streams_tconcat.py, test_groups_blocking_wakeups.py);
a test file never imports another test file."""

from __future__ import annotations

from typing import Any

import hiredis

from rcp11.commands import execute
from rcp11.config import Config
from rcp11.state import ClientState, NullPersistence, ServerState


class RecordingPersistence(NullPersistence):
    """Remembers what was propagated and lets a test refuse writes."""

    aof_state = "on"  # it logs, like an AOF

    def __init__(self) -> None:
        self.log: list[list[bytes]] = []
        self.refuse: str | None = None
        self.reserved: list[tuple[bytes, int]] = []

    def propagate(self, argv: list[bytes]) -> None:
        self.log.append(list(argv))

    def propagate_encoded(self, data: bytes) -> None:
        reader = hiredis.Reader()
        reader.feed(data)
        while (argv := reader.gets()) is not False:
            self.log.append(argv)

    def write_refused(self) -> str | None:
        return self.refuse

    def before_stream_write(self, key: bytes, new_next_offset: int) -> None:
        self.reserved.append((key, new_next_offset))


class Client(ClientState):
    """A ClientState whose late replies (blocking) land in a list."""

    def __init__(self, resp: int = 2) -> None:
        super().__init__(resp=resp, authenticated=True)
        self.received: list[Any] = []
        self.unblocked = 0
        self.send = self.received.append  # type: ignore[method-assign]
        self.on_unblocked = self._count_unblock  # type: ignore[method-assign]

    def _count_unblock(self) -> None:
        self.unblocked += 1


def recording_state() -> ServerState:
    """A default-configured ServerState with a RecordingPersistence."""
    state = ServerState(Config())
    state.persistence = RecordingPersistence()
    return state


def run(state: ServerState, client: ClientState, *args: Any) -> Any:
    """One command through execute(), arguments as str, int or bytes."""
    argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return execute(state, client, argv)
