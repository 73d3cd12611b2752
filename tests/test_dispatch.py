"""execute() without a network: dispatch checks, transactions, propagation
order, blocking and group hand-out, seen through what clients receive."""

from __future__ import annotations

from typing import Any

import hiredis
import pytest
from conftest import dispatch_read
from helpers_dispatch import Client, RecordingPersistence, recording_state, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rcp11 import errors
from rcp11.commands import BLOCKED, COMMANDS, execute, parse_int
from rcp11.config import Config
from rcp11.errors import CommandError
from rcp11.resp import NULL_ARRAY, QUEUED, Error, encode
from rcp11.state import ClientState, ServerState
from rcp11.storage import MUTATIONS


@pytest.fixture
def state() -> ServerState:
    return recording_state()


def wire(reply: Any, resp3: bool = False) -> bytes:
    return encode(reply, resp3)


def test_unknown_command_and_arity_errors_read_like_redis(state: ServerState) -> None:
    c = Client()
    assert run(state, c, "NOPE", "a", "b") == Error(
        "ERR unknown command 'NOPE', with args beginning with: 'a' 'b' "
    )
    assert run(state, c, "GET") == Error("ERR wrong number of arguments for 'get' command")
    assert run(state, c, "tread", "k", "0") == Error(
        "ERR wrong number of arguments for 'tread' command"
    )


def test_every_command_has_a_sane_table_row() -> None:
    for name, cmd in COMMANDS.items():
        assert name == cmd.name == name.lower()
        assert cmd.arity != 0
        assert not ({"write", "readonly"} <= cmd.flags), name
        if cmd.first_key:
            assert cmd.step >= 1, name


def test_noauth_until_auth_then_commands_run(state: ServerState) -> None:
    state.config.set("requirepass", "pw")
    c = Client()
    c.authenticated = False
    assert run(state, c, "PING") == Error(errors.NOAUTH)
    assert run(state, c, "TWRITE", "s", "x") == Error(errors.NOAUTH)
    assert run(state, c, "AUTH", "bad") == Error(errors.WRONGPASS)
    assert run(state, c, "AUTH", "pw") == "OK"
    assert run(state, c, "TWRITE", "s", "x") == 0


def test_queued_commands_answer_queued_and_exec_runs_them_in_order(state: ServerState) -> None:
    c = Client()
    assert run(state, c, "MULTI") == "OK"
    assert run(state, c, "TWRITE", "s", "a") is QUEUED
    assert run(state, c, "TREAD", "s", "0", "10") is QUEUED
    assert wire(run(state, c, "EXEC")) == b"*2\r\n:0\r\n*1\r\n$1\r\na\r\n"
    assert state.persistence.log == [[b"MULTI"], [b"TWRITE", b"s", b"a"], [b"EXEC"]]


def test_exec_that_changes_nothing_propagates_nothing(state: ServerState) -> None:
    c = Client()
    run(state, c, "MULTI")
    run(state, c, "GET", "x")
    run(state, c, "TREAD", "s", "0", "1")
    assert wire(run(state, c, "EXEC")) == b"*2\r\n$-1\r\n*0\r\n"
    assert state.persistence.log == []


def test_errors_while_queuing_abort_exec(state: ServerState) -> None:
    c = Client()
    run(state, c, "MULTI")
    assert run(state, c, "GET") == Error(errors.wrong_arity("get"))
    assert run(state, c, "NOSUCH") == Error(errors.unknown_command("NOSUCH", []))
    run(state, c, "SET", "a", "1")
    assert run(state, c, "EXEC") == Error(errors.EXEC_ABORT)
    assert run(state, c, "GET", "a") is None
    assert run(state, c, "EXEC") == Error(errors.EXEC_WITHOUT_MULTI)


def test_watch_makes_exec_return_null_array_when_key_changed(state: ServerState) -> None:
    c, other = Client(), Client()
    run(state, c, "WATCH", "s")
    run(state, other, "TWRITE", "s", "x")
    run(state, c, "MULTI")
    run(state, c, "SET", "a", "1")
    assert run(state, c, "EXEC") is NULL_ARRAY
    assert run(state, c, "GET", "a") is None
    # EXEC forgot the watch: the next transaction runs.
    run(state, c, "MULTI")
    run(state, c, "SET", "a", "1")
    assert wire(run(state, c, "EXEC")) == b"*1\r\n+OK\r\n"


