"""What was slow, for the tools Redis operators run: the slow log (SLOWLOG)
and the latency monitor (LATENCY), kept as redis-server 7 keeps them.

- The slow log holds the newest `slowlog-max-len` commands that ran at
  least `slowlog-log-slower-than` microseconds (0: every command, negative:
  none), each with a growing id, its unix time, its duration, its arguments
  (at most 32, each cut at 128 bytes, as Redis shows them), and the
  client's address and name.
- The latency monitor keeps, per event ("command", "fast-command"), the
  samples of at least `latency-monitor-threshold` milliseconds (0: off):
  one per second (the highest), the newest 160, and the highest ever.

Both are fed by the command layer (commands/core.py for the general path,
commands/lane.py for the C lane) through ServerState.note_slow(); the
commands that show them are in commands/diagnostics.py. This module knows
no command and no state: a leaf.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

# As redis-server's slowlog.h: arguments and bytes kept per entry.
SLOWLOG_MAX_ARGS = 32
SLOWLOG_MAX_ARG_BYTES = 128
# As redis-server's latency.h: samples kept per event.
LATENCY_SAMPLES = 160


# A duration no command reaches: nothing is looked at.
SLOW_NEVER = 1 << 62


def slow_threshold_usec(slowlog_usec: int, latency_ms: int) -> int:
    """The shortest duration either the slow log (slowlog-log-slower-than,
    negative: off) or the latency monitor (latency-monitor-threshold, 0:
    off) records."""
    thresholds = [SLOW_NEVER]
    if slowlog_usec >= 0:
        thresholds.append(slowlog_usec)
    if latency_ms > 0:
        thresholds.append(latency_ms * 1000)
    return min(thresholds)


@dataclass(frozen=True)
class SlowEntry:
    id: int
    unix_time: int
    usec: int
    argv: list[bytes]
    addr: str
    name: bytes

    def reply(self) -> list[object]:
        """SLOWLOG GET's six fields."""
        return [self.id, self.unix_time, self.usec, self.argv, self.addr, self.name]


def shown_args(argv: list[bytes]) -> list[bytes]:
    """The arguments as the slow log keeps them: past 32, the 32nd says how
    many more there were; past 128 bytes, an argument says how many more
    bytes it had."""
    count = len(argv)
    kept = argv if count <= SLOWLOG_MAX_ARGS else argv[: SLOWLOG_MAX_ARGS - 1]
    shown = [
        arg
        if len(arg) <= SLOWLOG_MAX_ARG_BYTES
        else arg[:SLOWLOG_MAX_ARG_BYTES]
        + b"... (%d more bytes)" % (len(arg) - SLOWLOG_MAX_ARG_BYTES)
        for arg in kept
    ]
    if count > SLOWLOG_MAX_ARGS:
        shown.append(b"... (%d more arguments)" % (count - SLOWLOG_MAX_ARGS + 1))
    return shown


class SlowLog:
    """The newest slow commands, newest first (SLOWLOG GET's order)."""

    def __init__(self) -> None:
        self.entries: deque[SlowEntry] = deque()
        self.next_id = 0

    def add(self, argv: list[bytes], usec: int, addr: str, name: bytes, max_len: int) -> None:
        entry = SlowEntry(self.next_id, int(time.time()), usec, shown_args(argv), addr, name)
        self.next_id += 1
        self.entries.appendleft(entry)
        while len(self.entries) > max_len:
            self.entries.pop()

    def get(self, count: int) -> list[list[object]]:
        """The newest count entries (all for -1)."""
        chosen = list(self.entries) if count < 0 else list(self.entries)[:count]
        return [entry.reply() for entry in chosen]

    def reset(self) -> None:
        self.entries.clear()  # ids go on growing, as in redis-server


@dataclass
class LatencyEvent:
    samples: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    max_ms: int = 0

    @property
    def latest(self) -> tuple[int, int]:
        return self.samples[-1]


class LatencyMonitor:
    """Latency spikes by event name, in arrival order."""

    def __init__(self) -> None:
        self.events: dict[str, LatencyEvent] = {}

    def add(self, event: str, ms: int, now: int | None = None) -> None:
        """A sample of ms milliseconds now (unix seconds); within one second
        only the highest is kept."""
        second = int(time.time()) if now is None else now
        found = self.events.get(event)
        if found is None:
            found = self.events[event] = LatencyEvent()
        samples = found.samples
        if samples and samples[-1][0] == second:
            if ms > samples[-1][1]:
                samples[-1] = (second, ms)
        else:
            samples.append((second, ms))
        found.max_ms = max(found.max_ms, ms)

    def latest(self) -> list[list[object]]:
        """LATENCY LATEST: [event, time of the latest sample, its ms, the
        highest ms] per event."""
        return [[name, *event.latest, event.max_ms] for name, event in self.events.items()]

    def history(self, event: str) -> list[list[int]]:
        found = self.events.get(event)
        return [] if found is None else [list(sample) for sample in found.samples]

    def reset(self, names: list[str]) -> int:
        """Forget the named events (all when none is named); how many were known."""
        if not names:
            count = len(self.events)
            self.events.clear()
            return count
        return sum(self.events.pop(name, None) is not None for name in dict.fromkeys(names))
