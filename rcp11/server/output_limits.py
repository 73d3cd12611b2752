"""client-output-buffer-limit normal, as Redis's
checkClientOutputBufferLimits() applies it, and the high-water mark of
backpressure: pure functions of a connection's pending output, shared by the
check before every command and the check after every write (connection.py)
and the cron's (listeners.py)."""

from __future__ import annotations

from rcp11.limits import OUTPUT_HIGH_WATER

# (hard bytes, soft bytes, soft seconds); 0 means no such limit.
Limits = tuple[int, int, int]


def limit_passed(
    limits: Limits, pending: int, soft_since: float, now: float
) -> tuple[str | None, float]:
    """Which limit `pending` bytes of output passed, if any (the reason
    logged when the client is closed), and since when the output has been
    over the soft limit (0.0: it is not; the soft limit closes the client
    only once it has been over it for longer than its seconds)."""
    hard, soft, seconds = limits
    if hard and pending > hard:
        return f"hard limit {hard}", soft_since
    if soft and pending > soft:
        if not soft_since:
            return None, now
        if now - soft_since > seconds:
            return f"soft limit {soft} for {seconds}s", soft_since
        return None, soft_since
    return None, 0.0


def next_output_mark(limits: Limits, pending: int) -> int:
    """The pending output at which to look again: the soft limit while
    under it, then the hard limit, or without one the high-water mark at
    which commands stop until the output drains (never below the soft
    limit, so that the soft limit's timer can run)."""
    hard, soft, _ = limits
    if soft and pending <= soft:
        return soft
    if hard:
        return hard
    return max(OUTPUT_HIGH_WATER, soft + 1)
