"""The wire (docs/PROTOCOL.md section 7, "Protocol"): RESP2 and RESP3
framing, inline commands as telnet sends them, pipelines and reads split
anywhere, malformed and hostile bytes answered as redis-server answers
them, and the clients users bring (redis-py sync and asyncio, hiredis and
the pure-Python parser). Limits on requests and replies:
test_protocol_limits.py; request elements of other RESP types:
test_protocol_request_types.py."""

from __future__ import annotations

import random
import time
from typing import Any

import hiredis
import pytest
import redis
import redis.asyncio
from conftest import (
    WRONGTYPE,
    RawClient,
    RedisServer,
    ServerProcess,
    exchange,
    in_thread,
    mbulk,
    raw_pipeline,
    tr,
    tw,
    wait_for,
)

# ----------------------------------------------- framing and inline commands


def test_inline_commands_like_telnet(stream_server: ServerProcess) -> None:
    out = exchange(stream_server.port, b'TWRITE inl "a b"\r\nTREAD inl 0 5\nPING\r\n', lines=4)
    assert out.startswith(b":0\r\n*1\r\n$3\r\na b\r\n+PONG\r\n")


def test_protocol_error_closes_connection(stream_server: ServerProcess) -> None:
    out = exchange(stream_server.port, b"*1\r\n$x\r\n", lines=5)
    assert out == b"-ERR Protocol error: invalid bulk length\r\n"


def test_inline_commands(shared_server: ServerProcess, shared_client: redis.Redis) -> None:
    conn = RawClient(shared_server.port)
    conn.send(b"PING\r\n\r\nSET k \"a b\\x41\"\nGET k\r\nTWRITE s 'it\\'s'\r\n")
    assert conn.reply() == b"PONG"
    assert conn.reply() == b"OK"
    assert conn.reply() == b"a bA"
    assert conn.reply() == 0
    conn.send(b"NOSUCHCOMMAND a\r\n")
    assert str(conn.reply()).startswith("ERR unknown command 'NOSUCHCOMMAND'")


def test_split_packets(shared_server: ServerProcess, shared_client: redis.Redis) -> None:
    conn = RawClient(shared_server.port, nodelay=True)
    data = (
        mbulk(b"TWRITE", b"split", b"hello world")
        + b"ECHO inline\r\n"
        + mbulk(b"TREAD", b"split", b"0", b"5")
    )
    for i in range(len(data)):
        conn.send(data[i : i + 1])
        if i % 7 == 0:
            time.sleep(0.001)
    assert conn.reply() == 0
    assert conn.reply() == b"inline"
    assert conn.reply() == [b"hello world"]