def test_misconf_refuses_writes_but_not_reads(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "s", "x")
    state.persistence.refuse = errors.MISCONF
    assert run(state, c, "TWRITE", "s", "y") == Error(errors.MISCONF)
    assert run(state, c, "SET", "a", "1") == Error(errors.MISCONF)
    assert wire(run(state, c, "TREAD", "s", "0", "5")) == b"*1\r\n$1\r\nx\r\n"
    # A group read moves its group key: a write.
    assert run(state, c, "TREAD", "s", "0", "5", "GROUP", "g") == Error(errors.MISCONF)
    state.persistence.refuse = None
    assert run(state, c, "TWRITE", "s", "y") == 1


def test_maxmemory_refuses_denyoom_commands_only(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "s", "x" * 1000)
    state.config.set("maxmemory", "100")
    assert run(state, c, "TWRITE", "s", "y") == Error(errors.OOM)
    assert run(state, c, "SET", "k", "v") == Error(errors.OOM)
    # Commands that free memory still run.
    assert run(state, c, "TEVICT", "s", "0") == 1
    assert run(state, c, "DEL", "s") == 1
    assert run(state, c, "SET", "k", "v") == "OK"


def test_used_memory_tracks_writes_and_deletes(state: ServerState) -> None:
    c = Client()
    assert state.keyspace.used_bytes == 0
    run(state, c, "SET", "k", "v" * 500)
    after_set = state.keyspace.used_bytes
    assert after_set > 500
    run(state, c, "TWRITE", "s", "ENTRIES", *["m" * 100] * 50)
    with_stream = state.keyspace.used_bytes
    assert with_stream > after_set + 5000
    assert run(state, c, "MEMORY", "USAGE", "s") == with_stream - after_set
    run(state, c, "DEL", "s", "k")
    assert state.keyspace.used_bytes == 0


def test_del_of_many_keys_counts_each_deleted_key_once(state: ServerState) -> None:
    """DEL's one-call path: strings, streams and groups together, keys
    named twice, missing keys and keys past their deadline (they expire
    and log their own DEL, uncounted); memory and WATCH follow."""
    c = Client()
    for i in range(1000):
        run(state, c, "SET", f"k{i}", "v" * (i % 9))
        if i % 2:
            run(state, c, "TWRITE", f"s{i}", "ENTRIES", *["m"] * (i % 5 + 1))
    run(state, c, "TWRITE", "grouped", "x")
    run(state, c, "TREAD", "grouped", 0, 1, "GROUP", "g", "LEASE", 30_000, "CONSUMER", "w")
    assert type(state.keyspace.data[b"g"]).__name__ == "AckGroup"
    for i in range(0, 1000, 10):
        state.keyspace.set_expire(f"k{i}".encode(), 1)  # long past
    keys = [f"k{i}" for i in range(1000)] + [f"s{i}" for i in range(1000)]
    keys += ["k5", "s5", "missing", "grouped", "g"]
    watching_deleted, watching_missing = Client(), Client()
    run(state, watching_deleted, "WATCH", "s999")
    run(state, watching_missing, "WATCH", "missing")
    state.persistence.log.clear()
    assert run(state, c, "DEL", *keys) == 900 + 500 + 2
    assert state.keyspace.data == {}
    assert state.keyspace.used_bytes == 0
    expired = [[b"DEL", f"k{i}".encode()] for i in range(0, 1000, 10)]
    assert state.persistence.log == [*expired, [b"DEL", *(k.encode() for k in keys)]]
    assert run(state, c, "DEL", *keys) == 0
    for watcher, aborted in ((watching_deleted, True), (watching_missing, False)):
        run(state, watcher, "MULTI")
        run(state, watcher, "SET", "other", "v")
        assert (wire(run(state, watcher, "EXEC")) == b"*-1\r\n") == aborted


