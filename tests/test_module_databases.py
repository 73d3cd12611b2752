"""Keys of the module moved between databases (MOVE, COPY ... DB, RENAME,
SWAPDB): the user's connection stays on its database, and the AOF logs each
command under the database it ran in, so a restart brings every key back
where it was.

On Valkey 8.1 the module's keyspace-event callback runs on the client of
the command, and the server selects the event's database on it (move_to,
copy_to: the target) without selecting it back: the connection moved to
the target database and the AOF logged `SELECT 1`, `MOVE s 1`, which on
replay finds no s. The module selects the command's database again (see
rl_on_keyspace_event); these tests run on both hosts (--module-host)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, tr, tw, wait_for
from harness.servers import module_host
from helpers_module import state_of

DATABASES = 4
# A stream, its plain group key, an acknowledged group (a lease read came
# first in the report) and a string of the user's.
KEYS = (b"s", b"g", b"ag", b"plain")
# The keys of the module's own types: COPY tells the module their database.
MODULE_KEYS = (b"s", b"ag")


def fill(client: redis.Redis) -> None:
    tw(client, "s", "a", "b", "c")
    tr(client, "s", 0, 2, "GROUP", "g")
    client.execute_command("TREAD", "s", 0, 2, "GROUP", "ag", "LEASE", 600_000)
    client.set("plain", "p")


def selected_db(client: redis.Redis) -> int:
    return int(client.client_info()["db"])


def all_databases(srv: RedisModuleServer) -> dict[int, dict[bytes, Any]]:
    """What each database holds, as state_of sees it."""
    states = {}
    for db in range(DATABASES):
        client = srv.client(db=db)
        states[db] = state_of(client)
        client.close()
    return states


def move_each(client: redis.Redis, command: str, keys: tuple[bytes, ...] = KEYS) -> None:
    """Run command on each key from database 0, each followed by a write
    of the same connection, which must land in database 0."""
    for key in keys:
        if command == "move":
            assert client.execute_command("MOVE", key, 1) == 1
        elif command == "copy":
            assert client.execute_command("COPY", key, key, "DB", 2) == 1
        elif command == "rename":
            assert client.execute_command("RENAME", key, key + b"-renamed")
        elif command == "move-in-multi":
            pipe = client.pipeline(transaction=True)
            pipe.execute_command("MOVE", key, 1)
            pipe.execute_command("TWRITE", b"in-multi-" + key, "x")
            assert pipe.execute() == [1, 0]
        elif command == "move-in-script":
            script = "redis.call('MOVE', KEYS[1], 1) return redis.call('TWRITE', KEYS[2], 'x')"
            assert client.eval(script, 2, key, b"in-script-" + key) == 0
        assert selected_db(client) == 0, command
        client.execute_command("TWRITE", b"after-" + key, "x")


def expected_keys(command: str, keys: tuple[bytes, ...] = KEYS) -> dict[int, set[bytes]]:
    after = {b"after-" + key for key in keys}
    if command == "move":
        return {0: after, 1: set(KEYS), 2: set(), 3: set()}
    if command == "copy":
        return {0: after | set(KEYS), 1: set(), 2: set(keys), 3: set()}
    if command == "rename":
        return {0: after | {key + b"-renamed" for key in KEYS}, 1: set(), 2: set(), 3: set()}
    if command in ("move-in-multi", "move-in-script"):
        prefix = b"in-multi-" if command == "move-in-multi" else b"in-script-"
        return {0: after | {prefix + key for key in KEYS}, 1: set(KEYS), 2: set(), 3: set()}
    raise AssertionError(command)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["move", "copy", "rename", "move-in-multi", "move-in-script"])
def test_keys_moved_between_databases_come_back_where_they_were(
    module_factory: Any, command: str
) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    fill(client)
    keys = MODULE_KEYS if command == "copy" else KEYS
    move_each(client, command, keys)
    before = all_databases(srv)
    assert {db: set(state) for db, state in before.items()} == expected_keys(command, keys)
    client.close()
    srv.kill9()
    srv.start()  # the AOF alone brings the data back
    assert all_databases(srv) == before
    client = srv.client()
    assert client.execute_command("DEBUG", "LOADAOF") == b"OK"
    assert all_databases(srv) == before
    client.close()


@pytest.mark.slow
def test_copy_of_other_keys_to_another_database(module_factory: Any) -> None:
    """COPY ... DB of a key of another type (a plain group key, a string)
    has no copy callback: on Valkey the module finds the database of the
    client from a command filter, which neither scripts nor AOF replay
    run. Live the connection stays; an AOF replay on Valkey 8.1 moves the
    commands after such a COPY to the target database (fixed in the host
    by valkey-io/valkey#4024)."""
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="always")
    client = srv.client()
    fill(client)
    others = (b"g", b"plain")
    move_each(client, "copy", others)
    before = all_databases(srv)
    assert {db: set(state) for db, state in before.items()} == expected_keys("copy", others)
    client.close()
    srv.kill9()
    srv.start()
    replayed = all_databases(srv)
    if module_host() == "valkey":
        # The known gap: when this fails, the host fixed it; drop the branch.
        assert replayed != before
        pytest.xfail(
            "Valkey 8.1 replays the commands after COPY ... DB of a string key "
            "in the target database"
        )
    assert replayed == before


@pytest.mark.slow
def test_swapdb_and_moves_from_another_database_replay_in_place(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(appendonly="yes", appendfsync="always")
    client = srv.client(db=2)
    fill(client)
    assert client.execute_command("SWAPDB", 2, 3)
    assert selected_db(client) == 2
    client.execute_command("TWRITE", "after-swap", "x")
    # From database 3 (the keys' home now) back to 0, then a write in 3.
    other = srv.client(db=3)
    for key in KEYS:
        assert other.execute_command("MOVE", key, 0) == 1
        assert selected_db(other) == 3
        other.execute_command("TWRITE", b"after-" + key, "x")
    before = all_databases(srv)
    assert set(before[0]) == set(KEYS)
    assert set(before[2]) == {b"after-swap"}
    assert set(before[3]) == {b"after-" + key for key in KEYS}
    client.close()
    other.close()
    srv.kill9()
    srv.start()
    assert all_databases(srv) == before


@pytest.mark.slow
@pytest.mark.parametrize("command", ["move", "copy"])
def test_a_replica_gets_each_key_in_its_database(module_factory: Any, command: str) -> None:
    primary_srv: RedisModuleServer = module_factory(repl_diskless_sync_delay=0)
    replica_srv: RedisModuleServer = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}")
    replica = replica_srv.client()
    wait_for(lambda: replica.info("replication")["master_link_status"] == "up")
    primary = primary_srv.client()
    fill(primary)
    # Every key, COPY of strings included: the replica's link is an
    # ordinary client, which the module's command filter sees.
    move_each(primary, command)
    assert primary.execute_command("WAIT", 1, 10_000) == 1
    expected = all_databases(primary_srv)
    assert {db: set(state) for db, state in expected.items()} == expected_keys(command)
    assert all_databases(replica_srv) == expected
    primary.close()
    replica.close()
