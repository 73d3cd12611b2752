"""No offset is handed out twice across a failover (module_reserve.c): a
write waits until every online replica acknowledged the reservation its
offsets come from, is refused when none does in time (or written anyway,
as configured), and a promoted replica continues past every offset its
old primary handed out; a full sync carries the reservation; read-committed
readers never see a message a failover takes back."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from conftest import RedisModuleServer, in_thread, tr, tw, wait_blocked, wait_for
from helpers_module import Ledger, messages

pytestmark = pytest.mark.slow

NOREPLICAS = "NOREPLICAS"


def reservations(client: redis.Redis) -> dict[str, int]:
    info = client.info("rcp11")
    return {k[len("rcp11_") :]: v for k, v in info.items() if "reserv" in k}


@contextmanager
def stopped(srv: RedisModuleServer) -> Iterator[None]:
    """The server frozen (SIGSTOP): a replica that lags."""
    assert srv.proc is not None
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)


def pair(module_factory: Any, **directives: Any) -> tuple[RedisModuleServer, RedisModuleServer]:
    """A primary and its replica, the link up and the replica online."""
    primary: RedisModuleServer = module_factory(repl_diskless_sync_delay=0, **directives)
    replica: RedisModuleServer = module_factory(replicaof=f"127.0.0.1 {primary.port}", **directives)
    client = primary.client()
    wait_for(lambda: replica_online(client))
    client.close()
    return primary, replica


def replica_online(primary: redis.Redis) -> bool:
    replica = primary.info("replication").get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


def test_a_write_waits_until_the_replica_holds_its_reservation(module_factory: Any) -> None:
    primary_srv, replica_srv = pair(module_factory)
    primary, replica = primary_srv.client(), replica_srv.client()
    with stopped(replica_srv):
        thread, box = in_thread(lambda: primary.execute_command("TWRITE", "s", "first"))
        watcher = primary_srv.client()
        wait_for(lambda: reservations(watcher)["reservation_waiting_writes"] == 1)
        assert watcher.exists("s") == 0  # nothing written while it waits
        assert thread.is_alive()
    thread.join(10)
    assert box.get("reply") == 0
    assert primary.execute_command("WAIT", 1, 5000) == 1
    assert tr(replica, "s", 0, 10) == [b"first"]
    # Later writes are inside the reservation: they do not wait.
    before = reservations(primary)["reservation_waits"]
    tw(primary, "s", *messages("more", 200))
    assert reservations(primary)["reservation_waits"] == before
    for client in (primary, replica, watcher):
        client.close()


@pytest.mark.parametrize("how", ["RESTORE", "DEBUG RELOAD", "RENAME"])
def test_a_stream_loaded_or_moved_under_a_replica_takes_writes(
    module_factory: Any, how: str
) -> None:
    # A stream that arrives at a key with a mark of its own (RESTORE's
    # payload, DEBUG RELOAD's snapshot, RENAME) reserves again under that
    # key: its writes wait for the replica once, not refused forever.
    primary_srv, replica_srv = pair(module_factory)
    client = primary_srv.client()
    ledger = Ledger()
    ledger.write(client, b"s", messages("a", 10))
    key = b"d"
    if how == "RESTORE":
        client.restore(key, 0, client.dump("s"))
    elif how == "DEBUG RELOAD":
        client.execute_command("DEBUG", "RELOAD")
        key = b"s"
    else:
        client.rename("s", key)
    ledger.write(client, key, messages("b", 10))
    assert ledger.refused == 0
    replica = replica_srv.client()
    wait_for(lambda: tr(replica, key, 0, 100) == tr(client, key, 0, 100))
    client.close()
    replica.close()


def test_no_acknowledgement_in_time_refuses_the_write(module_factory: Any) -> None:
    primary_srv, replica_srv = pair(module_factory, **{"rcp11.reservation-timeout-ms": 300})
    primary, replica = primary_srv.client(), replica_srv.client()
    with stopped(replica_srv):
        started = time.monotonic()
        with pytest.raises(redis.ResponseError, match=NOREPLICAS):
            primary.execute_command("TWRITE", "s", "refused")
        assert time.monotonic() - started >= 0.3
        assert primary.exists("s") == 0
        assert reservations(primary)["reservation_refused_writes"] == 1
        # As configured, the write goes through unconfirmed instead.
        primary.config_set("rcp11.reservation-on-timeout", "write")
        assert primary.execute_command("TWRITE", "s", "written anyway") == 0
        assert reservations(primary)["reservation_unconfirmed_writes"] == 1
    assert primary.execute_command("WAIT", 1, 5000) == 1
    assert tr(replica, "s", 0, 10) == [b"written anyway"]
    primary.close()
    replica.close()


def test_min_replicas_refuses_writes_without_enough_replicas(module_factory: Any) -> None:
    srv: RedisModuleServer = module_factory(
        **{"rcp11.reservation-min-replicas": 1, "rcp11.reservation-timeout-ms": 100}
    )
    client = srv.client()
    with pytest.raises(redis.ResponseError, match=NOREPLICAS):
        client.execute_command("TWRITE", "s", "x")
    client.config_set("rcp11.reservation-min-replicas", 0)
    tw(client, "src", *messages("m", 3))
    client.config_set("rcp11.reservation-min-replicas", 1)
    with pytest.raises(redis.ResponseError, match=NOREPLICAS):
        client.execute_command("TCONCAT", "d", "src")
    assert (client.exists("d"), client.exists("src")) == (0, 1)  # nothing moved
    client.config_set("rcp11.reservation-min-replicas", 0)
    assert tw(client, "s", "x") == 0
    assert client.execute_command("TCONCAT", "d", "src") == 0
    client.close()


def test_transactions_cannot_wait_and_follow_their_own_setting(module_factory: Any) -> None:
    primary_srv, replica_srv = pair(module_factory)
    primary = primary_srv.client()
    with stopped(replica_srv):
        # Default: the transaction writes, unconfirmed (counted).
        with primary.pipeline(transaction=True) as pipe:
            pipe.execute_command("TWRITE", "t1", "a")
            pipe.set("progress", 1)
            assert pipe.execute() == [0, True]
        assert reservations(primary)["reservation_unconfirmed_writes"] == 1
        primary.config_set("rcp11.reservation-in-multi", "refuse")
        with primary.pipeline(transaction=True) as pipe:
            pipe.execute_command("TWRITE", "t2", "a")
            pipe.set("progress", 2)
            replies = pipe.execute(raise_on_error=False)
        assert isinstance(replies[0], redis.ResponseError) and NOREPLICAS in str(replies[0])
        assert primary.exists("t2") == 0
        # A script cannot wait either.
        with pytest.raises(redis.ResponseError, match=NOREPLICAS):
            primary.eval("return redis.call('TWRITE', 't3', 'a')", 0)
    # The refused transaction sent its reservation: once it is acknowledged
    # the same transaction goes through.
    wait_for(lambda: reservations(primary)["reservation_waiting_writes"] == 0)

    def retried() -> bool:
        with primary.pipeline(transaction=True) as pipe:
            pipe.execute_command("TWRITE", "t2", "a")
            return pipe.execute(raise_on_error=False)[0] == 0

    wait_for(retried)
    primary.close()


def writer(
    srv: RedisModuleServer, ledger: Ledger, keys: list[bytes], stop: threading.Event
) -> None:
    """Write 8 KB messages until stopped, recording every acknowledged
    offset; refused writes and a dead server are expected."""
    client = srv.client(socket_timeout=5)
    n = 0
    while not stop.is_set():
        key = keys[n % len(keys)]
        payload = b"%s:%d:" % (key, n) + b"x" * 8192
        n += 1
        try:
            ledger.record(key, client.execute_command("TWRITE", key, payload), payload)
        except redis.ResponseError:
            ledger.refused += 1
        except (redis.ConnectionError, redis.TimeoutError):
            return


def test_promoted_lagging_replica_hands_out_no_offset_twice(module_factory: Any) -> None:
    # The failover: a replica lagging 1.5 s, kill -9 of its primary
    # while writers run, the replica promoted.
    primary_srv, replica_srv = pair(module_factory)
    keys = [b"s%d" % n for n in range(4)]
    ledger = Ledger()
    stop = threading.Event()
    threads = [
        threading.Thread(target=writer, args=(primary_srv, ledger, keys, stop)) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(ledger.acked) > 2000, 30)
    with stopped(replica_srv):
        time.sleep(1.5)  # the lag: writers keep writing meanwhile
        primary_srv.kill9()
    stop.set()
    for thread in threads:
        thread.join(10)
    promoted = replica_srv.client()
    promoted.replicaof("NO", "ONE")
    lost = ledger.check_stored(promoted)
    for key in keys:
        ledger.write(promoted, key, messages(f"after-{key.decode()}", 50))
    assert ledger.reused == [], f"{len(ledger.reused)} offsets handed out twice"
    assert len(ledger.acked) > 2000
    # Writes acknowledged by WAIT are never lost: here every write the
    # replica acknowledged before it froze is there.
    assert lost < len(ledger.acked)
    promoted.close()


def test_a_full_sync_carries_the_reservation(module_factory: Any) -> None:
    primary_srv: RedisModuleServer = module_factory(repl_diskless_sync_delay=0)
    primary = primary_srv.client()
    ledger = Ledger()
    ledger.write(primary, b"s", messages("before", 10))  # no replica: mark well ahead
    replica_srv: RedisModuleServer = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}")
    wait_for(lambda: replica_online(primary))
    assert primary.execute_command("WAIT", 1, 5000) == 1
    with stopped(replica_srv):
        # The replica cut off, then writes inside the reservation it got
        # with the RDB (no new one is made): it never sees them.
        assert primary.client_kill_filter(_type="replica") == 1
        ledger.write(primary, b"s", messages("unseen", 100))
        primary_srv.kill9()
    promoted = replica_srv.client()
    promoted.replicaof("NO", "ONE")
    ledger.write(promoted, b"s", [b"after"])
    assert ledger.reused == []
    assert ledger.check_stored(promoted) == 100  # lost, not handed out again
    promoted.close()


@pytest.mark.parametrize("other_replica", [False, True])
def test_a_replica_that_just_came_online_holds_what_was_reserved_without_it(
    module_factory: Any, other_replica: bool
) -> None:
    # Reservations made while the replica was in its full sync were
    # confirmed without it (by the file alone, or by another replica);
    # they reach it after the RDB, behind everything else written
    # meanwhile. Writes inside them while it is online but has not read
    # that far must wait for it: promoted before it catches up, it would
    # hand those offsets out again.
    primary_srv: RedisModuleServer = module_factory(
        repl_diskless_sync="no",
        rdb_key_save_delay=20_000,  # a fork that saves for about a second
        client_output_buffer_limit="replica 0 0 0",
        # Long enough for the other replica to confirm the burst's
        # reservations behind 40 MB on a loaded machine (ASan's run too);
        # short once this replica is stopped (below).
        **{"rcp11.reservation-timeout-ms": 5000},
    )
    primary = primary_srv.client()
    for n in range(40):
        primary.set(f"filler{n}", "x")
    ledger = Ledger()
    if other_replica:
        module_factory(replicaof=f"127.0.0.1 {primary_srv.port}")
        wait_for(lambda: replica_online(primary), 30)
    ledger.write(primary, b"k", messages("alone", 10))
    replica_srv: RedisModuleServer = module_factory(replicaof=f"127.0.0.1 {primary_srv.port}")
    syncing = "slave1" if other_replica else "slave0"
    wait_for(lambda: primary.info("replication").get(syncing, {}).get("state") == "wait_bgsave")
    # During the sync: 40 MB ahead in the replica's stream, then a burst
    # that reserves (confirmed without this replica, which is not online).
    with primary.pipeline(transaction=False) as pipe:
        for n in range(40):
            pipe.set(f"big{n}", b"B" * (1 << 20))
        pipe.execute()
    ledger.write(primary, b"k", messages("syncing", 3000))
    wait_for(lambda: primary.info("replication").get(syncing, {}).get("state") == "online", 30)
    primary.config_set("rcp11.reservation-timeout-ms", 200)
    with stopped(replica_srv):
        before = set(ledger.acked)
        ledger.write(primary, b"k", messages("online", 5), tolerate_errors=True)
        online = set(ledger.acked) - before
        primary_srv.kill9()
    promoted = replica_srv.client()
    wait_for(lambda: promoted.info("replication")["master_link_status"] == "down")
    promoted.replicaof("NO", "ONE")
    ledger.write(promoted, b"k", messages("promoted", 5000))
    # Offsets handed out during the sync may come back (docs/MODULE.md:
    # a replica not online is not waited for); none acknowledged once it
    # was online.
    assert not set(ledger.reused) & online
    promoted.close()
    primary.close()


def test_failover_command_with_waiting_writers(module_factory: Any) -> None:
    primary_srv, replica_srv = pair(module_factory)
    primary = primary_srv.client()
    ledger = Ledger()
    ledger.write(primary, b"s", messages("a", 100))
    stop = threading.Event()
    thread = threading.Thread(target=writer, args=(primary_srv, ledger, [b"s", b"t"], stop))
    thread.start()
    wait_for(lambda: len(ledger.acked) > 300, 30)
    assert primary.execute_command("FAILOVER", "TIMEOUT", 5000) == b"OK"
    wait_for(lambda: primary.info("replication")["role"] == "slave", 30)
    stop.set()
    thread.join(10)
    promoted = replica_srv.client()
    wait_for(lambda: promoted.info("replication")["role"] == "master", 30)
    ledger.write(promoted, b"s", messages("after", 20))
    ledger.write(promoted, b"t", messages("after", 20))
    assert ledger.reused == []
    assert ledger.check_stored(promoted) == 0  # a planned failover loses nothing
    assert primary_srv.proc is not None and primary_srv.proc.poll() is None  # alive
    primary.close()
    promoted.close()


def test_read_committed_hides_what_the_replica_has_not_acknowledged(
    module_factory: Any,
) -> None:
    primary_srv, replica_srv = pair(module_factory, **{"rcp11.read-committed": "yes"})
    primary = primary_srv.client()
    tw(primary, "s", *messages("a", 10))
    wait_for(lambda: tr(primary, "s", 0, 100) == messages("a", 10))
    with stopped(replica_srv):
        tw(primary, "s", *messages("b", 5))  # inside the reservation: acknowledged write
        assert tr(primary, "s", 0, 100) == messages("a", 10)  # not seen yet
        info = primary.execute_command("TREAD", "s", 0, 0, "WITHINFO")[0]
        assert info[1] == 9  # last_offset: the last acknowledged one
        blocked = primary_srv.client()
        thread, box = in_thread(
            lambda: blocked.execute_command("TREAD", "s", 10, 10, "BLOCK", 10_000)
        )
        wait_blocked(primary, 1)
    thread.join(10)
    assert box.get("reply") == messages("b", 5)
    assert tr(primary, "s", 0, 100) == messages("a", 10) + messages("b", 5)
    primary.config_set("rcp11.read-committed", "no")
    primary.close()
    blocked.close()


def test_read_committed_never_shows_a_message_a_failover_takes_back(
    module_factory: Any,
) -> None:
    primary_srv, replica_srv = pair(module_factory, **{"rcp11.read-committed": "yes"})
    keys = [b"s0", b"s1"]
    ledger = Ledger()
    seen: dict[tuple[bytes, int], bytes] = {}
    stop = threading.Event()

    def reader() -> None:
        client = primary_srv.client(socket_timeout=5)
        positions = dict.fromkeys(keys, 0)
        while not stop.is_set():
            for key in keys:
                try:
                    got = client.execute_command("TREAD", key, positions[key], 100)
                except (redis.ConnectionError, redis.TimeoutError):
                    return
                for i, message in enumerate(got):
                    if message is not None:
                        seen[(key, positions[key] + i)] = message
                positions[key] += len(got)

    threads = [threading.Thread(target=writer, args=(primary_srv, ledger, keys, stop))]
    threads.append(threading.Thread(target=reader))
    for thread in threads:
        thread.start()
    wait_for(lambda: len(seen) > 500, 30)
    with stopped(replica_srv):
        time.sleep(1.0)
        primary_srv.kill9()
    stop.set()
    for thread in threads:
        thread.join(10)
    promoted = replica_srv.client()
    promoted.replicaof("NO", "ONE")
    for (key, offset), message in seen.items():
        assert tr(promoted, key, offset, 1) == [message], (key, offset)
    assert ledger.reused == []
    promoted.close()
