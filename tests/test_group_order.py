"""Readers of one group are served in the order they blocked, also when they
wait on different streams (docs/PROTOCOL.md, Consumer groups), whatever
order the streams are written in. rcp11-server only: inside redis-server,
Redis serves the module's readers stream by stream."""

from __future__ import annotations

import redis
from conftest import ServerProcess, in_thread, tr, wait_blocked


def test_first_blocked_reader_of_a_group_is_served_first_across_streams(
    server: ServerProcess, r: redis.Redis
) -> None:
    first_client, second_client = server.client(), server.client()
    first, first_box = in_thread(lambda: tr(first_client, "s1", 0, 5, "GROUP", "g", "BLOCK", 0))
    wait_blocked(r, 1)
    second, second_box = in_thread(lambda: tr(second_client, "s2", 0, 5, "GROUP", "g", "BLOCK", 0))
    wait_blocked(r, 2)
    # One transaction writes s2 first, then s1: the reader of s1 blocked
    # first, so it is served first (from g = 0), then the reader of s2 from
    # where it stopped.
    pipe = r.pipeline(transaction=True)
    pipe.execute_command("TWRITE", "s2", "ENTRIES", "x", "y")
    pipe.execute_command("TWRITE", "s1", "a")
    pipe.execute()
    first.join(10)
    second.join(10)
    assert first_box == {"reply": [b"a"]}
    assert second_box == {"reply": [b"y"]}
    assert r.get("g") == b"2"