def test_mget_of_many_keys_reads_keys_past_their_deadline_as_missing(
    state: ServerState,
) -> None:
    """MGET's one-call lookup (Keyspace.get_many) expires what get() would,
    logging each DEL in order; during CLIENT PAUSE WRITE such keys read as
    missing but stay (as in redis-server 7.0)."""
    c = Client()
    keys = [f"k{i}" for i in range(1000)]
    run(state, c, "MSET", *[x for i in range(1000) for x in (f"k{i}", f"v{i}")])
    run(state, c, "SET", "later", "x")
    for i in range(0, 1000, 7):
        state.keyspace.set_expire(f"k{i}".encode(), 1)  # long past
    state.persistence.log.clear()
    reply = run(state, c, "MGET", *keys, "k7", "missing")
    expected = [None if i % 7 == 0 else f"v{i}".encode() for i in range(1000)]
    assert reply == [*expected, None, None]
    assert state.persistence.log == [[b"DEL", f"k{i}".encode()] for i in range(0, 1000, 7)]
    assert run(state, c, "CLIENT", "PAUSE", 60_000, "WRITE") == "OK"
    state.keyspace.set_expire(b"later", 1)
    assert run(state, c, "MGET", "k1", "later") == [b"v1", None]
    assert b"later" in state.keyspace.data
    run(state, c, "CLIENT", "UNPAUSE")


def test_twrite_reserves_offsets_before_appending(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "s", "ENTRIES", "a", "b", "c")
    run(state, c, "TWRITE", "s", "d")
    assert state.persistence.reserved == [(b"s", 3), (b"s", 4)]


def test_twrite_past_the_largest_offset_fails_and_writes_nothing(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "s", "a")
    stream = state.keyspace.get(b"s")
    stream.raise_next_offset(2**63 - 2)
    assert run(state, c, "TWRITE", "s", "ENTRIES", "x", "y", "z") == Error(errors.OFFSET_OVERFLOW)
    assert stream.next_offset == 2**63 - 2
    # The largest offset itself can be written, nothing after it.
    assert run(state, c, "TWRITE", "s", "ENTRIES", "x", "y") == 2**63 - 2
    assert run(state, c, "TWRITE", "s", "z") == Error(errors.OFFSET_OVERFLOW)
    assert wire(run(state, c, "TREAD", "s", "-1", "5")) == b"*1\r\n$1\r\ny\r\n"


def test_tread_in_resp3_uses_resp3_nulls_for_evicted_offsets(state: ServerState) -> None:
    c2, c3 = Client(), Client(resp=3)
    run(state, c2, "TWRITE", "s", "ENTRIES", "a", "b")
    run(state, c2, "TEVICT", "s", "0")
    assert wire(run(state, c2, "TREAD", "s", "0", "5")) == b"*2\r\n$-1\r\n$1\r\nb\r\n"
    assert wire(run(state, c3, "TREAD", "s", "0", "5"), True) == b"*2\r\n_\r\n$1\r\nb\r\n"


def test_blocked_reader_is_served_after_the_write_is_propagated(state: ServerState) -> None:
    reader, writer = Client(), Client()
    assert run(state, reader, "TREAD", "s", "0", "10", "BLOCK", "0", "GROUP", "g") is BLOCKED
    assert reader.received == []

    original_send = reader.send

    def send_checking_log(reply: Any) -> None:
        # Redis's order: the write is logged before the woken reader hears of it.
        assert [b"TWRITE", b"s", b"m"] in state.persistence.log
        original_send(reply)

    reader.send = send_checking_log  # type: ignore[method-assign]
    assert run(state, writer, "TWRITE", "s", "m") == 0
    assert [wire(r) for r in reader.received] == [b"*1\r\n$1\r\nm\r\n"]
    assert reader.blocked is None and reader.unblocked == 1
    assert state.persistence.log[-1] == [b"SET", b"g", b"1"]
    assert state.blocking.blocked_clients == 0


