"""What the module's persistence and replication tests share: a keyspace in
every shape persistence must keep, everything a user can observe of it,
waiting for an AOF rewrite, and a ledger of acknowledged writes that finds
offsets handed out twice (test_module_persistence.py,
test_module_replication.py, test_module_time.py, test_module_offsets.py,
test_module_failover.py, test_module_cluster.py; a test file never imports
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
        elif client.type(key) == b"rcp11-grp":
            # An acknowledged group: its digest covers every range, deadline,
            # owner, delivery count and total.
            state[key] = client.execute_command("DEBUG", "DIGEST-VALUE", key)
        else:
            state[key] = client.get(key)
    return state


def wait_rewrite_done(client: redis.Redis) -> None:
    def done() -> bool:
        info = client.info("persistence")
        return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

    wait_for(done)
    assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"


class Ledger:
    """Every write a client got a reply for: (key, offset) -> message. A
    second reply naming the same (key, offset) is an offset handed out
    twice (the messages are all different, so a stored message also tells
    which write it came from)."""

    def __init__(self) -> None:
        self.acked: dict[tuple[bytes, int], bytes] = {}
        self.reused: list[tuple[bytes, int]] = []
        self.refused = 0

    def record(self, key: bytes, offset: int, message: bytes) -> None:
        if (key, offset) in self.acked:
            self.reused.append((key, offset))
        self.acked[(key, offset)] = message

    def write(
        self, client: Any, key: bytes, messages: list[bytes], tolerate_errors: bool = False
    ) -> None:
        """TWRITE each message (one pipeline) and record the replies; with
        tolerate_errors a refused write (an error reply) is counted, not
        raised."""
        pipe = client.pipeline(transaction=False)
        for message in messages:
            pipe.execute_command("TWRITE", key, message)
        for reply, message in zip(
            pipe.execute(raise_on_error=not tolerate_errors), messages, strict=True
        ):
            if isinstance(reply, Exception):
                self.refused += 1
            else:
                self.record(key, reply, message)

    def check_stored(self, client: Any) -> int:
        """Every acknowledged offset holds its message or null (lost in a
        crash or failover), never another message. Returns how many were
        lost. Reads runs of nearby offsets, not the gaps between them."""
        lost = 0
        by_key: dict[bytes, list[int]] = {}
        for key, offset in self.acked:
            by_key.setdefault(key, []).append(offset)
        for key, offsets in by_key.items():
            offsets.sort()
            run_start = 0
            for i in range(1, len(offsets) + 1):
                if i < len(offsets) and offsets[i] - offsets[i - 1] < 1000:
                    continue
                low, high = offsets[run_start], offsets[i - 1]
                stored = tr(client, key, low, high - low + 1)
                for offset in offsets[run_start:i]:
                    at = offset - low
                    found = stored[at] if at < len(stored) else None
                    assert found in (None, self.acked[(key, offset)]), (key, offset, found)
                    lost += found is None
                run_start = i
        return lost


def messages(tag: str, count: int) -> list[bytes]:
    return [b"%s-%d" % (tag.encode(), n) for n in range(count)]


def first_write(client: redis.Redis, key: str, *entries: Any) -> bool:
    """TWRITE key ENTRIES entries..., False when refused with NOREPLICAS
    (nothing written): right after a replica came online a loaded machine
    may keep it from acknowledging the first reservation in time
    (rcp11.reservation-timeout-ms). For wait_for() in tests about
    something else."""
    try:
        tw(client, key, *entries)
    except redis.exceptions.ResponseError as exc:
        if not str(exc).startswith("NOREPLICAS"):
            raise
        return False
    return True
