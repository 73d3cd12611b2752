"""Giving freed memory back: glibc's malloc keeps what the server freed for
reuse, so after the keys that held most of its memory are deleted the RSS
stays where it was (405 MB against 45 MB for an empty server). The cron
asks MemoryTrim.tick() once per tick; after a large drop of used_memory it
calls malloc_trim(0), rate-limited (rcp11/limits.py says how much and how
often)."""

from __future__ import annotations

import logging

from rcp11.libc import malloc_trim
from rcp11.limits import TRIM_AFTER_FREED, TRIM_INTERVAL_SECONDS
from rcp11.logs import VERBOSE

log = logging.getLogger("rcp11")


class MemoryTrim:
    def __init__(self) -> None:
        # used_memory at its highest since the last trim.
        self.high = 0
        self.last = 0.0
        self.trims = 0

    def tick(self, used: int, now: float) -> bool:
        """Trim if used_memory fell by TRIM_AFTER_FREED since its high mark
        and the last trim is old enough; True when it trimmed."""
        if used > self.high:
            self.high = used
            return False
        if self.high - used < TRIM_AFTER_FREED or now - self.last < TRIM_INTERVAL_SECONDS:
            return False
        freed = self.high - used
        self.high = used
        self.last = now
        if not malloc_trim():
            return False
        self.trims += 1
        log.log(VERBOSE, "Gave freed memory back to the system (%d bytes freed)", freed)
        return True