def test_group_hands_messages_to_blocked_readers_in_blocking_order(state: ServerState) -> None:
    readers = [Client() for _ in range(3)]
    for reader in readers:
        assert run(state, reader, "TREAD", "s", "0", "2", "BLOCK", "0", "GROUP", "g") is BLOCKED
    run(state, Client(), "TWRITE", "s", "ENTRIES", "a", "b", "c")
    assert [wire(r) for r in readers[0].received] == [b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"]
    assert [wire(r) for r in readers[1].received] == [b"*1\r\n$1\r\nc\r\n"]
    assert readers[2].received == [] and readers[2].blocked is not None
    # The first reader blocks again and queues behind the third.
    run(state, readers[0], "TREAD", "s", "0", "2", "BLOCK", "0", "GROUP", "g")
    run(state, Client(), "TWRITE", "s", "d")
    assert [wire(r) for r in readers[2].received] == [b"*1\r\n$1\r\nd\r\n"]
    assert len(readers[0].received) == 1
    assert run(state, Client(), "GET", "g") == b"4"


def test_disconnected_blocked_reader_is_forgotten(state: ServerState) -> None:
    gone, stays = Client(), Client()
    run(state, gone, "TREAD", "s", "0", "1", "BLOCK", "0", "GROUP", "g")
    run(state, stays, "TREAD", "s", "0", "1", "BLOCK", "0", "GROUP", "g")
    state.blocking.remove(gone)
    run(state, Client(), "TWRITE", "s", "m")
    assert gone.received == []
    assert [wire(r) for r in stays.received] == [b"*1\r\n$1\r\nm\r\n"]


def test_timeout_answers_null_array(state: ServerState) -> None:
    reader = Client(resp=3)
    run(state, reader, "TREAD", "s", "0", "1", "BLOCK", "50")
    deadline = reader.blocked.deadline
    state.blocking.expire(deadline - 0.01)
    assert reader.received == []
    state.blocking.expire(deadline)
    assert reader.received == [NULL_ARRAY]
    assert wire(NULL_ARRAY, True) == b"_\r\n" and wire(NULL_ARRAY) == b"*-1\r\n"
    assert reader.blocked is None and reader.unblocked == 1


def test_blocking_inside_multi_does_not_block(state: ServerState) -> None:
    c = Client()
    run(state, c, "MULTI")
    run(state, c, "TREAD", "s", "0", "1", "BLOCK", "0")
    assert wire(run(state, c, "EXEC")) == b"*1\r\n*0\r\n"
    assert c.blocked is None


def test_reader_blocked_on_a_key_that_becomes_a_string_gets_wrongtype(
    state: ServerState,
) -> None:
    reader = Client()
    run(state, reader, "TREAD", "s", "0", "1", "BLOCK", "0")
    run(state, Client(), "SET", "s", "text")
    assert reader.received == [Error(errors.WRONGTYPE)]


def test_reader_blocked_past_next_offset_waits_until_the_stream_reaches_it(
    state: ServerState,
) -> None:
    reader, writer = Client(), Client()
    run(state, reader, "TREAD", "s", "2", "5", "BLOCK", "0")
    run(state, writer, "TWRITE", "s", "ENTRIES", "a", "b")
    assert reader.received == []
    run(state, writer, "TWRITE", "s", "c")
    assert [wire(r) for r in reader.received] == [b"*1\r\n$1\r\nc\r\n"]


def test_parse_int_follows_redis_string2ll() -> None:
    assert parse_int(b"-12") == -12
    assert parse_int(b"9223372036854775807") == 2**63 - 1
    for bad in (b"", b"01", b"+1", b" 1", b"-0", b"1.0", b"9223372036854775808", b"x"):
        with pytest.raises(CommandError):
            parse_int(bad)


_TOKENS = [
    b"s",
    b"g",
    b"k",
    b"0",
    b"1",
    b"-1",
    b"10",
    b"-100",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"99999999999999999999",
    b"x",
    b"",
    b"\xff\x00",
    b"ENTRIES",
    b"BACKLOG",
    b"BLOCK",
    b"GROUP",
    b"GROUPNEW",
    b"WITHINFO",
    b"NX",
    b"XX",
    b"EX",
    b"PX",
    b"GET",
    b"KEEPTTL",
    b"MATCH",
    b"COUNT",
    b"TYPE",
    b"ID",
    b"*",
    b"[a-",
    b"\\",
]


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(set(COMMANDS) - {"shutdown", "config"})),
    args=st.lists(st.sampled_from(_TOKENS), max_size=7),
    resp=st.sampled_from([2, 3]),
)
def test_no_argument_list_breaks_a_command(name: str, args: list[bytes], resp: int) -> None:
    """Whatever the arguments, a command answers with a reply or a Redis
    style error, never an internal error, and the reply can be encoded."""
    state = ServerState(Config())
    state.persistence = RecordingPersistence()
    c = Client(resp=resp)
    run(state, c, "TWRITE", "s", "ENTRIES", "a", "b", "c")
    run(state, c, "SET", "k", "v")
    run(state, c, "SET", "g", "1")
    reply = execute(state, c, [name.encode(), *args])
    if isinstance(reply, Error):
        assert not reply.message.startswith("ERR internal error"), reply.message
        assert reply.message.split()[0].isupper()
    elif reply is not BLOCKED:
        encode(reply, resp == 3)
    state.blocking.remove(c)


