"""Retention (stream-retention-ms / -bytes) and maxmemory-policy
streams-oldest, in process: the cron step is called with the test's own
clock (Retention.step(now_ms)), which no client can reach, and appends get
explicit times. docs/PROTOCOL.md section 6."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import persistence_in_process

from rcp11 import retention
from rcp11.commands import execute, serve_ready
from rcp11.config import Config
from rcp11.resp import NULL_ARRAY
from rcp11.retention import Retention
from rcp11.state import ClientState, NullPersistence, ServerState
from rcp11.storage import Stream

T0 = 1_700_000_000_000


class Recorder(NullPersistence):
    """Persistence that keeps what was propagated."""

    aof_state = "on"

    def __init__(self) -> None:
        self.logged: list[list[bytes]] = []
        self.flushes = 0

    def propagate(self, argv: list[bytes]) -> None:
        self.logged.append(list(argv))

    def flush(self) -> None:
        self.flushes += 1


def make_state(**directives: Any) -> tuple[ServerState, Recorder, Retention]:
    config = Config()
    for name, value in directives.items():
        config.set(name.replace("_", "-"), str(value))
    state = ServerState(config)
    recorder = Recorder()
    state.persistence = recorder
    state.retention = Retention(state, lambda: serve_ready(state))
    return state, recorder, state.retention


def add_stream(
    state: ServerState, key: bytes, times: list[int], max_entries: int = 10, size: int = 1
) -> Stream:
    """A stream whose message i was appended at times[i] (payload `size` bytes)."""
    stream = Stream(max_entries=max_entries)
    for i, ms in enumerate(times):
        stream.append([b"%0*d" % (size, i % 10)], now_ms=ms)
    state.keyspace.set(key, stream)
    return stream


def run(state: ServerState, *argv: bytes) -> Any:
    return execute(state, ClientState(authenticated=True), list(argv))


def readable(stream: Stream) -> list[bytes | None]:
    return stream.read(0, stream.next_offset)


# -- by age ------------------------------------------------------------------


def test_age_evicts_exactly_the_expired_messages() -> None:
    state, recorder, ret = make_state(stream_retention_ms=1000)
    # Nodes of 10: node i holds messages appended at T0 + 100*i .. + 100*i + 9.
    times = [T0 + 100 * (i // 10) + i % 10 for i in range(45)]
    s = add_stream(state, b"s", times)
    # At T0 + 1205 the cutoff is T0 + 205: nodes 0 and 1 are older, and in
    # node 2 (T0+200..209) the messages of T0+200..204: offsets 0..24 go.
    assert ret.step(now_ms=T0 + 1205) is False
    assert s.first_offset == 25 and s.num_nodes == 3
    assert readable(s)[:26] == [None] * 25 + [b"5"]
    assert recorder.logged == [[b"TEVICT", b"s", b"24"]]
    info = state.stats
    assert (info.retention_evicted_messages, info.retention_evicted_bytes) == (25, 25)
    assert info.retention_runs == 1 and info.total_messages_evicted == 25
    # Nothing more expired: nothing logged, no run counted.
    ret.step(now_ms=T0 + 1205)
    assert len(recorder.logged) == 1 and info.retention_runs == 1
    # One more millisecond: one more message, from inside the node.
    ret.step(now_ms=T0 + 1206)
    assert s.first_offset == 26 and recorder.logged[-1] == [b"TEVICT", b"s", b"25"]
    assert info.retention_runs == 2


def test_age_evicts_the_active_nodes_expired_messages_and_it_once_all_expired() -> None:
    state, recorder, ret = make_state(stream_retention_ms=1000)
    # One active node: 5 old messages and one new one.
    s = add_stream(state, b"s", [T0] * 5 + [T0 + 5000])
    ret.step(now_ms=T0 + 5500)
    assert s.first_offset == 5 and s.length == 1 and s.num_nodes == 1
    assert recorder.logged == [[b"TEVICT", b"s", b"4"]]
    # Once its newest message expired too, the active node goes: the
    # stream is empty and keeps its next offset (as after TEVICT).
    ret.step(now_ms=T0 + 6001)
    assert (s.length, s.first_offset, s.next_offset) == (0, 6, 6)
    assert recorder.logged[-1] == [b"TEVICT", b"s", b"5"]
    assert run(state, b"TWRITE", b"s", b"next") == 6


def test_retention_off_by_default_evicts_nothing() -> None:
    state, recorder, ret = make_state()
    s = add_stream(state, b"s", [T0] * 50)
    ret.step(now_ms=T0 + 10**9)
    assert s.length == 50 and recorder.logged == []


# -- by size -----------------------------------------------------------------


def test_bytes_keeps_at_most_the_limit_plus_the_active_node() -> None:
    state, recorder, ret = make_state(stream_retention_bytes=250)
    s = add_stream(state, b"s", [T0] * 95, size=10)  # 10 nodes of 100 bytes, last 50
    ret.step(now_ms=T0)
    # Whole oldest nodes go while the payload is over 250: 950 -> 250.
    assert s.payload_bytes == 250 and s.first_offset == 70
    assert recorder.logged == [[b"TEVICT", b"s", b"69"]]
    # Never the active node, even when it alone is over the limit.
    state2, recorder2, ret2 = make_state(stream_retention_bytes=5)
    s2 = add_stream(state2, b"t", [T0] * 8, size=10)
    ret2.step(now_ms=T0)
    assert s2.length == 8 and recorder2.logged == []


def test_config_set_turns_retention_on_for_existing_streams() -> None:
    state, recorder, ret = make_state()
    s = add_stream(state, b"s", [T0] * 30)
    ret.step(now_ms=T0 + 10**6)
    assert s.length == 30
    state.config.set("stream-retention-bytes", "10")
    ret.step(now_ms=T0 + 10**6)
    assert s.first_offset == 20 and s.length == 10


# -- bounded steps -----------------------------------------------------------


def test_a_step_frees_at_most_its_node_budget_and_the_next_resumes(monkeypatch) -> None:
    monkeypatch.setattr(retention, "STEP_NODES", 7)
    monkeypatch.setattr(retention, "NODES_PER_CALL", 3)
    state, recorder, ret = make_state(stream_retention_ms=10)
    s = add_stream(state, b"s", [T0] * 200)  # 20 nodes, all expired
    cuts = []
    steps = 0
    while True:
        nodes_before = s.num_nodes
        more = ret.step(now_ms=T0 + 100)
        steps += 1
        assert nodes_before - s.num_nodes <= 7
        cuts.append(s.first_offset)
        if not more:
            break
    assert steps == 3 and s.length == 0 and s.next_offset == 200
    # Each step logged the cut it reached, in order, never going back.
    logged = [int(argv[2]) for argv in recorder.logged]
    assert logged == sorted(logged) and logged[-1] == 199
    assert state.stats.retention_runs == 3


def test_a_pass_visits_every_stream_once_before_starting_over(monkeypatch) -> None:
    monkeypatch.setattr(retention, "STEP_NODES", 4)
    state, recorder, ret = make_state(stream_retention_ms=10)
    for i in range(10):
        add_stream(state, b"s%d" % i, [T0] * 10 + [T0 + 10**6])  # one expired node each
        run(state, b"SET", b"str%d" % i, b"a string is skipped")
    evicted_keys: list[bytes] = []
    while ret.step(now_ms=T0 + 100):
        pass
    evicted_keys = [argv[1] for argv in recorder.logged if argv[0] == b"TEVICT"]
    assert sorted(evicted_keys) == [b"s%d" % i for i in range(10)]  # each once
    assert run(state, b"GET", b"str3") == b"a string is skipped"


def test_a_large_expiry_runs_as_short_steps_between_event_loop_callbacks(monkeypatch) -> None:
    import asyncio

    monkeypatch.setattr(retention, "STEP_NODES", 5)
    state, recorder, ret = make_state(stream_retention_ms=1)
    s = add_stream(state, b"s", [T0] * 300)  # 30 expired nodes
    loop = asyncio.new_event_loop()
    try:
        ticks: list[int] = []

        def other_client() -> None:
            ticks.append(s.num_nodes)
            if s.num_nodes:
                loop.call_soon(other_client)
            else:
                loop.stop()

        ret.cron(loop)  # the first step runs now, the rest as continuations
        assert s.num_nodes == 25
        loop.call_soon(other_client)
        loop.run_forever()
    finally:
        ret.cancel()
        loop.close()
    # The other callback ran between the continuations: it saw the node
    # count go down five nodes at a time, never all at once.
    assert ticks[0] == 20 and ticks[-1] == 0 and len(ticks) >= 4
    assert all(a - b <= 5 for a, b in zip(ticks, ticks[1:], strict=False))


# -- readers -----------------------------------------------------------------


def test_readers_and_groups_see_retention_as_they_see_tevict() -> None:
    state, recorder, ret = make_state(stream_retention_ms=1000)
    times = [T0 + 100 * (i // 10) for i in range(35)]
    add_stream(state, b"a", times)
    add_stream(state, b"b", times)
    ret.step(now_ms=T0 + 1150)  # evicts nodes 0 and 1 of both streams
    assert sorted(recorder.logged) == [[b"TEVICT", b"a", b"19"], [b"TEVICT", b"b", b"19"]]
    # The same cut by hand on a third copy.
    add_stream(state, b"c", times)
    assert run(state, b"TEVICT", b"c", b"19") == 20
    with_info = [run(state, b"TREAD", key, b"0", b"25", b"WITHINFO").data for key in (b"a", b"c")]
    assert with_info[0] == with_info[1]
    assert with_info[0].startswith(b"*26\r\n*4\r\n:20\r\n:34\r\n:0\r\n:25\r\n$-1\r\n")
    # A new group starts at the oldest readable message; one that was
    # behind the cut reads nulls up to it.
    group_a = run(state, b"TREAD", b"a", b"0", b"25", b"GROUP", b"ga").data
    group_c = run(state, b"TREAD", b"c", b"0", b"25", b"GROUP", b"gc").data
    assert group_a == group_c and group_a.startswith(b"*15\r\n$1\r\n0\r\n")
    run(state, b"SET", b"ga", b"5")
    run(state, b"SET", b"gc", b"5")
    group_a = run(state, b"TREAD", b"a", b"0", b"25", b"GROUP", b"ga").data
    group_c = run(state, b"TREAD", b"c", b"0", b"25", b"GROUP", b"gc").data
    assert group_a == group_c and group_a.count(b"$-1\r\n") == 15
    assert run(state, b"GET", b"ga") == run(state, b"GET", b"gc")


def test_a_transaction_watching_the_stream_fails_after_retention_evicted_from_it() -> None:
    state, _, ret = make_state(stream_retention_ms=1000)
    add_stream(state, b"s", [T0] * 10 + [T0 + 5000])
    client = ClientState(authenticated=True)
    execute(state, client, [b"WATCH", b"s"])
    execute(state, client, [b"MULTI"])
    execute(state, client, [b"TWRITE", b"s", b"x"])
    ret.step(now_ms=T0 + 2000)
    assert execute(state, client, [b"EXEC"]) is NULL_ARRAY


# -- maxmemory-policy streams-oldest -----------------------------------------


def fill_for_memory(state: ServerState) -> tuple[Stream, Stream]:
    # Interleaved times: a's nodes are older than b's node for node.
    a = add_stream(state, b"a", [T0 + 10 * (i // 10) for i in range(60)], size=1000)
    b = add_stream(state, b"b", [T0 + 5 + 10 * (i // 10) for i in range(60)], size=1000)
    return a, b


def test_streams_oldest_evicts_the_oldest_nodes_across_streams_instead_of_oom() -> None:
    state, recorder, _ = make_state()
    a, b = fill_for_memory(state)
    used = state.used_memory()
    state.config.set("maxmemory", str(used - 25_000))  # about 2.5 nodes too much
    assert run(state, b"TWRITE", b"a", b"x") == errors_oom()  # noeviction: refused
    assert a.length == 60 and b.length == 60
    state.config.set("maxmemory-policy", "streams-oldest")
    assert run(state, b"TWRITE", b"c", b"x") == 0
    # Oldest first by append time: a's node 0, b's node 0, a's node 1.
    assert (a.first_offset, b.first_offset) == (20, 10)
    assert state.used_memory() <= int(state.config.get("maxmemory")) + 200
    assert sorted(recorder.logged[:2]) == [[b"TEVICT", b"a", b"19"], [b"TEVICT", b"b", b"9"]]
    assert state.stats.retention_evicted_messages == 30
    assert state.stats.retention_evicted_bytes == 30_000


def errors_oom() -> Any:
    from rcp11.errors import OOM
    from rcp11.resp import Error

    return Error(OOM)


def test_streams_oldest_never_evicts_strings_and_refuses_when_nothing_is_left() -> None:
    state, recorder, _ = make_state(maxmemory_policy="streams-oldest")
    a = add_stream(state, b"a", [T0] * 20, size=100)
    run(state, b"SET", b"big", b"x" * 50_000)
    state.config.set("maxmemory", "40000")
    reply = run(state, b"TWRITE", b"a", b"more")
    assert reply == errors_oom()
    # Every node of the stream went (the active one too), the string stayed.
    assert a.length == 0 and a.next_offset == 20
    assert run(state, b"GET", b"big") == b"x" * 50_000
    assert recorder.logged[-1] == [b"TEVICT", b"a", b"19"]


def test_the_cron_finishes_what_a_write_left(monkeypatch) -> None:
    monkeypatch.setattr(retention, "MEMORY_NODES_PER_WRITE", 1)
    state, recorder, ret = make_state(maxmemory_policy="streams-oldest")
    a, _ = fill_for_memory(state)
    state.config.set("maxmemory", str(state.used_memory() - 35_000))
    # One node per write: the write goes ahead while eviction is under way.
    assert run(state, b"TWRITE", b"c", b"x") == 0
    assert a.first_offset == 10
    while ret.step(now_ms=T0):
        pass
    assert state.used_memory() <= int(state.config.get("maxmemory"))


# -- the AOF -----------------------------------------------------------------


def test_replaying_the_aof_gives_the_same_streams_after_retention(tmp_path: Path) -> None:
    def open_state() -> tuple[ServerState, Any, Retention]:
        state, persistence = persistence_in_process(
            tmp_path, appendonly="yes", appendfsync="always", stream_node_max_entries="10"
        )
        persistence.load()
        state.retention = Retention(state, lambda: serve_ready(state))
        return state, persistence, state.retention

    state, persistence, ret = open_state()
    client = ClientState(authenticated=True)
    for i in range(95):
        execute(state, client, [b"TWRITE", b"s", b"m%d" % i])
        execute(state, client, [b"TWRITE", b"t", b"n%d" % i])
    execute(state, client, [b"TEVICT", b"t", b"3"])
    state.config.set("stream-retention-bytes", "100")
    ret.step()
    assert persistence.aof_state == "on"
    for phase in ("by size", "by age"):
        before = {key: readable(state.keyspace.get(key)) for key in (b"s", b"t")}
        if phase == "by size":
            assert before[b"s"][:60] == [None] * 60 and before[b"s"][-1] == b"m94"
        else:
            assert not any(before[b"s"]) and not any(before[b"t"])
        # A crash: no shutdown, a second server loads the same files.
        state, persistence, ret = open_state()
        for key, messages in before.items():
            stream = state.keyspace.get(key)
            assert stream.read(0, len(messages)) == messages, phase
            assert stream.next_offset >= 95
        state.config.set("stream-retention-ms", "1")
        ret.step(now_ms=10**15)  # every message expired
    assert run(state, b"TWRITE", b"s", b"after") >= 95


def test_streams_oldest_evicts_the_oldest_node_of_many_streams_while_they_change() -> None:
    """Each eviction takes the node with the oldest append time of all
    streams (ties: the smaller key), as a look at every stream would find,
    while writes, TEVICT, DEL, TCONCAT, strings over streams and FLUSHALL
    change which stream holds it between evictions."""
    import random

    rng = random.Random(11)
    state, _, _ = make_state(maxmemory_policy="streams-oldest")
    for i in range(300):
        times = sorted(T0 + rng.randrange(0, 5000) for _ in range(rng.randrange(1, 40)))
        add_stream(state, b"s%d" % i, times)

    def expected_oldest() -> bytes | None:
        candidates = [
            (value.oldest_append_ms, key)
            for key, value in state.keyspace.data.items()
            if not isinstance(value, bytes) and value.oldest_append_ms is not None
        ]
        return min(candidates)[1] if candidates else None

    def firsts() -> dict[bytes, int]:
        data = state.keyspace.data
        return {k: v.first_offset for k, v in data.items() if not isinstance(v, bytes)}

    evictions = 0
    for step in range(1500):
        key = b"s%d" % rng.randrange(320)
        action = rng.randrange(12)
        if action == 0:
            run(state, b"TWRITE", key, b"new")
        elif action == 1:
            run(state, b"TEVICT", key, b"%d" % rng.randrange(20))
        elif action == 2:
            run(state, b"DEL", key)
        elif action == 3:
            run(state, b"TCONCAT", key, b"s%d" % rng.randrange(320))
        elif action == 4:
            run(state, b"SET", key, b"a string")
        elif action == 5 and step % 500 == 499:
            run(state, b"FLUSHALL")
            for i in range(50):
                add_stream(state, b"s%d" % i, [T0 + rng.randrange(0, 5000)] * 12)
        want = expected_oldest()
        before = firsts()
        fits, left = retention.evict_oldest(state, 0, 1)  # one node, whatever
        assert not fits
        after = firsts()
        changed = [k for k in before if after.get(k) != before[k]]
        if want is None:
            assert changed == [] and not left
        else:
            assert changed == [want], step
            evictions += 1
    assert evictions > 500
