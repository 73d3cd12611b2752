"""The module's commands inside Redis's ACLs. Where the host has the API
(valkey-server 8.1, Redis 7.4+) they sit in Redis's categories, as its own
stream commands do, and in the module's category @rcp11; on Redis 7.0 they
sit in none, the load says so in the log, and the rules of docs/MODULE.md
("ACLs"), which name the commands, hold on both hosts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from conftest import RedisModuleServer, module_host, tr, tw

# The commands and their categories where the host has them.
CATEGORIES = {
    "twrite": {"write", "fast", "rcp11"},
    "tread": {"read", "slow", "blocking", "rcp11"},
    "tevict": {"write", "fast", "rcp11"},
    "tconcat": {"write", "slow", "rcp11"},
    "tseek": {"read", "fast", "rcp11"},
    "rcp11.skipto": {"write", "fast", "rcp11"},
    "rcp11.twriteat": {"write", "fast", "rcp11"},
    "rcp11.node": {"write", "slow", "rcp11"},
    "tack": {"write", "fast", "rcp11"},
    "tgroup|info": {"read", "slow", "rcp11"},
    "tgroup|pending": {"read", "slow", "rcp11"},
    "tgroup|help": {"slow", "rcp11"},
    "rcp11.lease": {"write", "fast", "rcp11"},
    "rcp11.group": {"write", "slow", "rcp11"},
    "rcp11.reserve": {"write", "fast", "rcp11"},
    "rcp11.groupmove": {"write", "fast", "rcp11"},
}
WRITES = [
    ("TWRITE", "s", "x"),
    ("TEVICT", "s", 0),
    ("TCONCAT", "s", "other"),
    ("RCP11.SKIPTO", "s", 100),
]
READS = [("TREAD", "s", 0, 1), ("TSEEK", "s", 0)]
# A group read moves its group key: it needs RCP11.GROUPMOVE's permission too.
GROUP_READ = ("TREAD", "s", 0, 1, "GROUP", "s:g")
LEASE_READ = ("TREAD", "s", 0, 1, "GROUP", "s:acked", "LEASE", 60_000)
HAS_CATEGORIES = module_host() == "valkey"  # Debian's redis-server is 7.0


@pytest.fixture
def users(
    msrv: RedisModuleServer, msrv_client: redis.Redis
) -> Iterator[Callable[..., redis.Redis]]:
    """user(name, *rules) -> a client logged in as a new user; the users
    are deleted afterwards. msrv_client holds a stream "s"."""
    made: dict[str, redis.Redis] = {}
    tw(msrv_client, "s", "first")
    tw(msrv_client, "other", "second")

    def user(name: str, *rules: str) -> redis.Redis:
        msrv_client.execute_command("ACL", "SETUSER", name, "reset", "on", "nopass", *rules)
        made[name] = msrv.client(username=name, password="any")
        return made[name]

    yield user
    for name, client in made.items():
        client.close()
        msrv_client.execute_command("ACL", "DELUSER", name)


def refused(client: redis.Redis, *argv: object) -> bool:
    try:
        client.execute_command(*argv)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_acl_cat_lists_the_commands_in_their_categories(
    msrv: RedisModuleServer, msrv_client: redis.Redis
) -> None:
    listed = {
        category: {c.decode() for c in msrv_client.execute_command("ACL", "CAT", category)}
        for category in ("read", "write", "fast", "slow", "blocking")
    }
    for command, expected in CATEGORIES.items():
        found = {category for category, names in listed.items() if command in names}
        if HAS_CATEGORIES:
            assert found == expected - {"rcp11"}, command
        else:
            assert found == set(), command  # Redis 7.0: in no category
    cats = {c.decode() for c in msrv_client.execute_command("ACL", "CAT")}
    if HAS_CATEGORIES:
        own = {c.decode() for c in msrv_client.execute_command("ACL", "CAT", "rcp11")}
        assert "rcp11" in cats and own == set(CATEGORIES)
        assert "cannot put module commands in ACL categories" not in msrv.log()
    else:
        assert "rcp11" not in cats
        assert (
            "rcp11: this server cannot put module commands in ACL categories (Redis 7.0)"
            in msrv.log()
        )


def test_command_info_shows_the_categories(msrv: RedisModuleServer) -> None:
    for command, expected in CATEGORIES.items():
        info = msrv.command("COMMAND", "INFO", command)[0]  # as the server sends it
        shown = {c.decode().lstrip("@") for c in info[6]}
        assert shown == (expected if HAS_CATEGORIES else set()), command


def test_category_rules_reach_the_commands(users: Callable[..., redis.Redis]) -> None:
    no_writes = users("no-writes", "~*", "+@all", "-@write")
    readers = users("readers", "~*", "+@read")
    no_blocking = users("no-blocking", "~*", "+@all", "-@blocking")
    if HAS_CATEGORIES:
        streams_only = users("streams-only", "~*", "+@rcp11")
        assert all(refused(no_writes, *argv) for argv in WRITES)
        assert tr(no_writes, "s", 0, 1) == [b"first"]
        assert all(refused(readers, *argv) for argv in WRITES)
        assert not any(refused(readers, *argv) for argv in READS)
        assert refused(readers, *GROUP_READ) and refused(no_writes, *GROUP_READ)
        assert not any(refused(streams_only, *argv) for argv in [*READS, *WRITES, GROUP_READ])
        assert refused(streams_only, "GET", "s")
        assert refused(no_blocking, "TREAD", "s", 0, 1)
        assert not refused(no_blocking, "TSEEK", "s", 0)
    else:
        # Redis 7.0: category rules miss the commands, which is why the
        # rules must name them (next test).
        assert not refused(no_writes, "TWRITE", "s", "x")
        assert all(refused(readers, *argv) for argv in READS)
        assert not refused(no_blocking, "TREAD", "s", 0, 1)
        with pytest.raises(redis.ResponseError, match="Unknown command or category"):
            users("streams-only", "~*", "+@rcp11")


def test_group_reads_need_write_access_to_the_group_key(users: Callable[..., redis.Redis]) -> None:
    """TREAD is @read, yet a group read moves its group key: the key spec
    asks for write access to it, which read-only key rules (%R~) deny, and
    the user needs RCP11.GROUPMOVE's permission (@write, @rcp11, or named)."""
    moves = ("+@read", "+tread", "+tseek", "+rcp11.groupmove")
    read_only_keys = users("ro-keys", "%R~*", *moves)
    group_keys_writable = users("groups", "%R~*", "~s:*", *moves)
    stream_readers = users("stream-readers", "~*", "+@read", "+tread", "+tseek")
    assert tr(read_only_keys, "s", 0, 1) == [b"first"]
    assert refused(read_only_keys, *GROUP_READ)
    assert tr(group_keys_writable, *GROUP_READ[1:]) == [b"first"]
    assert tr(stream_readers, "s", 0, 1) == [b"first"]
    for command in ("GROUP", "GROUPNEW"):
        with pytest.raises(redis.exceptions.NoPermissionError, match="rcp11.groupmove"):
            stream_readers.execute_command("TREAD", "s", 0, 1, command, "s:h", "BLOCK", 10)
        # A lease read (an acknowledged group) moves its group too.
        with pytest.raises(redis.exceptions.NoPermissionError, match="rcp11.groupmove"):
            stream_readers.execute_command("TREAD", "s", 0, 1, command, "s:h", "LEASE", 1000)
    assert not stream_readers.exists("s:h")  # nothing moved, nothing created
    lease_read = ("TREAD", "s", 0, 1, "GROUP", "s:acked", "LEASE", 1000)
    assert group_keys_writable.execute_command(*lease_read)[1:] == [b"first"]