# -- the C lane: a read's TWRITEs and TREADs run in C, as one by one -----------


def _pipeline(*commands: tuple[Any, ...]) -> list[list[bytes]]:
    return [[a if isinstance(a, bytes) else str(a).encode() for a in cmd] for cmd in commands]


def _observable(state: ServerState, client: ClientState) -> tuple[Any, ...]:
    # Not used_bytes: one append of many grows the storage's tables in other
    # steps than many appends of one, so the memory really differs a little.
    log = state.persistence.log  # type: ignore[attr-defined]
    stats = state.stats
    return (
        list(log),
        [wire(run(state, client, "TREAD", key, 0, 1000)) for key in (b"s", b"t")],
        stats.total_messages_written,
        stats.total_commands_processed,
        stats.commands.get("twrite", [0])[0],
        state.dirty,
    )


def _decoded(reply: Any) -> Any:
    """A reply value as dispatch_read() returns it (through the wire)."""

    reader = hiredis.Reader(replyError=Error)
    reader.feed(wire(reply))
    return reader.gets()


@pytest.mark.parametrize(
    "commands",
    [
        # plain writes on an existing stream, then a different key and a read
        [("TWRITE", "s", f"m{i}") for i in range(40)]
        + [("TWRITE", "t", "x"), ("TREAD", "s", 0, 5)],
        # writes broken by other commands and by other keys, mixed spellings
        [("twrite", "s", "a"), ("TWRITE", "s", "b"), ("TWRITE", "t", "c"), ("twrite", "t", "d")]
        + [("SET", "k", "v"), ("TWRITE", "s", "e"), ("TWRITE", "s", "f")],
        # a key that does not exist yet, and a string
        [
            ("TWRITE", "new", "a"),
            ("TWRITE", "new", "b"),
            ("TWRITE", "k", "a"),
            ("TWRITE", "k", "b"),
        ],
        # the ENTRIES form, with BACKLOG, and reads WITHINFO
        [
            ("TWRITE", "s", "ENTRIES", "a", "b"),
            ("TWRITE", "s", "backlog", 2, "entries", "c"),
            ("TREAD", "s", -5, 10, "WITHINFO"),
        ],
    ],
)
def test_the_lane_is_indistinguishable_from_one_by_one(
    commands: list[tuple[Any, ...]],
) -> None:
    outcomes = []
    for batched in (False, True):
        state = ServerState(Config())
        state.persistence = RecordingPersistence()
        c = Client()
        run(state, c, "TWRITE", "s", "first")
        run(state, c, "TWRITE", "t", "first")
        run(state, c, "SET", "k", "v")
        pipeline = _pipeline(*commands)
        if batched:
            replies = dispatch_read(state, c, pipeline)
        else:
            replies = [_decoded(execute(state, c, argv)) for argv in pipeline]
        outcomes.append((replies, _observable(state, c)))
    assert outcomes[0] == outcomes[1]


