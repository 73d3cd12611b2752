"""CLIENT PAUSE: the server-wide pause of clients' commands, as Redis 7.0's.

    state.pause.start(ms, ALL)       # CLIENT PAUSE ms [WRITE|ALL]
    state.pause.holds(...)           # dispatch: must this command wait?
    state.pause.end()                # CLIENT UNPAUSE, or the timeout

A command the pause covers is not refused: the client is held (its
`blocked` is HELD, so its connection stops running and handing the C lane
its pipeline) and the command runs again, with the rest of its pipeline
behind it, once the pause ends. Under ALL every command of every client
waits, including the next one of the client that paused; under WRITE only
what writes (EXEC of a transaction holding a write). Two pauses make one:
the later end and the stricter mode, as in Redis.

While writes are paused nothing else writes either, as in Redis ("keys are
not evicted or expired"): the cron's expiry and retention steps wait, a
key found expired reads as missing but stays (it goes once the pause
ends), maxmemory evicts nothing, the C lane runs no write (lane.py) and
runs nothing under ALL, and lease wake-ups of group readers wait. Blocked
readers keep waiting and their timeouts still fire.

The server installs `arm` to end the pause on time; in process (no event
loop) the pause ends at the first look past its end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# The modes, ordered: a second pause keeps the stricter one.
OFF = 0
WRITE = 1
ALL = 2


class _Held:
    """ClientState.blocked of a client the pause holds."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HELD"


HELD = _Held()


class ClientPause:
    """The pause in force (mode, end) and the clients it holds, in the
    order they were held (they are resumed in that order)."""

    def __init__(self) -> None:
        self.mode = OFF
        self.end_at = 0.0  # time.monotonic() seconds
        self.held: dict[Any, None] = {}
        # Installed by the server: make sure end() is called at `when`
        # (time.monotonic() seconds); the default leaves it to the next look.
        self.arm: Callable[[float], None] = lambda when: None
        # Installed by the server: called once a pause ends.
        self.on_end: Callable[[], None] = lambda: None

    def start(self, ms: int, mode: int) -> None:
        """CLIENT PAUSE ms mode."""
        end_at = time.monotonic() + ms / 1000
        if self.current():
            end_at = max(end_at, self.end_at)
            mode = max(mode, self.mode)
        self.mode, self.end_at = mode, end_at
        self.arm(end_at)

    def current(self) -> int:
        """The mode in force (OFF once its end passed: held clients go on)."""
        if self.mode and time.monotonic() >= self.end_at:
            self.end()
        return self.mode

    @property
    def writes_paused(self) -> bool:
        """Whether nothing may write now (either mode; no clock read)."""
        return self.mode != OFF

    def holds(self, client: Any, cmd: Any, argv: list[bytes]) -> bool:
        """Whether cmd (checked, about to run or be queued) must wait: then
        the client is held. What writes under WRITE: a write command, a
        group-moving read, EXEC of a transaction that holds a write."""
        mode = self.current()
        if mode == WRITE:
            if cmd.runs_transaction:
                if client.queued is None or not client.queued_write:
                    return False
            elif not (cmd.write or (cmd.writes_some_keys and cmd.writes_keys(argv))):
                return False
        elif mode != ALL:
            return False
        client.blocked = HELD
        # CLIENT LIST shows the command it waits to run, as Redis does.
        client.last_command = cmd.name
        self.held[client] = None
        return True

    def end(self) -> None:
        """CLIENT UNPAUSE or the timeout: the held clients run again, in
        the order they were held (each resumes in a later callback)."""
        was, self.mode = self.mode, OFF
        held, self.held = self.held, {}
        for client in held:
            if client.blocked is HELD:
                client.blocked = None
                client.on_unblocked()
        if was:
            self.on_end()

    def drop(self, client: Any) -> None:
        """The client is gone: nothing of it runs later."""
        self.held.pop(client, None)
        if client.blocked is HELD:
            client.blocked = None


__all__ = ["ALL", "HELD", "OFF", "WRITE", "ClientPause"]
