"""Generic commands side by side with a real redis-server 7 (docs/PROTOCOL.md
section 7): where rcp11 promises Redis's behaviour, the same commands run
against both servers and the raw reply bytes must be identical, in RESP2
and RESP3. What rcp11 does on its own is in test_commands.py."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import (
    RawClient,
    RedisServer,
    ServerProcess,
    exchange,
    mbulk,
    parse_reply,
)


def same_as_redis(srv: ServerProcess, real_port: int, script: list[list[Any]]) -> None:
    """Run script on both servers (each starting empty) and compare every reply."""
    ours, theirs = RawClient(srv.port), RawClient(real_port)
    try:
        for conn in (ours, theirs):
            conn.call("FLUSHALL")
        for argv in script:
            mine, real = ours.call(*argv), theirs.call(*argv)
            if argv[0] == "KEYS" and mine.startswith(b"*"):
                # Redis lists keys in hash-table order; only the set matters.
                mine, real = sorted(parse_reply(mine)), sorted(parse_reply(real))
            if argv[0] == "PTTL" and mine.startswith(b":") and real.startswith(b":"):
                # Each server's clock may have crossed a millisecond since
                # the key was set: a positive PTTL may differ by a few ms.
                ms_mine, ms_real = int(mine[1:]), int(real[1:])
                if ms_mine > 0 and ms_real > 0 and abs(ms_mine - ms_real) <= 50:
                    mine = real
            assert mine == real, f"reply to {argv} differs"
    finally:
        ours.close()
        theirs.close()


COMPARED_SCRIPTS = {
    "ping_echo": [["PING"], ["PING", "hi"], ["PING", "a", "b"], ["ECHO", "x"], ["ECHO"]],
    "unknown": [["NOSUCH"], ["NOSUCH", "a", "b c"], ["nosuch"]],
    "set_options": [
        ["SET", "a", "1"],
        ["SET", "a", "2", "NX"],
        ["SET", "a", "3", "XX"],
        ["SET", "b", "3", "XX"],
        ["SET", "a", "4", "GET"],
        ["SET", "new", "4", "GET"],
        ["SET", "a", "b", "NX", "XX"],
        ["SET", "a", "b", "EX", "0"],
        ["SET", "a", "b", "EX", "-1"],
        ["SET", "a", "b", "EX", "x"],
        ["SET", "a", "b", "EX", "10", "PX", "10"],
        ["SET", "a", "b", "KEEPTTL", "EX", "10"],
        ["SET", "a", "b", "EX"],
        ["SET", "a", "b", "FOO"],
        ["SET", "a"],
        ["GET", "a"],
        ["GET", "missing"],
    ],
    "counters": [
        ["INCR", "n"],
        ["INCRBY", "n", "41"],
        ["DECR", "n"],
        ["DECRBY", "n", "10"],
        ["INCRBY", "n", "x"],
        ["SET", "s", "abc"],
        ["INCR", "s"],
        ["SET", "s", "01"],
        ["INCR", "s"],
        ["SET", "big", "9223372036854775807"],
        ["INCR", "big"],
        ["SET", "small", "-9223372036854775808"],
        ["DECR", "small"],
        ["GET", "n"],
    ],
    "multi_keys": [
        ["MSET", "a", "1", "b", "2"],
        ["MSET", "a"],
        ["MSET", "a", "1", "b"],
        ["MGET", "a", "b", "c"],
        ["EXISTS", "a", "a", "c"],
        ["DEL", "a", "c"],
        ["UNLINK", "b", "b"],
        ["DBSIZE"],
        ["MSETNX", "x", "1", "y", "2"],
        ["MSETNX", "y", "3", "z", "4"],
        ["MGET", "x", "y", "z"],
    ],
    "strings_more": [
        ["APPEND", "a", "hello"],
        ["APPEND", "a", " world"],
        ["STRLEN", "a"],
        ["STRLEN", "nope"],
        ["SETNX", "a", "x"],
        ["SETNX", "b", "x"],
        ["GETDEL", "b"],
        ["GETDEL", "b"],
        ["SETEX", "t", "100", "v"],
        ["TTL", "t"],
        ["SETEX", "t", "0", "v"],
        ["SETEX", "t", "x", "v"],
        ["PSETEX", "t", "100000", "w"],
        ["PTTL", "t"],
        ["PSETEX", "t", "-5", "w"],
        ["GETSET", "t", "z"],
        ["TTL", "t"],
        ["GETSET", "new", "z"],
    ],
    "type_rename": [
        ["TYPE", "a"],
        ["SET", "a", "1"],
        ["TYPE", "a"],
        ["RENAME", "nosuch", "b"],
        ["RENAMENX", "nosuch", "b"],
        ["RENAME", "a", "b"],
        ["GET", "b"],
        ["SET", "c", "3"],
        ["RENAMENX", "b", "c"],
        ["RENAMENX", "b", "d"],
        ["RENAME", "d", "d"],
        ["KEYS", "*"],
    ],
    "expiry": [
        ["SET", "a", "1"],
        ["TTL", "a"],
        ["TTL", "missing"],
        ["PTTL", "missing"],
        ["EXPIRE", "a", "100"],
        ["TTL", "a"],
        ["EXPIRE", "a", "200", "NX"],
        ["EXPIRE", "a", "50", "GT"],
        ["EXPIRE", "a", "500", "GT"],
        ["TTL", "a"],
        ["PERSIST", "a"],
        ["PERSIST", "a"],
        ["TTL", "a"],
        ["EXPIRE", "missing", "10"],
        ["EXPIRE", "a", "x"],
        ["EXPIRE", "a", "10", "NX", "XX"],
        ["EXPIRE", "a", "-1"],
        ["EXISTS", "a"],
        ["SET", "b", "1", "EX", "100"],
        ["SET", "b", "2"],
        ["TTL", "b"],
        ["SET", "b", "2", "EX", "100"],
        ["SET", "b", "3", "KEEPTTL"],
        ["TTL", "b"],
        ["INCR", "b"],
        ["TTL", "b"],
        # Absolute expiry times, Redis 7: fixed instants, so both agree.
        ["EXPIRETIME", "missing"],
        ["PEXPIRETIME", "missing"],
        ["SET", "c", "1"],
        ["EXPIRETIME", "c"],
        ["EXPIREAT", "c", "4102444800"],
        ["EXPIRETIME", "c"],
        ["PEXPIRETIME", "c"],
        ["PEXPIREAT", "c", "4102444800623"],
        ["EXPIRETIME", "c"],
        ["PEXPIRETIME", "c"],
        ["EXPIRETIME"],
        ["PEXPIRETIME", "c", "d"],
    ],
    "transactions": [
        ["EXEC"],
        ["DISCARD"],
        ["MULTI"],
        ["MULTI"],
        ["WATCH", "a"],
        ["SET", "a", "1"],
        ["INCR", "a"],
        ["GET", "a"],
        ["EXEC"],
        ["MULTI"],
        ["GET"],
        ["SET", "a", "2"],
        ["EXEC"],
        ["GET", "a"],
        ["MULTI"],
        ["SET", "a", "x"],
        ["DISCARD"],
        ["GET", "a"],
        ["WATCH"],
        ["UNWATCH"],
        ["MULTI"],
        ["SET", "s", "str"],
        ["INCR", "s"],
        ["EXEC"],
    ],
    "keys_patterns": [
        ["MSET", "user:1", "a", "user:2", "b", "user:10", "c", "h*llo", "d", "hello", "e"],
        ["KEYS", "user:?"],
        ["KEYS", "user:[1-2]"],
        ["KEYS", "user:[^1]"],
        ["KEYS", "h\\*llo"],
        ["KEYS", "nomatch*"],
        ["KEYS"],
    ],
    "scan_errors": [
        ["SCAN", "x"],
        ["SCAN", "0", "COUNT", "0"],
        ["SCAN", "0", "COUNT", "x"],
        ["SCAN", "0", "FOO", "1"],
        ["SCAN", "0", "MATCH"],
        ["SCAN"],
    ],
    "server_errors": [
        ["SELECT", "0"],
        ["SELECT", "x"],
        ["SELECT", "0", "1"],
        ["FLUSHALL", "x"],
        ["FLUSHDB", "ASYNC"],
        ["FLUSHALL", "SYNC"],
        ["DBSIZE", "x"],
        ["TIME", "x"],
        ["AUTH", "x"],
        ["AUTH", "a", "b", "c"],
        ["AUTH", "default", "anything"],
        ["AUTH", "someone", "x"],
        ["HELLO", "4"],
        ["HELLO", "x"],
        ["HELLO", "3", "AUTH"],
        ["HELLO", "2", "SETNAME"],
        ["HELLO", "3", "FOO"],
    ],
    "client_errors": [
        ["CLIENT"],
        ["CLIENT", "FOO"],
        ["CLIENT", "SETNAME"],
        ["CLIENT", "SETNAME", "a b"],
        ["CLIENT", "GETNAME"],
        ["CLIENT", "SETNAME", "worker-1"],
        ["CLIENT", "GETNAME"],
        ["CLIENT", "SETNAME", ""],
        ["CLIENT", "GETNAME"],
        ["CLIENT", "KILL", "1.2.3.4:5"],
        ["CLIENT", "KILL", "ID", "x"],
        ["CLIENT", "KILL", "ID", "0"],
        ["CLIENT", "KILL", "ID", "999999"],
        ["CLIENT", "KILL", "FOO", "bar"],
        ["CLIENT", "KILL", "ADDR", "1.2.3.4:5", "SKIPME"],
        ["CLIENT", "KILL", "USER", "nobody"],
        ["CLIENT", "NO-EVICT", "on"],
        ["CLIENT", "NO-EVICT", "maybe"],
    ],
    "config_object_memory": [
        ["CONFIG"],
        ["CONFIG", "FOO"],
        ["CONFIG", "GET"],
        ["CONFIG", "SET", "nosuchdirective", "1"],
        ["CONFIG", "SET", "maxmemory", "abc"],
        ["CONFIG", "SET", "maxmemory"],
        ["CONFIG", "GET", "maxmemory"],
        ["SET", "i", "12345"],
        ["SET", "e", "short string"],
        ["SET", "w", "x" * 60],
        ["OBJECT", "ENCODING", "i"],
        ["OBJECT", "ENCODING", "e"],
        ["OBJECT", "ENCODING", "w"],
        ["OBJECT", "ENCODING", "nosuch"],
        ["OBJECT", "FOO", "i"],
        ["OBJECT"],
        ["MEMORY", "USAGE", "nosuch"],
        ["MEMORY", "FOO"],
        ["MEMORY", "USAGE", "i", "SAMPLES", "x"],
        ["COMMAND", "COUNT", "x"],
        ["COMMAND", "FOO"],
        ["COMMAND", "INFO", "nosuchcommand"],
        ["COMMAND", "GETKEYS", "nosuchcommand", "a"],
        ["COMMAND", "GETKEYS", "get", "a"],
        ["COMMAND", "GETKEYS", "mset", "a", "1", "b", "2"],
        ["COMMAND", "GETKEYS", "ping"],
        ["SHUTDOWN", "FOO"],
        ["MULTI"],
        ["SHUTDOWN", "NOSAVE"],
        ["CLIENT", "ID"],
        ["EXEC"],
    ],
}


@pytest.mark.parametrize("name", sorted(COMPARED_SCRIPTS))
def test_replies_are_byte_identical_to_redis(
    shared_server: ServerProcess, redis_reference: RedisServer, name: str
) -> None:
    same_as_redis(shared_server, redis_reference.port, COMPARED_SCRIPTS[name])


SAME_AS_REDIS_CMDS = [
    [["SELECT", "0"], ["SELECT", "-1"], ["SELECT", "x"]],
    [["ECHO"], ["ECHO", "a", "b"], ["PING", "a", "b"], ["PING", "hi"]],
    [["HELLO", "4"], ["HELLO", "x"], ["AUTH", "x"], ["AUTH", "a", "b"], ["QUIT"]],
    [["RESET"], ["MULTI"], ["RESET"], ["EXEC"]],
    [["CLIENT", "SETNAME", "a b"], ["CLIENT", "SETNAME", "n"], ["CLIENT", "GETNAME"]],
    [["CLIENT", "KILL", "1.2.3.4:5"], ["CLIENT", "KILL", "ID", "999999"], ["CLIENT", "FOO"]],
    [["CONFIG"], ["CONFIG", "GET"], ["CONFIG", "SET", "foo", "bar"], ["CONFIG", "FOO"]],
    [["CONFIG", "SET", "maxmemory", "abc"], ["CONFIG", "SET", "maxmemory", "1.5mb"]],
    [["CONFIG", "SET", "daemonize", "yes"], ["CONFIG", "SET", "unixsocket", "/tmp/x"]],
    [["CONFIG", "SET", "timeout", "-1"], ["CONFIG", "SET", "loglevel", "loud"]],
    [["CONFIG", "SET", "save", "100"], ["CONFIG", "SET", "save", "x 1"]],
    [["CONFIG", "SET", "client-output-buffer-limit", "foo 1 1 1"]],
    [["CONFIG", "SET", "timeout", "1", "timeout", "2"], ["CONFIG", "REWRITE"]],
    [["CONFIG", "SET", "maxmemory", "1mb"], ["CONFIG", "GET", "maxmemory"]]
    + [["CONFIG", "SET", "maxmemory", "0"], ["CONFIG", "GET", "maxmemory-policy"]],
    [["CONFIG", "SET", "save", "100 1 50 2"], ["CONFIG", "GET", "save"]]
    + [["CONFIG", "SET", "save", ""], ["CONFIG", "GET", "save"]],
    [["FLUSHALL", "foo"], ["FLUSHALL", "ASYNC"], ["FLUSHDB", "SYNC"], ["DBSIZE"]],
    [["DEL"], ["EXISTS"], ["TYPE"], ["TYPE", "nokey"], ["KEYS"], ["TIME", "x"]],
    [["RENAME", "a", "b"], ["SET", "a", "1"], ["RENAME", "a", "a"], ["RENAME", "a", "b"]]
    + [["GET", "b"], ["EXISTS", "a", "b", "b"], ["DEL", "a", "b"]],
    [["SET", "k", "v", "NX", "XX"], ["SET", "k", "v", "EX", "0"], ["SET", "k", "v", "EX", "-1"]],
    [["SET", "k", "v", "PX", "0"], ["SET", "k", "v", "EX", "abc"], ["SET", "k", "v", "FOO"]],
    [["SET", "k", "v", "EX", "1", "PX", "100"], ["SET", "k"], ["DEL", "k"]],
    [["SET", "k", "v", "GET"], ["SET", "k", "w", "GET"], ["SET", "k", "x", "NX", "GET"]]
    + [["SET", "k", "y", "XX"], ["SET", "nk", "y", "XX"], ["MGET", "k", "nk"], ["DEL", "k"]],
    [["SET", "k", "9223372036854775807"], ["INCR", "k"], ["INCRBY", "k", "x"]]
    + [["INCRBY", "k", "9223372036854775808"], ["SET", "k", " 1"], ["INCR", "k"], ["DEL", "k"]],
    [["SET", "k", "-9223372036854775808"], ["INCRBY", "k", "-1"], ["DEL", "k"]],
    [["MULTI"], ["MULTI"], ["DISCARD"], ["EXEC"], ["DISCARD"]],
    [["MULTI"], ["WATCH", "x"], ["FOO"], ["EXEC"]],
    [["MULTI"], ["GET"], ["SET", "a", "1"], ["EXEC"], ["EXISTS", "a"]],
    [["MULTI"], ["SET", "a", "x"], ["INCR", "a"], ["GET", "a"], ["EXEC"], ["DEL", "a"]],
    [["WATCH"], ["UNWATCH", "x"], ["SAVE", "x"], ["BGSAVE", "foo"], ["LASTSAVE", "x"]],
    [["BGREWRITEAOF", "x"], ["SHUTDOWN", "foo"], ["SHUTDOWN", "NOSAVE", "SAVE"]],
    [["MEMORY", "USAGE", "nokey"], ["MEMORY", "USAGE"], ["MEMORY", "FOO"]],
    [["OBJECT", "ENCODING", "nokey"], ["OBJECT", "ENCODING"], ["OBJECT", "FOO"]],
    [["SET", "n", "123"], ["SET", "e", "abc"], ["SET", "w", "x" * 60]]
    + [["OBJECT", "ENCODING", "n"], ["OBJECT", "ENCODING", "e"], ["OBJECT", "ENCODING", "w"]]
    + [["DEL", "n", "e", "w"]],
    [["COMMAND", "COUNT", "x"], ["COMMAND", "INFO", "nonexistent"], ["COMMAND", "FOO"]],
    [["INFO", "foo"], ["SCAN", "x"], ["SCAN", "0", "COUNT", "0"], ["SCAN", "0", "MATCH"]],
    [["SCAN", "0", "COUNT", "x"], ["SCAN", "0", "TYPE"], ["SCAN", "0", "FOO", "bar"]],
]


@pytest.mark.parametrize("cmds", SAME_AS_REDIS_CMDS, ids=range(len(SAME_AS_REDIS_CMDS)))
def test_generic_command_replies_match_redis(
    shared_server: ServerProcess,
    shared_client: redis.Redis,
    redis_reference: RedisServer,
    cmds: list[list[str]],
) -> None:
    redis_reference.client().flushall()  # both start empty (c2 flushed ours)
    data = b"".join(mbulk(*cmd) for cmd in cmds) + mbulk("ECHO", "__end__")
    for hello in (b"", mbulk("HELLO", "3")):
        ours = exchange(shared_server.port, hello + data, until=b"__end__\r\n")
        theirs = redis_reference.exchange(hello + data, until=b"__end__\r\n")
        strip = b"modules\r\n*0\r\n"
        assert ours.split(strip)[-1] == theirs.split(strip)[-1]


@pytest.mark.parametrize("command", ["CLIENT", "COMMAND", "CONFIG", "MEMORY", "OBJECT"])
def test_help_describes_help_as_redis_does(
    shared_client: redis.Redis, redis_reference: RedisServer, command: str
) -> None:
    # The subcommand lists differ (the servers differ); the line that
    # describes HELP itself is the same text in every redis-server 7 HELP.
    def help_line(client: redis.Redis) -> bytes:
        callbacks = dict(client.response_callbacks)
        client.response_callbacks.pop(command, None)  # redis-py parses COMMAND's reply
        try:
            lines = client.execute_command(command, "HELP")
        finally:
            client.response_callbacks.update(callbacks)
        return lines[lines.index(b"HELP") + 1]

    assert help_line(shared_client) == help_line(redis_reference.client())