def test_malformed_protocol_closes_only_that_client(shared_server: ServerProcess) -> None:
    good = RawClient(shared_server.port)
    good.send(mbulk(b"PING"))
    assert good.reply() == b"PONG"
    for data, message in [
        (b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n", b"Protocol error: expected '$', got 'f'"),
        (b"*1\r\n$-5\r\n", b"Protocol error: invalid bulk length"),
        (b"*3000000000\r\n", b"Protocol error: invalid multibulk length"),
        (b'ECHO "unbalanced\r\n', b"Protocol error: unbalanced quotes in request"),
    ]:
        bad = RawClient(shared_server.port)
        bad.send(mbulk(b"ECHO", b"before") + data + mbulk(b"ECHO", b"after"))
        assert bad.reply() == b"before"  # commands before the bad one still run
        error = bad.reply()
        assert isinstance(error, hiredis.ReplyError)
        assert str(error) == "ERR " + message.decode()
        assert bad.closed()
        bad.close()
    good.send(mbulk(b"ECHO", b"still here"))
    assert good.reply() == b"still here"


def test_redis_py_pipeline_and_resp3(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    r2 = shared_server.client(protocol=2)
    pipe = r2.pipeline(transaction=False)
    for i in range(500):
        pipe.execute_command("TWRITE", "rp", f"m{i}")
    assert pipe.execute() == list(range(500))
    r3 = shared_server.client(protocol=3)
    assert r3.ping() is True
    conn = RawClient(shared_server.port)
    conn.send(mbulk(b"HELLO", b"3") + mbulk(b"GET", b"missing"))
    hello = conn.reply()
    assert isinstance(hello, dict) and hello[b"proto"] == 3
    conn.send(mbulk(b"GET", b"missing"))
    assert conn.reply() is None
    # RESP3 null is "_\r\n": check the raw bytes, hiredis hides the difference
    raw = RawClient(shared_server.port, timeout=5)
    raw.call("HELLO", "3")
    assert raw.call("GET", "missing") == b"_\r\n"
    raw.close()


def test_client_vanishing_mid_command(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    for partial in (b"*3\r\n$6\r\nTWRITE\r\n$1\r\nv\r\n$100\r\nabc", b"*2\r\n$4\r\nEC", b"TWRI"):
        conn = RawClient(shared_server.port)
        conn.send(partial)
        conn.close()
    r = shared_server.client()
    assert r.ping() is True
    assert r.execute_command("TREAD", "v", "0", "10") == []


def test_client_vanishing_mid_command_writes_nothing(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    with RawClient(shared_server.port) as vanishing:
        vanishing.send(b"*3\r\n$6\r\nTWRITE\r\n$4\r\nhalf\r\n$100\r\nonly-part-of-it")
        # Gone once the server holds the partial command in its query buffer.
        wait_for(lambda: any(int(cl["qbuf"]) > 0 for cl in shared_client.client_list()))
    with RawClient(shared_server.port) as vanishing:
        vanishing.send(b"*4\r\n$6\r\nTWRITE\r\n$4\r\nhalf\r\n$7\r\nENTRIES\r\n")
    wait_for(lambda: shared_client.info("clients")["connected_clients"] == 1)
    assert shared_client.exists("half") == 0
    assert tw(shared_client, "half", "whole") == 0


# -------------------------------------------- side by side with redis-server


SAME_AS_REDIS_RAW = [
    b"*1\r\n$3\r\nGET\r\n:1\r\n",
    b"*2\r\n$3\r\nGET\r\n:1\r\n",
    b"*abc\r\n",
    b"*1048577\r\n",
    b"*-1\r\n*0\r\nPING\r\n",
    b"$3\r\nabc\r\n",
    b'SET "a b\r\n',
    b"PING\r\n*1\r\n$-5\r\n",
    b"*1\r\n$4\r\nPINGxx\r\nPING\r\n",
    b"x" * 70000,
    b"*1\r\n$600000000\r\n",
    b"  \r\n\r\nPING\r\n",
    b"SET 'a\\'b' x\r\nGET \"a'b\"\r\nDEL \"a'b\"\r\n",
    b'ECHO "\\x41\\n"\r\n',
    b"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n*1\r\n$0\r\n\r\n",
]


@pytest.fixture(scope="module")
def redis_raw_answers(redis_reference: RedisServer) -> list[bytes]:
    """redis-server's answer to each malformed input, gathered in parallel
    (each one ends with a quiet period, so one after the other is slow)."""
    port = redis_reference.port
    jobs = [in_thread(lambda data=data: exchange(port, data)) for data in SAME_AS_REDIS_RAW]
    for thread, _ in jobs:
        thread.join(10)
    return [box["reply"] for _, box in jobs]


@pytest.mark.parametrize("index", range(len(SAME_AS_REDIS_RAW)))
def test_malformed_protocol_answers_like_redis(
    shared_server: ServerProcess, redis_raw_answers: list[bytes], index: int
) -> None:
    theirs = redis_raw_answers[index]
    data = SAME_AS_REDIS_RAW[index]
    ours = (
        exchange(shared_server.port, data, until=theirs)
        if theirs
        else exchange(shared_server.port, data)
    )
    assert ours == theirs
    assert exchange(shared_server.port, b"PING\r\n", lines=1) == b"+PONG\r\n"


# ----------------------------------------------------------------- pipelines


def test_pipeline_of_10k_commands_in_one_write(
    shared_server: ServerProcess, shared_client: redis.Redis
) -> None:
    conn = RawClient(shared_server.port)
    count = 10_000
    conn.send(b"".join(mbulk(b"TWRITE", b"p", b"m%d" % i) for i in range(count)))
    offsets = [conn.reply() for _ in range(count)]
    assert offsets == list(range(count))
    conn.send(mbulk(b"TREAD", b"p", b"9998", b"10"))
    assert conn.reply() == [b"m9998", b"m9999"]


def test_pipeline_without_transaction(
    stream_client: redis.Redis, stream_client3: redis.Redis
) -> None:
    for client in (stream_client, stream_client3):
        client.delete("s")
        pipe = client.pipeline(transaction=False)
        for n in range(100):
            pipe.execute_command("TWRITE", "s", f"m{n}")
        pipe.execute_command("TREAD", "s", -2, 2, "WITHINFO")
        replies = pipe.execute()
        assert replies[:100] == list(range(100))
        assert replies[100] == [[0, 99, 98, 2], b"m98", b"m99"]


def test_pipelined_twrites_answer_one_by_one_like_sequential_calls(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    shared_client.set("str", "x")
    out = raw_pipeline(
        shared_server.port,
        [
            ["TWRITE", "s", "a"],
            ["TWRITE", "s", "b"],
            ["TWRITE", "str", "c"],
            ["TWRITE", "s", "ENTRIES", "d", "e"],
            ["TWRITE", "s", "x", "y"],
            ["TWRITE", "s", "BACKLOG", "2", "ENTRIES", "f"],
            ["TWRITE", "s"],
            ["TWRITE", "t", "z"],
            ["TWRITE", "s", "g"],
            ["TREAD", "s", "0", "10"],
            ["TWRITE", "s", "h"],
            ["MULTI"],
            ["TWRITE", "s", "i"],
            ["EXEC"],
            ["TWRITE", "s", "j"],
        ],
    )
    assert out.startswith(b":0\r\n:1\r\n-WRONGTYPE Operation against a key holding")
    rest = out.split(b"wrong kind of value\r\n", 1)[1]
    assert rest.startswith(b":2\r\n-ERR ")
    assert rest.split(b"\r\n", 2)[2].startswith(
        b":4\r\n-ERR wrong number of arguments for 'twrite' command\r\n:0\r\n:5\r\n"
        b"*6\r\n$-1\r\n$-1\r\n$-1\r\n$1\r\ne\r\n$1\r\nf\r\n$1\r\ng\r\n"
        b":6\r\n+OK\r\n+QUEUED\r\n*1\r\n:7\r\n:8\r\n"
    )
    assert tr(shared_client, "s", 0, 20, "WITHINFO")[0] == [3, 8, 0, 9]


def test_big_pipeline_split_at_random_byte_boundaries(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    rng = random.Random(7)
    cmds = []
    for n in range(6000):
        if n % 500 == 499:
            cmds.append(mbulk("TREAD", "p", str(n - 3), "2"))
        elif n % 3 == 0:
            cmds.append(mbulk("TWRITE", "p", "ENTRIES", f"e{n}a", f"e{n}b"))
        else:
            cmds.append(mbulk("TWRITE", "p", f"e{n}" * rng.randint(1, 40)))
    data = b"".join(cmds) + b"ECHO __end__\r\n"  # the tail is inline, as telnet sends
    with shared_server.raw(timeout=10) as raw:
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 9000)
            raw.send(data[pos : pos + step])
            pos += step
        out = raw.read_until(b"$7\r\n__end__\r\n")
        assert not raw.eof, "server closed the connection"
    assert b"-ERR" not in out
    offsets = [int(line[1:]) for line in out.split(b"\r\n") if line.startswith(b":")]
    written = [n for n in range(6000) if n % 500 != 499]
    sizes = [2 if n % 3 == 0 else 1 for n in written]
    assert offsets == [sum(sizes[:k]) for k in range(len(sizes))]
    info = tr(shared_client, "p", 0, 0, "WITHINFO")[0]
    assert info[1] == sum(sizes) - 1


# ------------------------------------------------------------- hostile bytes


def test_random_garbage_never_takes_the_server_down(
    shared_client: redis.Redis, shared_server: ServerProcess
) -> None:
    tw(shared_client, "keep", "a", "b")
    rng = random.Random(11)
    alphabet = b"*$:+-_#%~,\r\n0123456789-abcTWRITEREAD \x00\xff"
    for _ in range(150):
        blob = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 120)))
        with RawClient(shared_server.port, timeout=2) as raw:
            raw.send(blob)
    assert shared_client.ping()
    assert tr(shared_client, "keep", 0, 5) == [b"a", b"b"]
    assert shared_client.dbsize() <= 3  # inline garbage may have written a key or two, nothing more


@pytest.mark.slow
def test_garbage_never_takes_the_server_down(fresh_server: ServerProcess) -> None:
    import random

    rng = random.Random(1234)
    valid = b"".join(
        mbulk(b"TWRITE", b"fz", b"m%d" % i) + mbulk(b"TREAD", b"fz", b"0", b"3") for i in range(20)
    )
    valid += (
        b"SET a 'b c'\r\nGET a\r\n" + mbulk(b"HELLO", b"3") + mbulk(b"TREAD", b"fz", b"-2", b"2")
    )
    for _ in range(40):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
        with fresh_server.raw(timeout=5) as conn:
            if conn.send(bytes(data), ignore_closed=True):
                conn.read_until_quiet(0.2)
    client = fresh_server.client()
    assert client.ping() is True
    assert client.execute_command("TWRITE", "after-fuzz", "x") == 0
    assert client.execute_command("TREAD", "after-fuzz", "0", "1") == [b"x"]
    assert "Traceback" not in fresh_server.output()  # no handler blew up either


# ------------------------------------------------------------------- clients


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("parser", ["hiredis", "python"])
def test_replies_parse_with_hiredis_and_the_pure_python_parser(
    shared_server: ServerProcess, protocol: int, parser: str
) -> None:
    from redis._parsers import _HiredisParser, _RESP2Parser, _RESP3Parser

    if parser == "hiredis":
        parser_class: Any = _HiredisParser  # hiredis is a dependency: no skip
    else:
        parser_class = _RESP2Parser if protocol == 2 else _RESP3Parser
    pool = redis.ConnectionPool(
        port=shared_server.port, protocol=protocol, parser_class=parser_class
    )
    cl = redis.Redis(connection_pool=pool)
    key = f"parsers-{protocol}-{parser}"
    assert tw(cl, key, "a", b"\x00\r\n", "c") == 0
    cl.execute_command("TEVICT", key, 0)
    assert tr(cl, key, 0, 5, "WITHINFO") == [[1, 2, 0, 3], None, b"\x00\r\n", b"c"]
    assert tr(cl, key, 9, 5, "BLOCK", 10) is None
    assert tr(cl, key, 9, 5, "BLOCK", 10, "WITHINFO") is None
    assert tr(cl, key, 0, 0) == []
    with pytest.raises(redis.ResponseError, match=WRONGTYPE):
        cl.get(key)
    cl.delete(key)
    cl.close()


def test_asyncio_client_and_transactions(stream_server: ServerProcess) -> None:
    import asyncio

    import redis.asyncio

    async def scenario() -> list[Any]:
        client = redis.asyncio.Redis(port=stream_server.port, protocol=3)
        await client.flushall()
        await client.execute_command("TWRITE", "s", "ENTRIES", "a", "b")
        async with client.pipeline(transaction=True) as pipe:
            pipe.execute_command("TWRITE", "s", "c")
            pipe.execute_command("TREAD", "s", -2, 5, "WITHINFO")
            pipe.execute_command("TREAD", "s", 0, 5, "GROUP", "g")
            replies = await pipe.execute()
        timeout = await client.execute_command("TREAD", "s", 10, 1, "BLOCK", 20)
        await client.aclose()
        return [*replies, timeout]

    assert asyncio.run(scenario()) == [2, [[0, 2, 1, 2], b"b", b"c"], [b"a", b"b", b"c"], None]