def test_a_refused_group_read_is_in_the_acl_log(
    users: Callable[..., redis.Redis], msrv_client: redis.Redis
) -> None:
    msrv_client.execute_command("ACL", "LOG", "RESET")
    reader = users("log-reader", "~*", "+@read", "+tread")
    assert refused(reader, *GROUP_READ)
    entry = msrv_client.acl_log(count=1)[0]
    assert (entry["username"], entry["reason"], entry["object"]) == (
        "log-reader",
        "command",
        "rcp11.groupmove",
    )


def documented_rules() -> dict[str, list[str]]:
    """The ACL SETUSER lines of docs/MODULE.md ("ACLs"): user -> rules."""
    text = (Path(__file__).parent.parent / "docs" / "MODULE.md").read_text()
    rules = {}
    for line in text.splitlines():
        words = line.split()
        if words[:2] == ["ACL", "SETUSER"]:
            rules[words[2]] = words[3:]
    return rules


def test_the_documented_rules_hold_on_every_host(
    msrv: RedisModuleServer, users: Callable[..., redis.Redis], msrv_client: redis.Redis
) -> None:
    """docs/MODULE.md, ACLs: rules that name the commands, for Redis 7.0,
    and the same on a host with categories, run as written."""
    rules = documented_rules()
    assert set(rules) == {"analyst", "reader", "consumer", "producer"}
    clients = {}
    for name, user_rules in rules.items():
        msrv_client.execute_command("ACL", "SETUSER", name, "reset", *user_rules)
        clients[name] = msrv.client(username=name, password="secret")
    try:
        for name, client in clients.items():
            for argv in READS:
                assert not refused(client, *argv), (name, argv)
            for argv in WRITES:
                assert refused(client, *argv) == (name != "producer"), (name, argv)
            assert refused(client, *GROUP_READ) == (name in ("analyst", "reader")), name
            assert refused(client, *LEASE_READ) == (name in ("analyst", "reader")), name
            # Acknowledging is a write: the consumer's rules name TACK (the
            # producer's +@write reaches it only on a host with categories).
            if name != "producer":
                assert refused(client, "TACK", "s:acked", 0, 1) == (name != "consumer"), name
    finally:
        for name, client in clients.items():
            client.close()
            msrv_client.execute_command("ACL", "DELUSER", name)