def test_the_lane_runs_plain_twrites_in_c(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "s", "first")
    pipeline = _pipeline(*[("TWRITE", "s", f"m{i}") for i in range(5)])
    ticks = MUTATIONS.ticks
    assert dispatch_read(state, c, pipeline) == [1, 2, 3, 4, 5]
    # No handler ran: the Python handler's reservation was not asked for.
    assert state.persistence.reserved == [(b"s", 1)]  # type: ignore[attr-defined]
    assert MUTATIONS.ticks > ticks
    assert state.persistence.log[-1] == [b"TWRITE", b"s", b"m4"]  # type: ignore[attr-defined]


def test_the_lane_steps_aside_when_one_by_one_could_differ(state: ServerState) -> None:
    c = Client()
    run(state, c, "TWRITE", "s", "first")
    pipeline = _pipeline(("TWRITE", "s", "a"), ("TWRITE", "s", "b"))

    reader = Client()
    assert run(state, reader, "TREAD", "s", 1, 1, "BLOCK", 0) is BLOCKED
    # The reader must be woken after the first write, with one message.
    assert dispatch_read(state, c, pipeline) == [1, 2]
    assert [wire(r) for r in reader.received] == [b"*1\r\n$1\r\na\r\n"]

    run(state, c, "MULTI")
    assert dispatch_read(state, c, pipeline) == [b"QUEUED", b"QUEUED"]
    run(state, c, "DISCARD")

    state.persistence.refuse = errors.MISCONF  # type: ignore[attr-defined]
    assert [r.message for r in dispatch_read(state, c, pipeline)] == [errors.MISCONF] * 2
    state.persistence.refuse = None  # type: ignore[attr-defined]

    # A TTL: the handler runs each (it asks for the offsets' reservation).
    run(state, c, "EXPIRE", "s", 100)
    reserved = state.persistence.reserved  # type: ignore[attr-defined]
    asked = len(reserved)
    assert dispatch_read(state, c, pipeline) == [3, 4]
    assert len(reserved) == asked + 2
    run(state, c, "PERSIST", "s")
    assert dispatch_read(state, c, pipeline) == [5, 6]
    assert len(reserved) == asked + 2  # the lane ran them

    state.config.set("maxmemory", "1")
    replies = dispatch_read(state, c, pipeline)
    assert [r.message for r in replies] == [errors.OOM] * 2
    state.config.set("maxmemory", "0")
    assert dispatch_read(state, c, pipeline) == [7, 8]


def test_exec_past_the_output_limit_runs_its_writes_and_builds_no_more_replies(
    state: ServerState,
) -> None:
    """EXEC holds its replies to the client's output limit as they are
    built: past it the client is closed (output_overflow), the commands
    that change data still run, and no more reads are built (INFO's
    total_messages_read counts the messages reads put in replies)."""
    c = Client()
    overflows: list[int] = []
    # A 2.5 MB hard limit, less what EXEC built so far, as the connection says.
    c.output_room = lambda: 2_500_000 - c.output_building  # type: ignore[method-assign]
    c.output_overflow = overflows.append  # type: ignore[method-assign]
    run(state, c, "TWRITE", "big", "ENTRIES", *[b"m" * 1000] * 1000)
    read_before = state.stats.total_messages_read
    run(state, c, "MULTI")
    for _ in range(1000):
        run(state, c, "TREAD", "big", 0, 1000)
    run(state, c, "TWRITE", "after", "x")
    run(state, c, "TREAD", "big", 0, 7, "GROUP", "g")
    run(state, c, "EXEC")
    # The third 1 MB reply would take it past 2.5 MB: it is not built, the
    # client is closed, the reads after it do not run; the group read still
    # moves its group, without a reply.
    assert state.stats.total_messages_read - read_before == 3 * 1000 + 7
    assert len(overflows) == 1 and 1_000_000 < overflows[0] < 1_100_000
    assert c.output_dropped
    assert state.keyspace.get(b"g") == b"7"
    assert state.keyspace.get(b"after").next_offset == 1
    assert [b"MULTI"] in state.persistence.log and [b"EXEC"] in state.persistence.log
