"""Stream commands as the tests send them, and views of a server's data
(every offset of a stream, the whole dataset before and after a kill -9)."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import redis

from harness.servers import ServerProcess
from harness.wire import mbulk

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


def tw(client: redis.Redis, key: Any, *entries: Any) -> int:
    """TWRITE key entry, or TWRITE key ENTRIES e1 e2 ... for several."""
    if len(entries) == 1:
        return client.execute_command("TWRITE", key, entries[0])
    return client.execute_command("TWRITE", key, "ENTRIES", *entries)


def twrite(client: redis.Redis, key: Any, *args: Any) -> Any:
    """TWRITE key args... as given (options and all)."""
    return client.execute_command("TWRITE", key, *args)


def twrite_entries(client: redis.Redis, key: Any, *entries: bytes) -> int:
    """TWRITE key ENTRIES e1 ..., the batch form even for one entry."""
    return client.execute_command("TWRITE", key, "ENTRIES", *entries)


def tr(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command("TREAD", *args)


def start_with_gaps(srv: ServerProcess, streams: dict[bytes, tuple[int, int, int]]) -> None:
    """Start srv (rcp11-server, appendonly yes, not started yet) on an AOF
    in which each stream key -> (before, gap_to, after) holds `before`
    messages (b"a0", ...), then a gap of null offsets up to `gap_to` --
    the raise record the loader logs when a crash left an AOF it cannot
    trust -- then `after` messages (b"b0", ...): what a reader meets after
    a crash."""
    commands = []
    for key, (before, gap_to, after) in streams.items():
        if before:
            commands.append([b"TWRITE", key, b"ENTRIES", *[b"a%d" % i for i in range(before)]])
        commands.append([b"RCP11-RAISE-NEXT", key, b"%d" % gap_to])
        if after:
            commands.append([b"TWRITE", key, b"ENTRIES", *[b"b%d" % i for i in range(after)]])
    srv.dir.joinpath("appendonly.aof").write_bytes(b"".join(mbulk(*argv) for argv in commands))
    srv.start()


def tread_calls(client: redis.Redis) -> int:
    """How many TREADs the server ran so far (INFO commandstats)."""
    return int(client.info("commandstats").get("cmdstat_tread", {}).get("calls", 0))


def read_all(client: redis.Redis, key: Any) -> list[bytes | None]:
    """Every offset of the stream at key, from 0 to its last (nulls included)."""
    info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
    next_offset = info[1] + 1
    if next_offset == 0:
        return []
    return client.execute_command("TREAD", key, 0, next_offset)


def error_of(client: redis.Redis, *argv: Any) -> str:
    """The error text a command answers (it must answer an error)."""
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*argv)
    return str(info.value)


class Reader(threading.Thread):
    """A client of its own that runs one (blocking) command in the background."""

    def __init__(self, srv: ServerProcess, *argv: Any, protocol: int = 2) -> None:
        super().__init__(daemon=True)
        self.client = srv.client(protocol=protocol)
        self.argv = argv
        self.reply: Any = "no reply"

    def run(self) -> None:
        try:
            self.reply = self.client.execute_command(*self.argv)
        except redis.RedisError as exc:
            self.reply = exc
        finally:
            self.client.close()

    def result(self) -> Any:
        self.join(10)
        assert not self.is_alive(), "reader still blocked"
        return self.reply


def random_workload(client: redis.Redis, rng: random.Random) -> None:
    """300 random commands on a few streams, strings and group keys:
    writes, evictions, group reads, transactions, deletions, backlogs."""
    for step in range(300):
        key = f"s{rng.randrange(4)}"
        choice = rng.random()
        if choice < 0.6:
            entries = [rng.randbytes(rng.randint(0, 30)) for _ in range(rng.randint(1, 20))]
            twrite_entries(client, key, *entries)
        elif choice < 0.7:
            client.execute_command("TEVICT", key, -rng.randint(0, 40))
        elif choice < 0.8:
            client.execute_command("TREAD", key, 0, rng.randint(0, 5), "GROUP", f"g{key}")
        elif choice < 0.85:
            client.set(f"str{rng.randrange(3)}", rng.randbytes(10))
        elif choice < 0.9:
            pipe = client.pipeline(transaction=True)
            pipe.execute_command("TWRITE", key, b"tx%d" % step)
            pipe.set("last-tx", step)
            pipe.execute()
        elif choice < 0.92:
            client.delete(key)
        else:
            client.execute_command("TWRITE", key, "BACKLOG", rng.randint(0, 30), "ENTRIES", b"b")


def dataset(client: redis.Redis) -> dict[bytes, object]:
    """Every key: a stream as (its WITHINFO header, all its offsets), a
    string as its value."""
    view: dict[bytes, object] = {}
    for key in sorted(client.keys("*")):
        if client.type(key) == b"rcp11-log":
            info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
            view[key] = (info, read_all(client, key))
        else:
            view[key] = client.get(key)
    return view


def assert_same_after_kill9(before: dict[bytes, object], after: dict[bytes, object]) -> None:
    """The data (as dataset() saw it) survived a kill -9: strings equal,
    every stream holds the same messages at the same offsets, and its next
    offset may have gone up to its reservation mark (a kill -9 leaves a gap
    of nulls)."""
    assert after.keys() == before.keys()
    for key, old in before.items():
        new = after[key]
        if not isinstance(old, tuple):
            assert new == old, key
            continue
        (first, last, *_), messages = old
        (new_first, new_last, *_), new_messages = new  # type: ignore[misc]
        assert new_last >= last, key
        assert new_messages[: len(messages)] == messages, key
        assert all(message is None for message in new_messages[len(messages) :]), key
        if first <= last:
            assert new_first == first, key


def stream_info(client: redis.Redis) -> dict[str, Any]:
    """INFO's streams section of either server: rcp11-server's "streams",
    or the module's "rcp11_streams", whose fields Redis prefixes with the
    module name ("rcp11_stream_messages"): returned without the prefix."""
    info = client.info("streams")
    if info:
        return info
    return {k.removeprefix("rcp11_"): v for k, v in client.info("rcp11").items()}
