"""Giving freed memory back: glibc's malloc keeps what the server freed for
reuse, so after the keys that held most of its memory are deleted the RSS
stays where it was (405 MB against 45 MB for an empty server). The cron
asks MemoryTrim.tick() once per tick. Memory the process holds but does not
use (its anonymous RSS above used_memory) that stayed TRIM_AFTER_FREED or
more above what the last trim left for TRIM_DECAY_SECONDS is given back
with malloc_trim(0). Freed memory that is soon needed again (a stream
deleted and written anew) is reused without a page fault per page, as
jemalloc's decay gives redis-server; glibc's own trim on free() is kept out
of the way (rcp11/limits.py: MALLOC_TRIM_THRESHOLD)."""

from __future__ import annotations

import logging

from rcp11.libc import anonymous_bytes, malloc_trim
from rcp11.limits import TRIM_AFTER_FREED, TRIM_DECAY_SECONDS
from rcp11.logs import VERBOSE

log = logging.getLogger("rcp11")


class MemoryTrim:
    def __init__(self) -> None:
        # Held but unused bytes right after the last trim: what trimming
        # could not give back (partly used pages), not asked again.
        self.floor = 0
        # When the unused memory last rose TRIM_AFTER_FREED above the floor
        # (None while it is below).
        self.since: float | None = None

    def tick(self, used: int, now: float) -> bool:
        """Trim if the memory held beyond used_memory stayed large for
        TRIM_DECAY_SECONDS; True when it trimmed."""
        held = anonymous_bytes()
        if held is None:
            return False
        unused = max(held - used, 0)
        if unused < self.floor:
            self.floor = unused  # reused: what is left is the new floor
        if unused - self.floor < TRIM_AFTER_FREED:
            self.since = None
            return False
        if self.since is None:
            self.since = now
            return False
        if now - self.since < TRIM_DECAY_SECONDS:
            return False
        self.since = None
        if not malloc_trim():
            return False
        after = anonymous_bytes() or held
        self.floor = max(after - used, 0)
        log.log(VERBOSE, "Gave freed memory back to the system (%d bytes)", held - after)
        return True
