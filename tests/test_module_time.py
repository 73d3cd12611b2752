"""Time inside the module (docs/PROTOCOL.md section 6): TSEEK, and
retention by age and by size applied by the module's timer in bounded
steps, replicated and logged as absolute TEVICT cuts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from conftest import RedisModuleServer, tw, wait_for


@pytest.fixture(scope="module")
def msrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisModuleServer]:
    server = RedisModuleServer(tmp_path_factory.mktemp("module-time"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def r(msrv: RedisModuleServer) -> Iterator[redis.Redis]:
    client = msrv.client()
    client.flushall()
    yield client
    client.config_set("rcp11.stream-node-max-entries", 1000)
    client.close()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def next_ms(client: redis.Redis) -> int:
    """Wait until the server's clock has passed the current millisecond:
    messages written from then on are appended at a later time."""
    now = server_ms(client)
    assert wait_for(lambda: server_ms(client) > now)
    return server_ms(client)


# ---------------------------------------------------------------- TSEEK


def test_tseek_finds_the_first_message_at_or_after_a_time(r: redis.Redis) -> None:
    # Five messages per node: each batch below fills its own nodes, so a
    # batch's first message starts a node and the answer is exact.
    r.config_set("rcp11.stream-node-max-entries", 5)
    before = next_ms(r)
    tw(r, "s", *[b"a%d" % n for n in range(5)])
    middle = next_ms(r)
    tw(r, "s", *[b"b%d" % n for n in range(10)])
    after = next_ms(r)
    assert r.execute_command("TSEEK", "s", before - 1) == 0
    assert r.execute_command("TSEEK", "s", middle) == 5
    assert r.execute_command("TSEEK", "s", after) == 15  # none yet: the next offset
    r.execute_command("TEVICT", "s", 6)
    # Evicted messages are not readable: the first readable one answers.
    assert r.execute_command("TSEEK", "s", before - 1) == 7
    assert r.execute_command("TSEEK", "s", middle) == 7
    assert r.execute_command("TSEEK", "missing", middle) == 0
    assert r.execute_command("TSEEK", "s", -5) == 7  # any integer is a time


def test_tseek_never_answers_later_than_the_message(r: redis.Redis) -> None:
    # One big node: the answer may be early (the sparse index), by at most
    # 63 messages, never late.
    tw(r, "s", *[b"old"] * 200)
    middle = next_ms(r)
    tw(r, "s", *[b"new"] * 200)
    found = r.execute_command("TSEEK", "s", middle)
    assert 200 - 63 <= found <= 200


def test_tseek_errors(r: redis.Redis) -> None:
    r.set("str", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.execute_command("TSEEK", "str", 0)
    with pytest.raises(redis.ResponseError, match="time is not an integer or out of range"):
        r.execute_command("TSEEK", "s", "soon")
    with pytest.raises(redis.ResponseError, match="time is not an integer or out of range"):
        r.execute_command("TSEEK", "s", "99999999999999999999")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("TSEEK", "s")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("TSEEK", "s", 1, 2)
    assert r.command_getkeys("TSEEK", "s", 0) in ([b"s"], ["s"])
