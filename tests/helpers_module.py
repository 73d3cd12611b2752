"""What the module's persistence and replication tests share: a keyspace in
every shape persistence must keep, everything a user can observe of it,
and waiting for an AOF rewrite (test_module_persistence.py,
test_module_replication.py, test_module_time.py; a test file never imports
another test file)."""

from __future__ import annotations

from typing import Any

import redis
from conftest import tr, tw, wait_for


def populate(client: redis.Redis) -> None:
    """Streams in every shape persistence must keep: evicted prefixes, a
    partly evicted node, a fully evicted stream, binary and empty messages,
    many nodes, a big message, groups, an empty stream, and a string."""
    tw(client, "plain", *[b"message %d" % n for n in range(2500)])
    client.execute_command("TEVICT", "plain", 1234)  # mid-node cut
    tw(client, "binary", bytes(range(256)), b"", b"\r\n\x00")
    tw(client, "emptied", "a", "b", "c")
    client.execute_command("TEVICT", "emptied", -0)  # keep nothing
    client.execute_command("TEVICT", "emptied", 100)
    tw(client, "big", b"B" * 3_000_000)
    tw(client, "tail", *[b"t%d" % n for n in range(10)])
    client.execute_command("TWRITE", "tail", "BACKLOG", 4, "ENTRIES", "u1", "u2")
    tr(client, "plain", 0, 7, "GROUP", "plain:g")
    tr(client, "tail", 0, 1, "GROUPNEW", "tail:g")
    client.execute_command("TCONCAT", "empty-dst", "no-such-source")
    client.set("a-string", "v")


def state_of(client: redis.Redis) -> dict[bytes, Any]:
    """Everything a user can observe of the keyspace, messages' append
    times included."""
    state: dict[bytes, Any] = {}
    for key in sorted(client.keys("*")):
        if client.type(key) == b"rcp11-log":
            info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
            messages = client.execute_command("TREAD", key, 0, info[1] + 1, "WITHTIMES")
            state[key] = (info, messages, client.execute_command("DEBUG", "DIGEST-VALUE", key))
        else:
            state[key] = client.get(key)
    return state


def wait_rewrite_done(client: redis.Redis) -> None:
    def done() -> bool:
        info = client.info("persistence")
        return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

    wait_for(done)
    assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"
