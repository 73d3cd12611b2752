"""Acknowledged groups (docs/PROTOCOL.md section 3, "Acknowledged groups"):
lease reads, redelivery of expired leases before anything new with their
delivery counts, ACK and TACK, TGROUP INFO / PENDING, eviction of leased
messages, what the group key is to the other commands, every error, and
blocked lease readers (woken by writes and by leases running out, in the
order they blocked). Every test runs against both servers."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from conftest import Reader, ServerProcess, error_of, tr, tw, wait_blocked, wait_for

LEASE_LONG = 600_000


def lease(client: redis.Redis, key: str, group: str, count: int, *options: Any) -> dict[str, Any]:
    """One lease read, its reply taken apart."""
    reply = tr(client, key, 0, count, "GROUP", group, *options)
    info = reply[0]
    assert len(info) == 6
    first, last, start, n, deliveries, deadline = info
    assert n == len(reply) - 1
    return {
        "first": first,
        "last": last,
        "start": start,
        "count": n,
        "deliveries": deliveries,
        "deadline": deadline,
        "messages": reply[1:],
    }


def group_info(client: redis.Redis, key: str, group: str) -> dict[str, Any]:
    """TGROUP INFO as a dict, in RESP2 (a flat array) and RESP3 (a map)."""
    reply = client.execute_command("TGROUP", "INFO", key, group)
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    info = {k.decode() if isinstance(k, bytes) else k: v for k, v in reply.items()}
    consumers = []
    for entry in info["consumers"]:
        if isinstance(entry, list):
            entry = dict(zip(entry[::2], entry[1::2], strict=True))
        consumers.append({k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()})
    info["consumers"] = consumers
    if isinstance(info["mode"], bytes):
        info["mode"] = info["mode"].decode()
    return info


def pending(client: redis.Redis, key: str, group: str) -> list[list[Any]]:
    return client.execute_command("TGROUP", "PENDING", key, group, 0, 1000)


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_expired(client: redis.Redis, key: str, group: str, count: int) -> None:
    wait_for(lambda: group_info(client, key, group)["expired"] >= count, timeout=10)


# ---------------------------------------------------------------- lease reads


def test_a_lease_read_leases_and_tack_acknowledges(stream_client_resp: redis.Redis) -> None:
    c = stream_client_resp
    tw(c, "jobs", *"abcde")
    before = now_ms()
    got = lease(c, "jobs", "g", 2, "LEASE", 30_000, "CONSUMER", "w1")
    assert got["messages"] == [b"a", b"b"]
    assert (got["first"], got["last"], got["start"], got["count"]) == (0, 4, 0, 2)
    assert got["deliveries"] == 1
    assert before + 30_000 <= got["deadline"] <= now_ms() + 30_000
    assert c.type("g") == b"rcp11-grp"
    assert pending(c, "jobs", "g") == [[0, 2, b"w1", 1, got["deadline"]]]
    info = group_info(c, "jobs", "g")
    assert info["mode"] == "acknowledged"
    assert (info["next-offset"], info["lag"], info["pending"], info["expired"]) == (2, 3, 2, 0)
    assert info["consumers"] == [
        {"name": b"w1", "pending": 2, "expired": 0, "lease-deadline": got["deadline"]}
    ]
    assert c.execute_command("TACK", "g", 0, 2) == 2
    assert c.execute_command("TACK", "g", 0, 2) == 0  # acknowledged twice counts once
    assert pending(c, "jobs", "g") == []
    info = group_info(c, "jobs", "g")
    assert (info["pending"], info["delivered"], info["acknowledged"]) == (0, 2, 2)
    assert info["consumers"] == []


def test_the_next_read_acknowledges_the_last_batch_with_ack(stream_client: redis.Redis) -> None:
    c = stream_client
    tw(c, "jobs", *[str(i) for i in range(250)])
    seen: list[bytes] = []
    ack: tuple[int, ...] = ()
    while True:
        extra = ("ACK", *ack) if ack else ()
        got = lease(c, "jobs", "g", 100, "LEASE", LEASE_LONG, *extra)
        if not got["count"]:
            break
        seen += got["messages"]
        ack = (got["start"], got["count"])
    assert seen == [str(i).encode() for i in range(250)]
    info = group_info(c, "jobs", "g")
    assert (info["pending"], info["delivered"], info["acknowledged"]) == (0, 250, 250)
    assert info["lag"] == 0


def test_an_expired_lease_goes_to_the_next_reader_before_anything_new(
    stream_client: redis.Redis,
) -> None:
    c = stream_client
    tw(c, "jobs", *"abcdef")
    lease(c, "jobs", "g", 2, "LEASE", 100, "CONSUMER", "dead")
    lease(c, "jobs", "g", 2, "LEASE", LEASE_LONG, "CONSUMER", "slow")
    wait_expired(c, "jobs", "g", 2)
    again = lease(c, "jobs", "g", 10, "LEASE", LEASE_LONG, "CONSUMER", "w2")
    # The dead consumer's batch, not the new messages e and f, and only it:
    # one read delivers one range.
    assert again["messages"] == [b"a", b"b"]
    assert (again["start"], again["deliveries"]) == (0, 2)
    assert lease(c, "jobs", "g", 10, "LEASE", LEASE_LONG)["messages"] == [b"e", b"f"]
    info = group_info(c, "jobs", "g")
    assert (info["delivered"], info["redelivered"]) == (8, 2)
    rows = pending(c, "jobs", "g")
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (0, 2, b"w2", 2),
        (2, 2, b"slow", 1),
        (4, 2, b"", 1),
    ]


def test_delivery_counts_grow_and_the_lowest_expired_range_goes_first(
    stream_client: redis.Redis,
) -> None:
    c = stream_client
    tw(c, "jobs", *"abcdefgh")
    lease(c, "jobs", "g", 3, "LEASE", LEASE_LONG)  # 0..2 held
    lease(c, "jobs", "g", 3, "LEASE", 50)  # 3..5 will run out
    lease(c, "jobs", "g", 2, "LEASE", 80)  # 6..7 will run out
    wait_expired(c, "jobs", "g", 5)
    assert lease(c, "jobs", "g", 2, "LEASE", 50, "CONSUMER", "x")["start"] == 3  # part of 3..5
    got = lease(c, "jobs", "g", 9, "LEASE", 50, "CONSUMER", "y")
    assert (got["start"], got["count"], got["deliveries"]) == (5, 1, 2)
    wait_expired(c, "jobs", "g", 5)
    got = lease(c, "jobs", "g", 9, "LEASE", 50)
    assert (got["start"], got["count"], got["deliveries"]) == (3, 2, 3)
    # A dead-letter step: a consumer that sees deliveries past its limit
    # acknowledges (after parking the messages elsewhere).
    assert c.execute_command("TACK", "g", 3, 2, 5, 1, 6, 2) == 5


def test_a_read_with_nothing_to_deliver_answers_the_header(stream_client: redis.Redis) -> None:
    c = stream_client
    got = lease(c, "jobs", "g", 10, "LEASE", 1000)
    assert got == {
        "first": 0,
        "last": -1,
        "start": 0,
        "count": 0,
        "deliveries": 0,
        "deadline": 0,
        "messages": [],
    }
    assert c.type("g") == b"rcp11-grp"  # created, as GROUP creates its key
    tw(c, "jobs", "a")
    assert lease(c, "jobs", "g", 0, "LEASE", 1000)["count"] == 0  # count 0 leases nothing
    assert group_info(c, "jobs", "g")["pending"] == 0
    # GROUPNEW starts a new group after what exists.
    assert lease(c, "jobs", "h", 10, "LEASE", 1000).get("start") == 0
    assert tr(c, "jobs", 0, 10, "GROUPNEW", "n", "LEASE", 1000)[0][2:4] == [1, 0]


def test_evicted_leased_messages_are_gone_for_everyone(stream_client: redis.Redis) -> None:
    c = stream_client
    tw(c, "jobs", *[str(i) for i in range(10)])
    first = lease(c, "jobs", "g", 6, "LEASE", 50, "CONSUMER", "w1")
    assert first["start"] == 0
    c.execute_command("TEVICT", "jobs", 3)  # 0..3 gone while leased
    # Pending lists only what can still be processed.
    assert [r[:2] for r in pending(c, "jobs", "g")] == [[4, 2]]
    assert group_info(c, "jobs", "g")["pending"] == 2
    wait_expired(c, "jobs", "g", 2)
    again = lease(c, "jobs", "g", 10, "LEASE", LEASE_LONG)
    assert (again["start"], again["messages"], again["deliveries"]) == (4, [b"4", b"5"], 2)
    info = group_info(c, "jobs", "g")
    assert info["dropped"] == 4
    # Acknowledging a dropped offset counts nothing; the rest still counts.
    assert c.execute_command("TACK", "g", 0, 6) == 2
    # Unread messages evicted before the group got to them are skipped,
    # never delivered as nulls.
    c.execute_command("TEVICT", "jobs", 7)
    got = lease(c, "jobs", "g", 10, "LEASE", LEASE_LONG)
    assert (got["start"], got["messages"]) == (8, [b"8", b"9"])
    assert group_info(c, "jobs", "g")["lag"] == 0


# ------------------------------------------------- the group key and its type


def test_a_plain_group_key_turns_acknowledged_at_its_position(stream_client: redis.Redis) -> None:
    c = stream_client
    tw(c, "jobs", *"abcde")
    assert tr(c, "jobs", 0, 2, "GROUP", "g") == [b"a", b"b"]
    info = group_info(c, "jobs", "g")
    assert (info["mode"], info["next-offset"], info["lag"], info["pending"]) == ("plain", 2, 3, 0)
    got = lease(c, "jobs", "g", 2, "LEASE", 1000)
    assert got["messages"] == [b"c", b"d"]
    assert c.type("g") == b"rcp11-grp"
    assert "WRONGTYPE" in error_of(c, "GET", "g")
    assert error_of(c, "TREAD", "jobs", 0, 1, "GROUP", "g") == (
        "group key 'g' holds an acknowledged group: read it with LEASE"
    )
    # SET makes it a plain group again; DEL forgets it with its leases.
    c.set("g", 4)
    assert tr(c, "jobs", 0, 5, "GROUP", "g") == [b"e"]
    c.delete("g")
    assert lease(c, "jobs", "g", 1, "LEASE", 1000)["messages"] == [b"a"]


def test_an_acknowledged_group_belongs_to_its_stream(stream_client: redis.Redis) -> None:
    c = stream_client
    tw(c, "a", "x")
    tw(c, "b", "y")
    lease(c, "a", "g", 1, "LEASE", 1000)
    expected = "group key 'g' belongs to stream 'a'"
    assert error_of(c, "TREAD", "b", 0, 1, "GROUP", "g", "LEASE", 1000) == expected
    assert error_of(c, "TGROUP", "INFO", "b", "g") == expected
    assert error_of(c, "TGROUP", "PENDING", "b", "g", 0, 10) == expected
    # RENAME moves the group (it still belongs to stream a).
    c.rename("g", "g2")
    assert group_info(c, "a", "g2")["pending"] == 1


def test_other_commands_on_a_group_key(stream_client: redis.Redis) -> None:
    c = stream_client
    tw(c, "jobs", *"ab")
    lease(c, "jobs", "g", 2, "LEASE", 1000)
    assert "WRONGTYPE" in error_of(c, "TWRITE", "g", "x")
    assert "WRONGTYPE" in error_of(c, "TREAD", "g", 0, 1)
    assert "WRONGTYPE" in error_of(c, "TACK", "jobs", 0, 1)
    c.set("s", "1")
    assert "WRONGTYPE" in error_of(c, "TACK", "s", 0, 1)
    assert c.execute_command("TACK", "missing", 0, 1) == 0
    assert error_of(c, "TGROUP", "INFO", "jobs", "missing") == "no such key"
    assert 0 < c.memory_usage("g") < 2000
    assert c.execute_command("SCAN", 0, "TYPE", "rcp11-grp")[1] == [b"g"]
    c.pexpire("g", 50)
    wait_for(lambda: not c.exists("g"), timeout=10)


def test_memory_is_per_range_not_per_message(stream_client: redis.Redis) -> None:
    c = stream_client
    for _ in range(5):
        tw(c, "jobs", *["m"] * 20_000)
    lease(c, "jobs", "g", 100_000, "LEASE", LEASE_LONG, "CONSUMER", "w")
    one_range = c.memory_usage("g")
    assert group_info(c, "jobs", "g")["pending"] == 100_000
    assert one_range < 1000
    c.execute_command("TACK", "g", *[x for i in range(1, 100_000, 2) for x in (i, 1)][:2000])
    # Every other offset acknowledged in one stretch: 1000 ranges now.
    assert group_info(c, "jobs", "g")["pending-ranges"] == 1001
    assert c.memory_usage("g") < one_range + 1001 * 64


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("TREAD", "s", 0, 1, "LEASE", 10), "LEASE needs GROUP or GROUPNEW"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "CONSUMER", "c"), "CONSUMER needs LEASE"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "ACK", 0, 1), "ACK needs LEASE"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "NONULLS"),
         "NONULLS cannot be used with LEASE"),
        (("TREAD", "s", 0, 1, "nonulls", "GROUPNEW", "g", "LEASE", 9, "BLOCK", 0),
         "NONULLS cannot be used with LEASE"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "WITHTIMES"),
         "WITHTIMES cannot be used with LEASE"),
        (("TREAD", "s", 0, 1, "withtimes", "WITHINFO", "GROUP", "g", "LEASE", 9, "BLOCK", 0),
         "WITHTIMES cannot be used with LEASE"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "PACKED", "LEASE", 9, "ACK", 0, 1),
         "PACKED cannot be used with LEASE"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 0), "LEASE must be an integer from 1 to "
         "2147483647 (milliseconds)"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 2**31), "LEASE must be an integer from 1 to "
         "2147483647 (milliseconds)"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", "x"), "LEASE must be an integer from 1 to "
         "2147483647 (milliseconds)"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "CONSUMER", "c" * 257),
         "consumer name is longer than 256 bytes"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "ACK", -1, 1), "offset must be >= 0"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "ACK", 0, -1), "count must be >= 0"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "ACK", "x", 1),
         "offset is not an integer or out of range"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "ACK", 0),
         "syntax error, ACK needs a start and a count"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE", 9, "LEASE", 9),
         "syntax error, LEASE given more than once"),
        (("TREAD", "s", 0, 1, "GROUP", "g", "LEASE"), "syntax error, LEASE needs a value"),
        (("TACK", "g", 0), "wrong number of arguments for 'tack' command"),
        (("TACK", "g", 0, 1, 2), "wrong number of arguments for 'tack' command"),
        (("TACK", "g", 0, "x"), "count is not an integer or out of range"),
        (("TACK", "g", -5, 1), "offset must be >= 0"),
        (("TGROUP", "NOPE"), "unknown subcommand 'NOPE'. Try TGROUP HELP."),
        (("TGROUP", "INFO", "s"), "wrong number of arguments for 'tgroup|info' command"),
        (("TGROUP", "PENDING", "s", "g", 0, -1), "count must be >= 0"),
        (("RCP11.LEASE", "g", "s", 0, 0, 1, 99, 1, "c"),
         "RCP11.LEASE is internal: only a primary's replication stream and the AOF may send it"),
    ],
)  # fmt: skip
def test_errors_change_nothing(
    stream_client: redis.Redis, argv: tuple[Any, ...], message: str
) -> None:
    c = stream_client
    tw(c, "s", *"abc")
    assert error_of(c, *argv) == message
    assert not c.exists("g")


# ------------------------------------------------------------- blocked readers


def test_a_blocked_lease_reader_is_woken_by_a_write(stream_server: ServerProcess) -> None:
    c = stream_server.client()
    c.flushall()
    reader = Reader(
        stream_server, "TREAD", "jobs", 0, 5, "GROUPNEW", "g", "LEASE", 1000, "BLOCK", 0
    )
    reader.start()
    wait_blocked(c, 1)
    assert c.type("g") == b"rcp11-grp"  # created when the reader started waiting
    tw(c, "jobs", "a", "b")
    reply = reader.result()
    assert reply[0][2:5] == [0, 2, 1]
    assert reply[1:] == [b"a", b"b"]
    assert group_info(c, "jobs", "g")["pending"] == 2
    c.close()


def test_a_blocked_lease_reader_is_woken_when_a_lease_runs_out(
    stream_server: ServerProcess,
) -> None:
    c = stream_server.client()
    c.flushall()
    tw(c, "jobs", "a", "b")
    lease(c, "jobs", "g", 2, "LEASE", 300, "CONSUMER", "dies")
    started = time.monotonic()
    reader = Reader(stream_server, "TREAD", "jobs", 0, 5, "GROUP", "g", "LEASE", 1000, "BLOCK", 0)
    reader.start()
    reply = reader.result()  # no write happens: the lease running out wakes it
    assert time.monotonic() - started >= 0.2
    assert reply[0][2:5] == [0, 2, 2]
    assert reply[1:] == [b"a", b"b"]
    c.close()


def test_blocked_lease_readers_get_leases_as_each_runs_out(stream_server: ServerProcess) -> None:
    c = stream_server.client()
    c.flushall()
    tw(c, "jobs", *"abcd")
    lease(c, "jobs", "g", 2, "LEASE", 200, "CONSUMER", "first")
    lease(c, "jobs", "g", 2, "LEASE", 600, "CONSUMER", "second")
    argv = ("TREAD", "jobs", 0, 5, "GROUP", "g", "LEASE", 60_000, "BLOCK", 0)
    early, late = Reader(stream_server, *argv), Reader(stream_server, *argv)
    early.start()
    wait_blocked(c, 1)
    late.start()
    wait_blocked(c, 2)
    # Without a write: the first lease's end wakes both, the first reader
    # takes it, the second waits on until the second lease ends.
    assert early.result()[1:] == [b"a", b"b"]
    assert late.result()[1:] == [b"c", b"d"]
    assert group_info(c, "jobs", "g")["redelivered"] == 4
    c.close()


def test_blocked_lease_readers_are_served_in_the_order_they_blocked(
    stream_server: ServerProcess,
) -> None:
    c = stream_server.client()
    c.flushall()
    readers = []
    for _ in range(3):
        readers.append(
            Reader(stream_server, "TREAD", "jobs", 0, 2, "GROUP", "g", "LEASE", 1000, "BLOCK", 0)
        )
        readers[-1].start()
        wait_blocked(c, len(readers))
    tw(c, "jobs", *"abcde")
    replies = [r.result() for r in readers]
    assert [r[1:] for r in replies] == [[b"a", b"b"], [b"c", b"d"], [b"e"]]
    c.close()


def test_a_blocked_lease_read_times_out_with_a_null(stream_client: redis.Redis) -> None:
    assert tr(stream_client, "jobs", 0, 5, "GROUP", "g", "LEASE", 1000, "BLOCK", 50) is None


def test_a_lease_read_inside_multi_does_not_block(stream_client: redis.Redis) -> None:
    pipe = stream_client.pipeline(transaction=True)
    pipe.execute_command("TREAD", "jobs", 0, 5, "GROUP", "g", "LEASE", 1000, "BLOCK", 0)
    pipe.execute_command("TWRITE", "jobs", "a")
    pipe.execute_command("TREAD", "jobs", 0, 5, "GROUP", "g", "LEASE", 1000, "ACK", 0, 1)
    empty, _, got = pipe.execute()
    assert empty[0][3] == 0
    assert got[1:] == [b"a"]


def test_watch_sees_lease_reads_and_acknowledgements(stream_server: ServerProcess) -> None:
    c = stream_server.client()
    other = stream_server.client()
    c.flushall()
    tw(c, "jobs", *"ab")
    for change in (
        lambda: lease(other, "jobs", "g", 1, "LEASE", 1000),
        lambda: other.execute_command("TACK", "g", 0, 1),
    ):
        pipe = c.pipeline(transaction=True)
        pipe.watch("g")
        change()
        pipe.multi()
        pipe.set("x", 1)
        with pytest.raises(redis.WatchError):
            pipe.execute()
    c.close()
    other.close()
