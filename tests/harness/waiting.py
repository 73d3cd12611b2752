"""Waiting on a condition instead of sleeping: every loop has a deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis


def wait_for(condition: Callable[[], Any], timeout: float = 30.0) -> bool:
    """Poll until condition() is true; True, or AssertionError at timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)
    return True


def wait_blocked(client: redis.Redis, n: int, timeout: float = 10.0) -> None:
    """Wait until the server reports exactly n blocked clients, so a test's
    order of events is the server's order and not a race."""
    deadline = time.monotonic() + timeout
    while int(client.info("clients")["blocked_clients"]) != n:
        assert time.monotonic() < deadline, f"blocked_clients never reached {n}"
        time.sleep(0.01)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run fn in a daemon thread; its reply or exception lands in the box."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["reply"] = fn()
        except Exception as exc:  # the caller asserts on it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box
