"""The C lane (src/lane.c, rcp11/commands/lane.py) against the general path.

Random pipelines (TWRITE and TREAD in every form, lease reads of an
acknowledged group, mixed with other commands, bad arity, bad numbers,
hostile bytes), split at random read
boundaries, run once the way the server runs a read (the lane first, then
the parser and run_pipeline()) and once through the general path alone.
Everything a user can see must be the same: the replies, the AOF bytes,
the streams and strings, the INFO stats and commandstats (calls, rejected,
failed; not the microseconds), what another client sees (a blocked
reader's reply, a WATCH's EXEC).
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import in_thread, persistence_in_process, serve_reads, wait_blocked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.proto.front import SocketFront
from rcp11 import errors
from rcp11.commands import execute, transactions
from rcp11.persistence.aof_format import ANNOTATION, iter_aof_commands, parse_append_time
from rcp11.resp import Error, Parts, encode, encode_command
from rcp11.state import ClientState, ServerState
from rcp11.storage.ackgroups import AckGroup

KEYS = [b"s", b"t", b"k", b"new", b"g"]
WORDS = [b"x", b"", b"hello", b"ENTRIES", b"BACKLOG", b"a\r\nb", b"\x00\xff", b"*1\r\n$4\r\nPING"]
NUMBERS = [b"0", b"1", b"2", b"5", b"-1", b"-3", b"100", b"01", b"+1", b"abc", b"-0"]
NUMBERS += [b"9223372036854775807", b"9223372036854775808", b"-9223372036854775808"]
NUMBERS += [b"-9223372036854775809", b" 1"]

keys = st.sampled_from(KEYS)
words = st.sampled_from(WORDS) | st.binary(max_size=12)
numbers = st.sampled_from(NUMBERS)
twrite_name = st.sampled_from([b"TWRITE", b"twrite", b"TWrite"])
tread_name = st.sampled_from([b"TREAD", b"tread"])


@st.composite
def twrite(draw: Any) -> list[bytes]:
    name, key = draw(twrite_name), draw(keys)
    form = draw(st.integers(0, 5))
    if form <= 2:
        return [name, key, draw(words)]
    options: list[bytes] = []
    if draw(st.booleans()):
        options += [draw(st.sampled_from([b"BACKLOG", b"backlog"])), draw(numbers)]
        if draw(st.integers(0, 6)) == 0:
            options += [b"BACKLOG", draw(numbers)]  # twice: an error
    if draw(st.integers(0, 8)):
        options.append(draw(st.sampled_from([b"ENTRIES", b"entries"])))
    entries = draw(st.lists(words, max_size=6))
    return [name, key, *options, *entries]


block_word = st.sampled_from([b"BLOCK", b"block", b"Block"])


@st.composite
def tread(draw: Any) -> list[bytes]:
    argv = [draw(tread_name), draw(keys), draw(numbers), draw(numbers)]
    for _ in range(draw(st.integers(0, 3))):
        argv += draw(
            st.sampled_from(
                [
                    [b"WITHINFO"],
                    [b"withinfo"],
                    [b"NONULLS"],
                    [b"WITHTIMES"],
                    [b"PACKED"],  # the general path's: the lane stops before it
                    [b"GROUP", b"grp"],
                    [b"bogus"],
                ]
            )
            | st.tuples(block_word, numbers | words).map(list)  # hostile timeouts
            | st.just([b"BLOCK"])  # without its value (when it comes last)
            | st.just([b"GROUPNEW", b"grp"])
        )
    return argv


other = st.sampled_from(
    [
        [b"SET", b"k", b"v"],
        [b"GET", b"k"],
        [b"DEL", b"t"],
        [b"DEL", b"new"],
        [b"EXPIRE", b"s", b"100"],
        [b"PERSIST", b"s"],
        [b"MULTI"],
        [b"EXEC"],
        [b"DISCARD"],
        [b"PING"],
        [b"TEVICT", b"s", b"2"],
        [b"TWRITE", b"s"],
        [b"TREAD", b"s", b"0"],
        [b"NOSUCHCOMMAND", b"s"],
        [b"INCR", b"k"],
        [b"SET", b"g", b"1"],
        [b"CLIENT", b"SETNAME", b"x"],
    ]
)


def _canonical(argv: list[bytes]) -> bytes:
    return encode_command(argv)


@st.composite
def good(draw: Any) -> list[bytes]:
    """A request the lane can run, if nothing else stops it."""
    key = draw(st.sampled_from([b"s", b"t"]))
    form = draw(st.integers(0, 3))
    if form == 0:
        return [draw(twrite_name), key, draw(words)]
    if form == 1:
        backlog = [b"BACKLOG", draw(st.sampled_from([b"0", b"2", b"50"]))]
        entries = draw(st.lists(words, min_size=1, max_size=5))
        return [draw(twrite_name), key, *draw(st.sampled_from([[], backlog])), b"ENTRIES", *entries]
    offset = draw(st.sampled_from([b"0", b"1", b"3", b"-1", b"-2", b"100", b"-100"]))
    count = draw(st.sampled_from([b"0", b"1", b"2", b"10"]))
    if key == b"s" and draw(st.integers(0, 3)) == 0:
        return draw(lease_read(offset, count))
    options = draw(
        st.sampled_from(
            [
                [],
                [b"WITHINFO"],
                [b"NONULLS"],
                [b"nonulls", b"WITHINFO"],
                [b"WITHTIMES"],
                [b"withtimes", b"WITHINFO"],
                [b"WITHTIMES", b"NONULLS"],
                [b"WITHTIMES"] * 2,
            ]
        )
    )
    if draw(st.booleans()):
        # BLOCK: the lane runs it when there is something at offset (most
        # of these: s starts with four messages, t with one, a gap, one
        # more), and hands it over when it would wait (100, or past t's
        # end; with NONULLS also inside a gap at the end): it then blocks
        # until a write, a timeout or CLIENT UNBLOCK (other_client).
        timeout = draw(st.sampled_from([b"0", b"1", b"100"]) | numbers | words)
        block = [draw(block_word), timeout]
        if draw(st.integers(0, 5)) == 0:  # an option twice, or BLOCK without its value
            block += draw(
                st.sampled_from([[b"BLOCK", b"1"], [b"WITHINFO", b"withinfo"], [b"BLOCK"]])
            )
        options = draw(st.sampled_from([[*options, *block], [*block, *options]]))
    return [draw(tread_name), key, offset, count, *options]


@st.composite
def lease_read(draw: Any, offset: bytes, count: bytes) -> list[bytes]:
    """A lease read of the acknowledged group "ag" of s (or, rarely, of a
    plain or missing group): the lane runs it when it delivers new
    messages. Leases are long: none runs out during a test, whose two runs
    take different times."""
    group = draw(st.sampled_from([b"ag", b"ag", b"ag", b"grp", b"new"]))
    argv = [b"TREAD", b"s", offset, count, b"GROUP", group, b"LEASE", b"600000"]
    if draw(st.booleans()):
        argv += [b"CONSUMER", draw(st.sampled_from([b"w1", b"w2", b""]))]
    if draw(st.booleans()):
        argv += [
            b"ACK",
            draw(st.sampled_from([b"0", b"2", b"5"])),
            draw(st.sampled_from([b"1", b"3"])),
        ]
    if draw(st.integers(0, 3)) == 0:
        argv += draw(st.sampled_from([[b"WITHINFO"], [b"BLOCK", b"0"], [b"LEASE", b"1"]]))
    return argv


@st.composite
def block_read(draw: Any) -> list[bytes]:
    """A valid BLOCK read near the end of s (four messages at the start) or
    t (0, a gap, 3): with data (the lane runs it) or at / past the tail (it waits
    until a write, CLIENT UNBLOCK or, unless BLOCK 0, time passing)."""
    key = draw(st.sampled_from([b"s", b"t"]))
    offset = draw(st.sampled_from([b"0", b"1", b"3", b"4", b"5", b"6", b"-1", b"1000"]))
    count = draw(st.sampled_from([b"0", b"1", b"3"]))
    block = [draw(block_word), draw(st.sampled_from([b"0", b"1", b"100"]))]
    options = draw(
        st.sampled_from(
            [block, [*block, b"WITHINFO"], [b"withinfo", *block], [b"WITHTIMES", *block]]
        )
    )
    if draw(st.booleans()):
        options = [*options, b"NONULLS"]
    return [draw(tread_name), key, offset, count, *options]


@st.composite
def request(draw: Any) -> bytes:
    kind = draw(st.integers(0, 19))
    if kind <= 9:
        return _canonical(draw(good()))
    if kind <= 11:
        return _canonical(draw(twrite()))
    if kind <= 13:
        return _canonical(draw(tread()))
    if kind <= 15:
        return _canonical(draw(block_read()))
    if kind <= 18:
        return _canonical(draw(other))
    # Hostile or unusual framing: the parser must judge it, not the lane.
    return draw(
        st.sampled_from(
            [
                b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$02\r\nab\r\n",  # a leading zero
                b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$2\r\nabXY",  # no CRLF after the bulk
                b"*0\r\n",
                b"PING\r\n",
                b"TWRITE s inline\r\n",
                b"*1\r\n:5\r\n",
                b"*-1\r\n",
                b"*2\r\n$4\r\nECHO\r\n$-1\r\n",
                b"*3\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$999999999999\r\n",
                b"*03\r\n$6\r\nTWRITE\r\n$1\r\ns\r\n$1\r\nz\r\n",
                b"\r\n",
            ]
        )
        | st.binary(max_size=20)
    )


# Between reads, time may pass: every BLOCK timeout (not BLOCK 0) expires.
TIME_PASSES = [b"<time passes>"]

# Between reads, another client may act on the same keys.
other_client = st.sampled_from(
    [
        None,
        [b"TREAD", b"s", b"-1", b"1", b"BLOCK", b"0"],  # reads what s had: no wait
        [b"TREAD", b"s", b"1000000", b"1", b"BLOCK", b"0"],  # waits for s
        [b"TREAD", b"t", b"0", b"2", b"GROUP", b"grp", b"BLOCK", b"0"],
        [b"WATCH", b"s"],
        [b"WATCH", b"t"],
        [b"MULTI"],
        [b"EXEC"],
        [b"TWRITE", b"s", b"from-b"],
        [b"TWRITE", b"t", b"from-b"],
        [b"CLIENT", b"UNBLOCK", b"1000"],  # the client under test, if it waits
        [b"CLIENT", b"UNBLOCK", b"1000", b"ERROR"],
        TIME_PASSES,
    ]
)


@st.composite
def session(draw: Any) -> tuple[list[bytes], list[Any]]:
    requests = draw(st.lists(request(), min_size=1, max_size=25))
    data = b"".join(requests)
    # Reads end at request boundaries (the lane runs on the next read) or
    # anywhere (the parser buffers the partial request).
    ends = [sum(map(len, requests[: i + 1])) for i in range(len(requests))]
    cut = st.sampled_from(ends) | st.integers(0, len(data))
    cuts = sorted(draw(st.lists(cut, max_size=8)))
    bounds = zip([0, *cuts], [*cuts, len(data)], strict=True)
    chunks = [data[a:b] for a, b in bounds if b > a]
    return chunks, [draw(other_client) for _ in chunks]


class Peer(ClientState):
    """Another client: its late replies (a blocked read served) are kept."""

    def __init__(self) -> None:
        super().__init__(authenticated=True)
        self.received: list[Any] = []
        self.send = self.received.append  # type: ignore[method-assign]
        self.on_unblocked = lambda: None  # type: ignore[method-assign]


def _setup(directory: Path, aof: bool, append_ms: int | None = None) -> tuple[ServerState, Any]:
    state, persistence = persistence_in_process(
        directory, appendonly="yes" if aof else "no", stream_node_max_entries="3"
    )
    persistence.load()
    state.append_ms = append_ms  # None: the wall clock
    setup = ClientState(authenticated=True)
    for argv in (
        [b"TWRITE", b"s", b"ENTRIES", b"a", b"b", b"c", b"d"],
        [b"TWRITE", b"t", b"one"],
        [b"SET", b"k", b"v"],
        [b"TREAD", b"s", b"0", b"0", b"GROUP", b"ag", b"LEASE", b"1"],  # an acknowledged group
    ):
        execute(state, setup, argv)
    # t: a gap after its message (offsets 1 and 2), as a crash leaves one,
    # then one more: what NONULLS steps over.
    state.keyspace.get(b"t").raise_next_offset(3)
    execute(state, setup, [b"TWRITE", b"t", b"two"])
    return state, persistence


def _undated(data: bytes) -> bytes:
    """AOF bytes without their append-time annotations (the clock differs
    between runs; tests/test_persistence_times.py checks them), each of
    which must be one the AOF loader takes back (a lane run of lease reads
    alone once came out as #RCP11-MS:-1, which it refuses)."""
    kept = []
    for argv, start, end in iter_aof_commands(io.BytesIO(data), 0):
        if argv[0] is ANNOTATION:
            parse_append_time(argv[1])  # ValueError: the loader would refuse to start
        else:
            kept.append(data[start:end])
    return b"".join(kept)


def _aof_requests(data: bytes) -> list[Any]:
    """The AOF's requests, with EXPIRE's absolute deadline (the clock
    differs between the two runs) left out; the bytes must be canonical."""
    import hiredis

    data = _undated(data)
    reader = hiredis.Reader()
    reader.feed(data)
    requests = []
    while (argv := reader.gets()) is not False:
        assert encode_command(argv) in data
        if argv[0].upper() == b"PEXPIREAT":
            argv[2] = b"<deadline>"
        if argv[0] == b"RCP11.LEASE":
            argv[6] = b"<deadline>"  # the clock's, as above
        requests.append(argv)
    return requests


# A lease read's reply header: its sixth integer is the lease's deadline.
_LEASE_HEAD = re.compile(rb"(\*6\r\n(?::-?\d+\r\n){5}):\d+\r\n")


def _without_deadlines(reply: Any) -> Any:
    if isinstance(reply, bytes):
        return _LEASE_HEAD.sub(rb"\1:<deadline>\r\n", reply)
    if isinstance(reply, list):
        return [_without_deadlines(r) for r in reply]
    return reply


def _ranges(group: AckGroup) -> list[tuple[int, int, bytes, int]]:
    """A group's pending ranges (start, count, owner, deliveries), adjacent
    ones of one owner and delivery count merged: the group keeps two leases
    apart when their deadlines differ, and two reads fall in one
    millisecond or in two as the wall clock goes, differently in two runs."""
    merged: list[tuple[int, int, bytes, int]] = []
    for r in group.ranges():
        if merged:
            start, count, owner, deliveries = merged[-1]
            if start + count == r.start and (owner, deliveries) == (r.owner, r.deliveries):
                merged[-1] = (start, count + r.count, owner, deliveries)
                continue
        merged.append((r.start, r.count, r.owner, r.deliveries))
    return merged


def _observed(state: ServerState, persistence: Any) -> dict[str, Any]:
    stats = state.stats
    data: dict[bytes, Any] = {}
    for key, value in sorted(state.keyspace.data.items()):
        if isinstance(value, bytes):
            data[key] = value
        elif isinstance(value, AckGroup):
            data[key] = (value.next_offset, _ranges(value), value.totals())
        else:
            first, next_offset = value.first_offset, value.next_offset
            data[key] = (first, next_offset, value.read(first, next_offset - first))
    return {
        "data": data,
        "expires": sorted(state.keyspace.expires),
        "aof": _aof_requests(b"".join(persistence.aof.buf)),
        "dirty": state.dirty,
        "commands": stats.total_commands_processed,
        "written": stats.total_messages_written,
        "read": stats.total_messages_read,
        "evicted": stats.total_messages_evicted,
        "error_replies": stats.total_error_replies,
        "errorstats": dict(stats.errors),
        "commandstats": {name: (r[0], r[2], r[3]) for name, r in stats.commands.items()},
    }


# Append times in replies (TREAD WITHTIMES): the two runs write at different
# moments. test_withtimes_reads_are_run_by_the_lane compares them exactly.
_TIMES = re.compile(rb":1\d{12}(?!\d)")


def _untimed(reply: bytes | str) -> bytes:
    """reply (bytes, or a repr of one) without its append times."""
    return _TIMES.sub(b":<ms>", reply.encode() if isinstance(reply, str) else reply)


# maxmemory for a session: None (no limit), or the policy and how many
# bytes over the memory used after the setup the limit is (the session's
# writes pass it at some request, which both paths must refuse alike).
# noeviction only: streams-oldest evicts the stream whose oldest node is
# oldest, which the wall clock decides when both streams were written in
# the same millisecond or not (the lane's stop for it is tested below).
memory_limits = st.none() | st.tuples(st.just("noeviction"), st.sampled_from([0, 100, 1000, 5000]))


def _run(
    directory: Path,
    aof: bool,
    lane: bool,
    chunks: list[bytes],
    actions: list[Any],
    memory: tuple[str, int] | None = None,
) -> tuple[Any, ...]:
    # One append time for the whole session, in both runs: a time delta's
    # width (0 bytes within a millisecond, 1 past it) changes a node's
    # memory, which maxmemory's refusals compare.
    state, persistence = _setup(directory, aof, append_ms=1_764_000_000_000)
    if memory is not None:
        policy, slack = memory
        state.config.set("maxmemory-policy", policy)
        state.config.set("maxmemory", str(state.used_memory() + slack))
    client = Peer()  # its replies to blocked reads come late: kept too
    peer = Peer()
    client.id, peer.id = 1000, 1001  # HELLO and CLIENT ID show them
    replies = []
    peer_replies = []
    # lane=False: EXEC runs its queued commands on the general path too.
    exec_lane = transactions.lane_open
    if not lane:
        transactions.lane_open = lambda *args, **kw: False  # type: ignore[assignment]
    try:
        for chunk, action in zip(chunks, actions, strict=True):
            if action == TIME_PASSES:
                state.blocking.expire(float("inf"))
            elif action is not None and peer.blocked is None:
                peer_replies.append(execute(state, peer, list(action)))
            replies.append(
                _untimed(_without_deadlines(serve_reads(state, client, [chunk], lane=lane)))
            )
    finally:
        transactions.lane_open = exec_lane  # type: ignore[assignment]
    return (
        replies,
        [_untimed(_shown(r)) for r in client.received],
        client.blocked is None,
        [_untimed(_shown(r)) for r in peer_replies],
        [_untimed(_shown(r)) for r in peer.received],
        client.last_command,
        _observed(state, persistence),
    )


def _shown(reply: Any) -> Any:
    """A reply as a client gets it: EXEC's in bytes (the lane builds it in
    other pieces than the general path), lease deadlines left out."""
    reply = _without_deadlines(reply)
    if type(reply) is Parts:
        return _without_deadlines(encode(reply, False))
    return repr(reply)


@st.composite
def transaction(draw: Any) -> tuple[list[bytes], list[Any]]:
    """One read holding MULTI, commands the lane runs or stops at (and
    errors, which abort the EXEC), EXEC; another client may act before."""
    queued = draw(st.lists(good() | twrite() | tread() | other, max_size=40))
    queued = [argv for argv in queued if argv[0].upper() not in (b"MULTI", b"EXEC", b"DISCARD")]
    data = b"".join(map(_canonical, [[b"MULTI"], *queued, [b"EXEC"]]))
    return [data], [draw(other_client)]


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(session=transaction(), aof=st.booleans(), memory=memory_limits)
def test_exec_through_the_lane_and_the_general_path_agree(
    session: Any, aof: bool, memory: tuple[str, int] | None
) -> None:
    """EXEC runs its queued TWRITEs and TREADs through the lane (issue 23:
    100k of them stopped every client for a second): replies, AOF (inside
    MULTI ... EXEC, with the transaction's one append time), data and
    stats are the general path's."""
    _both_agree(session, aof, memory)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(session=session(), aof=st.booleans(), memory=memory_limits)
def test_the_lane_and_the_general_path_agree(
    session: Any, aof: bool, memory: tuple[str, int] | None
) -> None:
    _both_agree(session, aof, memory)


def test_a_request_half_assembled_while_blocked_keeps_the_start_of_the_next() -> None:
    """Found by the test above: a TWRITE whose array header the parser took
    while its client was blocked, then run by the lane with the next read,
    dropped the next request's first byte (its '*'): SET k v came out as
    seven inline commands."""
    blocking_read = encode_command([b"TREAD", b"s", b"4", b"0", b"BLOCK", b"1"])
    chunks = [
        blocking_read[:1],
        blocking_read[1:] + b"*3\r\n",
        b"$6\r\nTWRITE\r\n$1\r\ns\r\n$1\r\nx\r\n*",
        b"3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
    ]
    _both_agree((chunks, [None, None, None, TIME_PASSES]), False, None)


def _both_agree(session: Any, aof: bool, memory: tuple[str, int] | None, run: Any = None) -> None:
    """The session run with the lane and without it (run(directory, aof,
    lane, chunks, actions, memory), _run by default): every outcome equal."""
    run = run or _run
    chunks, actions = session
    outcomes = []
    for lane in (True, False):
        directory = Path(tempfile.mkdtemp(prefix="lane-"))
        try:
            outcomes.append(run(directory, aof, lane, chunks, actions, memory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    assert outcomes[0] == outcomes[1]


def _run_sockets(
    directory: Path,
    aof: bool,
    c_loop: bool,
    chunks: list[bytes],
    actions: list[Any],
    memory: tuple[str, int] | None = None,
) -> tuple[Any, ...]:
    """_run() through the server's front end over a socket: the C lane's
    loop (src/netloop.c) or asyncio's transport with the general path
    alone. Each chunk is one read; what the client receives after it (its
    replies, and late replies to a blocked read) is what is compared."""
    # One append time in both runs, as _run's (WITHTIMES shows it; the C
    # loop honours the pinned time as the general path does).
    state, persistence = _setup(directory, aof, append_ms=1_764_000_000_000)
    if memory is not None:
        policy, slack = memory
        state.config.set("maxmemory-policy", policy)
        state.config.set("maxmemory", str(state.used_memory() + slack))
    front = SocketFront(state, c_loop, ids=[1000])
    peer = Peer()
    peer.id = 1001
    received = []
    peer_replies = []
    try:
        for chunk, action in zip(chunks, actions, strict=True):
            if action == TIME_PASSES:
                state.blocking.expire(float("inf"))
            elif action is not None and peer.blocked is None:
                peer_replies.append(execute(state, peer, list(action)))
            if front.conn.closed:
                break  # a protocol error closed it
            try:
                received.append(_without_deadlines(front.send(chunk)))
            except OSError:
                break
        client = front.client
        client.refresh()  # what CLIENT LIST would show (the C loop keeps it)
        return (
            received,
            client.blocked is None,
            [_shown(r) for r in peer_replies],
            [_shown(r) for r in peer.received],
            client.last_command,
            _observed(state, persistence),
        )
    finally:
        front.close()


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(session=session(), aof=st.booleans(), memory=memory_limits)
def test_the_c_loop_and_the_general_path_agree(
    session: Any, aof: bool, memory: tuple[str, int] | None
) -> None:
    """The C lane's own event loop (src/netloop.c: the socket read in C,
    the lane, the hand-over of the rest to Python, the batch's counters and
    AOF folded back, replies written after the flush) against the general
    path alone, each behind a real socket, on the same random reads."""
    _both_agree(session, aof, memory, _run_sockets)


def _one_read(state: ServerState, data: bytes) -> tuple[int, bytes]:
    """(bytes the lane consumed, its replies) for one read."""
    from rcp11.commands import run_lane
    from rcp11.resp import RequestParser

    out: list[bytes] = []
    client = ClientState(authenticated=True)
    consumed, _ = run_lane(state, client, RequestParser(), data, out, 0, 1 << 40)
    return consumed, b"".join(out)


def test_the_lane_logs_twrite_requests_verbatim(tmp_path: Path) -> None:
    state, persistence = _setup(tmp_path, aof=True)
    logged = len(b"".join(persistence.aof.buf))
    requests = [
        [b"twrite", b"s", b"e"],
        [b"TWRITE", b"s", b"BACKLOG", b"3", b"ENTRIES", b"f", b"g"],
        [b"TREAD", b"s", b"0", b"10", b"WITHINFO"],
    ]
    data = b"".join(map(encode_command, requests))
    consumed, replies = _one_read(state, data)
    assert consumed == len(data)
    info = b"*8\r\n*4\r\n:4\r\n:6\r\n:0\r\n:7\r\n"  # first, last, start, count
    assert replies == b":4\r\n:5\r\n" + info + b"$-1\r\n" * 4 + b"$1\r\ne\r\n$1\r\nf\r\n$1\r\ng\r\n"
    logged_now = _undated(b"".join(persistence.aof.buf)[logged:])
    assert logged_now == b"".join(map(encode_command, requests[:2]))
    assert state.stats.commands["twrite"][0] == 2 + 3  # and the setup's three
    assert state.stats.total_messages_evicted == 4


def test_the_lane_stops_where_the_general_path_must_answer(tmp_path: Path) -> None:
    state, _ = _setup(tmp_path, aof=False)
    plain = encode_command([b"TWRITE", b"s", b"x"])
    for stopper in (
        [b"TWRITE", b"missing", b"x"],  # creates a key
        [b"TWRITE", b"k", b"x"],  # a string
        [b"TWRITE", b"s", b"BACKLOG", b"-1", b"ENTRIES", b"x"],
        [b"TREAD", b"s", b"0", b"01"],
        [b"TREAD", b"s", b"-0", b"1", b"BLOCK", b"0"],  # not canonical
        [b"TREAD", b"s", b"1000000", b"0", b"WITHINFO", b"BLOCK", b"10"],  # it waits
        [b"TREAD", b"missing", b"0", b"1", b"BLOCK", b"0"],
        [b"TREAD", b"s", b"0", b"1", b"BLOCK", b"-1"],
        [b"TREAD", b"s", b"0", b"1", b"BLOCK", b"01"],
        [b"TREAD", b"s", b"0", b"1", b"BLOCK", b"1e3"],
        [b"TREAD", b"s", b"0", b"1", b"BLOCK", b"9223372036854775808"],
        [b"TREAD", b"s", b"0", b"1", b"BLOCK"],
        [b"TREAD", b"s", b"0", b"1", b"BLOCK", b"WITHINFO"],
        [b"TREAD", b"s", b"0", b"1", b"BLOCK", b"1", b"GROUP", b"g"],
        [b"TREAD", b"s", b"0", b"1", b"GROUPNEW", b"g", b"BLOCK", b"1"],
        [b"TREAD", b"s", b"0", b"1", b"WITHINFO", b"WITHINFO", b"BLOCK", b"1"],
        [b"TREAD", b"missing", b"0", b"1"],
        [b"SET", b"k", b"v"],
    ):
        data = plain + encode_command(stopper) + plain
        consumed, replies = _one_read(state, data)
        assert consumed == len(plain), stopper
        assert replies.startswith(b":") and replies.count(b"\r\n") == 1


def test_block_reads_that_answer_at_once_are_run_by_the_lane(tmp_path: Path) -> None:
    """A TREAD ... BLOCK with something to read is the read without BLOCK:
    the lane runs it (the whole read is consumed), with the same reply and
    counters as the general path, and logs nothing."""
    requests = [
        [b"TREAD", b"s", b"0", b"2", b"BLOCK", b"0"],
        [b"tread", b"s", b"-1", b"5", b"block", b"100", b"withinfo"],
        [b"TREAD", b"s", b"3", b"1", b"WITHINFO", b"BLOCK", b"9223372036854775807"],
        [b"TREAD", b"s", b"1", b"0", b"BLOCK", b"5"],  # count 0: nothing to wait for
        [b"TREAD", b"s", b"-100", b"1", b"BLOCK", b"5"],  # floored at offset 0
        [b"TREAD", b"t", b"0", b"9", b"BLOCK", b"0"],  # a gap at 1 and 2
        [b"TREAD", b"t", b"1", b"9", b"NONULLS", b"BLOCK", b"0"],  # over it
    ]
    data = b"".join(map(encode_command, requests))
    seen = []
    for lane in (True, False):
        directory = tmp_path / f"lane-{lane}"
        directory.mkdir()
        state, persistence = _setup(directory, aof=True)
        client = Peer()
        replies = serve_reads(state, client, [data], lane=lane)
        seen.append((replies, client.blocked, _observed(state, persistence)))
        if lane:
            assert state.lane.counts.tread_calls == len(requests)  # all ran in C
    assert seen[0] == seen[1]
    replies, blocked, observed = seen[0]
    assert blocked is None
    info = b"*4\r\n:0\r\n:3\r\n:3\r\n:1\r\n"  # first, last, start, count
    assert replies == (
        b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"
        + (b"*2\r\n" + info + b"$1\r\nd\r\n") * 2
        + b"*0\r\n*1\r\n$1\r\na\r\n"
        + b"*4\r\n$3\r\none\r\n$-1\r\n$-1\r\n$3\r\ntwo\r\n"
        + b"*1\r\n$3\r\ntwo\r\n"
    )
    # (and the read of _setup that made the acknowledged group)
    assert observed["commandstats"]["tread"] == (len(requests) + 1, 0, 0)
    assert observed["read"] == 2 + 1 + 1 + 0 + 1 + 4 + 1


def test_withtimes_reads_are_run_by_the_lane(tmp_path: Path) -> None:
    """TREAD ... WITHTIMES (RESP2: message, time, ...) in C, byte for byte
    the general path's reply over the same streams, times included."""
    state, _ = _setup(tmp_path, aof=False)
    execute(state, ClientState(authenticated=True), [b"TEVICT", b"s", b"0"])
    requests = [
        [b"TREAD", b"s", b"0", b"3", b"WITHTIMES"],
        [b"tread", b"s", b"-2", b"5", b"withtimes", b"WITHINFO"],
        [b"TREAD", b"s", b"1", b"9", b"WITHINFO", b"BLOCK", b"0", b"WITHTIMES"],
        [b"TREAD", b"t", b"0", b"0", b"WITHTIMES"],
        [b"TREAD", b"t", b"5", b"1", b"WITHTIMES"],
        [b"TREAD", b"t", b"1", b"9", b"NONULLS", b"WITHTIMES", b"WITHINFO"],  # over t's gap
    ]
    data = b"".join(map(encode_command, requests))
    by_lane = serve_reads(state, Peer(), [data], lane=True)
    assert state.lane.counts.tread_calls == len(requests)  # all ran in C
    by_python = serve_reads(state, Peer(), [data], lane=False)
    assert by_lane == by_python
    s_time = state.keyspace.get(b"s").read_times(1, 1)[0]
    assert by_lane.startswith(b"*6\r\n$-1\r\n$-1\r\n$1\r\nb\r\n:%d\r\n" % s_time)


def test_a_block_read_at_the_tail_still_waits_after_the_lane(server_factory: Any) -> None:
    """Through the server: in one pipeline, reads the lane runs, then a
    BLOCK read with nothing to read (handed over: the client waits), then
    a TWRITE held until it is served. Another client's write serves it; a
    timeout answers a null array; the pipeline's order is kept."""
    server = server_factory()
    r = redis.Redis(port=server.port)
    other = redis.Redis(port=server.port)
    r.execute_command("TWRITE", "s", "ENTRIES", "a", "b", "c", "d")
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("TREAD", "s", "-1", "1", "BLOCK", "0")
    pipe.execute_command("TREAD", "s", "4", "2", "WITHINFO", "BLOCK", "0")
    pipe.execute_command("TWRITE", "s", "after")
    thread, box = in_thread(pipe.execute)
    wait_blocked(other, 1)
    assert other.execute_command("TWRITE", "s", "e") == 4
    thread.join(10)
    assert box["reply"] == [[b"d"], [[0, 4, 4, 1], b"e"], 5]

    pipe = r.pipeline(transaction=False)
    pipe.execute_command("TREAD", "s", "0", "1", "BLOCK", "1")
    pipe.execute_command("TREAD", "s", "6", "1", "BLOCK", "50")  # times out
    pipe.execute_command("TREAD", "s", "-1", "1", "BLOCK", "1")
    assert pipe.execute() == [[b"a"], None, [b"after"]]
    stats = other.info("commandstats")["cmdstat_tread"]
    assert stats["calls"] == 5 and stats["failed_calls"] == 0
    assert other.info("clients")["blocked_clients"] == 0
    r.close()
    other.close()


def test_a_consumer_following_a_producer_gets_every_message_in_order(
    server_factory: Any,
) -> None:
    """`TREAD k off 1000 BLOCK 0` in a loop behind a pipelining producer:
    reads with data are the lane's, reads at the tail wait; the consumer
    gets every message once, in order, with no gap."""
    server = server_factory()
    producer = redis.Redis(port=server.port)
    consumer = redis.Redis(port=server.port)
    total = 20_000
    producer.execute_command("TWRITE", "k", "m0")

    def consume() -> list[bytes]:
        got: list[bytes] = []
        while len(got) < total:
            got += consumer.execute_command("TREAD", "k", str(len(got)), "1000", "BLOCK", "0")
        return got

    thread, box = in_thread(consume)
    for start in range(1, total, 500):
        pipe = producer.pipeline(transaction=False)
        for i in range(start, min(start + 500, total)):
            pipe.execute_command("TWRITE", "k", f"m{i}")
        pipe.execute()
    thread.join(60)
    assert "error" not in box, box
    assert box["reply"] == [f"m{i}".encode() for i in range(total)]
    assert producer.info("clients")["blocked_clients"] == 0
    producer.close()
    consumer.close()


def test_the_lane_stops_short_of_the_largest_offset(tmp_path: Path) -> None:
    state, _ = _setup(tmp_path, aof=False)
    client = ClientState(authenticated=True)
    state.keyspace.data[b"s"].raise_next_offset(2**63 - 3)  # room for three more
    replies = serve_reads(state, client, [encode_command([b"TWRITE", b"s", b"x"]) * 5])
    offsets = b"".join(b":%d\r\n" % n for n in range(2**63 - 3, 2**63))
    assert replies.startswith(offsets)
    assert replies[len(offsets) :].count(b"-ERR") == 2


@pytest.mark.parametrize("policy", ["noeviction", "streams-oldest"])
def test_with_maxmemory_the_lane_writes_until_memory_is_over_the_limit(
    tmp_path: Path, policy: str
) -> None:
    """maxmemory does not turn the lane off (issue 23: 100k pipelined
    TWRITEs took 2.16x as long with maxmemory set): it runs TWRITEs while
    the memory they add keeps the used memory within the limit, and stops
    before the first one the general path would refuse (or evict for)."""
    state, _ = _setup(tmp_path, aof=False)
    state.config.set("maxmemory-policy", policy)
    state.config.set("maxmemory", "1gb")
    one = encode_command([b"TWRITE", b"s", b"x" * 200])
    consumed, replies = _one_read(state, one * 100)
    assert consumed == 100 * len(one)
    assert replies == b"".join(b":%d\r\n" % n for n in range(4, 104))
    # A limit a few nodes away: the lane stops at the first TWRITE that
    # finds the memory over it, which the general path answers.
    limit = state.used_memory() + 2000
    state.config.set("maxmemory", str(limit))
    consumed, _ = _one_read(state, one * 100)
    assert 0 < consumed < 100 * len(one)
    assert state.used_memory() > limit
    client = ClientState(authenticated=True)
    reply = execute(state, client, [b"TWRITE", b"s", b"y"])
    if policy == "noeviction":
        assert reply == Error(errors.OOM)
    else:
        assert type(reply) is int  # the oldest nodes made room


def test_a_served_pipeline_is_answered_counted_and_logged(server_factory: Any) -> None:
    """Through the server's read path (the lane wired into the connection):
    a pipeline of TWRITEs and TREADs gets its replies, INFO counts every
    command, and the AOF (appendfsync always) brings every write back."""
    server = server_factory(appendonly="yes", appendfsync="always")
    r = redis.Redis(port=server.port)
    assert r.execute_command("TWRITE", "s", "first") == 0
    pipe = r.pipeline(transaction=False)
    for i in range(300):
        pipe.execute_command("TWRITE", "s", f"m{i}")
    pipe.execute_command("TWRITE", "s", "BACKLOG", "250", "ENTRIES", "x", "y")
    pipe.execute_command("TREAD", "s", "-3", "10", "WITHINFO")
    replies = pipe.execute()
    assert replies[:300] == list(range(1, 301))
    assert replies[300] == 301
    assert replies[301] == [[53, 302, 300, 3], b"m299", b"x", b"y"]
    stats = r.info("commandstats")
    assert stats["cmdstat_twrite"]["calls"] == 302
    assert stats["cmdstat_tread"]["calls"] == 1
    info = r.info("stats")
    assert info["total_messages_written"] == 303
    assert info["total_messages_evicted"] == 53
    r.close()
    server.kill9()
    server.start()
    r = redis.Redis(port=server.port)
    assert r.execute_command("TREAD", "s", "53", "250") == [
        *(f"m{i}".encode() for i in range(52, 300)),
        b"x",
        b"y",
    ]
    r.close()


def test_a_request_split_across_reads_is_run_by_the_lane(tmp_path: Path) -> None:
    """A pipeline streamed in reads that end mid-request keeps the lane:
    the buffered start of the request is read again with the next read."""
    state, _ = _setup(tmp_path, aof=False)
    client = ClientState(authenticated=True)
    one = encode_command([b"TWRITE", b"s", b"x" * 50])
    data = one * 10
    cut = len(one) * 3 + 20  # inside the fourth request
    replies = serve_reads(state, client, [data[:cut], data[cut:]])
    assert replies == b"".join(b":%d\r\n" % n for n in range(4, 14))
    # The second read's lane run took the fourth request's start from the
    # parser and ran all seven left.
    assert state.lane.counts.twrite_calls == 7
    assert state.stats.commands["twrite"][0] == 3 + 10  # and the setup's three


def test_exec_runs_queued_twrites_in_the_lane_at_the_transactions_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction's TWRITEs run in the lane (none through the handler)
    and append at the one time the transaction pinned, as the general path
    appends them; the AOF holds them between MULTI and EXEC."""
    import rcp11.state

    state, persistence = _setup(tmp_path, aof=True)
    pinned = rcp11.state.wall_ms() + 10**9  # ahead of the clock: append times never go back
    monkeypatch.setattr(rcp11.state, "wall_ms", lambda: pinned)
    in_lane: list[int] = []
    run_queued = transactions.run_queued

    def counting(*args: Any) -> tuple[int, bytes]:
        ran, replies = run_queued(*args)
        in_lane.append(ran)
        return ran, replies

    monkeypatch.setattr(transactions, "run_queued", counting)
    client = Peer()
    requests = [[b"TWRITE", b"s", b"m%d" % i] for i in range(1000)]
    data = b"".join(map(encode_command, [[b"MULTI"], *requests, [b"EXEC"]]))
    replies = serve_reads(state, client, [data])
    assert replies.endswith(b"*1000\r\n" + b"".join(b":%d\r\n" % (4 + i) for i in range(1000)))
    assert sum(in_lane) == 1000
    assert state.keyspace.data[b"s"].last_append_ms == pinned
    logged = _aof_requests(b"".join(persistence.aof.buf))
    assert logged[-1002:] == [[b"MULTI"], *requests, [b"EXEC"]]
