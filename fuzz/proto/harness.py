"""The in-process target every Python fuzzer drives: request parsing and
command dispatch of rcp11 without sockets, with the invariants checked
after each step.

A Finding (an AssertionError) means the server did something a client must
never see. Anything else a target raises is a finding too: the fuzzers let
it propagate, so libFuzzer saves the input as a crash.

Invariants:
- parsing: the same bytes parse to the same commands and the same protocol
  error whether they come in one read (the hiredis path), split at random
  points, or one byte at a time (the exact Python path);
- every argv element a command handler (or the AOF) receives is `bytes`;
- no reply is an "internal error", every reply encodes in RESP2 and RESP3;
- a stream's next and first offsets never go backwards, a TWRITE never
  returns an offset below the stream's previous next offset;
- replaying what was propagated (the AOF) into an empty server rebuilds the
  same keyspace: apply-then-log is all or nothing.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import hiredis

from fuzz.proto.gen import AVOID_KNOWN
from rcp11.commands import BLOCKED, COMMANDS, client_disconnected, execute, run_lane
from rcp11.config import Config
from rcp11.errors import ProtocolError
from rcp11.resp import Error, RequestParser, encode, encode_command
from rcp11.state import ClientState, NullPersistence, ServerState
from rcp11.storage import Stream
from rcp11.storage.ackgroups import AckGroup

# A handler exception is reported through the reply; the log line would only
# flood the fuzzer's output.
logging.getLogger("rcp11").disabled = True

# Commands the fuzzers never run: they act on the process or the machine,
# not on the data (SHUTDOWN stops a server, CONFIG SET dir moves it), and
# in process they only answer "not available".
EXCLUDED = frozenset({b"shutdown", b"save", b"bgsave", b"bgrewriteaof"})


def excluded(argv: list[bytes]) -> bool:
    name = argv[0].lower()
    if name == b"config":
        # CONFIG GET reads; SET/REWRITE/RESETSTAT change the process.
        return len(argv) < 2 or argv[1].lower() != b"get"
    return name in EXCLUDED


class Finding(AssertionError):
    """The server broke one of the invariants above."""


class Recorder(NullPersistence):
    """Persistence that keeps what would go to the AOF, in memory."""

    aof_state = "on"

    def __init__(self) -> None:
        self.log: list[list[bytes]] = []

    def propagate(self, argv: list[bytes]) -> None:
        check_argv(argv, "propagated to the AOF")
        self.log.append(list(argv))

    def propagate_encoded(self, data: bytes) -> None:
        # The C lane's requests, verbatim: they must read back whole.
        reader = hiredis.Reader()
        reader.feed(data)
        while (argv := reader.gets()) is not False:
            self.propagate(argv)
        if reader.has_data():
            raise Finding(f"the lane logged a partial request: {data!r:.200}")


class FakeClient(ClientState):
    """A connection without a socket: late replies (a blocked read served,
    a timeout) land in `late`."""

    def __init__(self, resp: int = 2) -> None:
        super().__init__(resp=resp, authenticated=True)
        self.late: list[Any] = []
        self.pending: deque[list[bytes]] = deque()
        self.send = self._late  # type: ignore[method-assign]

    def _late(self, reply: Any) -> None:
        check_reply(reply)
        self.late.append(reply)


def check_argv(argv: Any, where: str = "handed to a handler") -> None:
    if type(argv) is not list or not argv:
        raise Finding(f"argv {where} is {argv!r}, not a non-empty list")
    for arg in argv:
        if type(arg) is not bytes:
            raise Finding(f"argument {arg!r} ({type(arg).__name__}) {where} in {argv!r:.200}")


def check_reply(reply: Any) -> None:
    if reply is BLOCKED:
        return
    if type(reply) is Error and "internal error" in reply.message:
        raise Finding(f"internal error reply: {reply.message}")
    if isinstance(reply, list | tuple):
        for item in reply:
            if type(item) is Error and "internal error" in item.message:
                raise Finding(f"internal error reply inside an array: {item.message}")
    encode(reply, False)
    encode(reply, True)


_checked_handlers = False


def check_handler_arguments() -> None:
    """Wrap every command handler once so its argv is checked on entry (also
    for commands run by EXEC, which never pass the parser again)."""
    global _checked_handlers
    if _checked_handlers:
        return
    _checked_handlers = True
    for row in COMMANDS.values():
        inner = row.handler

        def checked(state: ServerState, client: ClientState, argv: Any, _inner=inner) -> Any:
            check_argv(argv)
            return _inner(state, client, argv)

        object.__setattr__(row, "handler", checked)


def fresh_state() -> ServerState:
    state = ServerState(Config())
    state.persistence = Recorder()
    return state


class OffsetWatch:
    """Remembers each stream object's offsets: they may only grow."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[Stream, int, int]] = {}

    def check(self, state: ServerState) -> None:
        for key, value in state.keyspace.data.items():
            if not isinstance(value, Stream):
                continue
            nxt, first = value.next_offset, value.first_offset
            if not 0 <= first <= nxt:
                raise Finding(f"stream {key!r}: first offset {first}, next offset {nxt}")
            old = self.seen.get(id(value))
            if old is not None and old[0] is value and (nxt < old[1] or first < old[2]):
                raise Finding(
                    f"stream {key!r} went back: next {old[1]} -> {nxt}, first {old[2]} -> {first}"
                )
            self.seen[id(value)] = (value, nxt, first)

    def next_of(self, state: ServerState, key: bytes) -> int:
        value = state.keyspace.data.get(key)
        return value.next_offset if isinstance(value, Stream) else 0


def keyspace_image(state: ServerState, now_ms: float) -> dict[bytes, Any]:
    """The keyspace as plain values at now_ms (keys whose TTL passed are
    gone, expired or not), to compare two servers."""
    image: dict[bytes, Any] = {}
    expires = state.keyspace.expires
    for key, value in state.keyspace.data.items():
        if key in expires and expires[key] <= now_ms:
            continue
        if isinstance(value, Stream):
            nxt, first = value.next_offset, value.first_offset
            image[key] = ("stream", first, nxt, tuple(value.read(first, nxt - first)))
        elif isinstance(value, AckGroup):
            # Deadlines are absolute: a replay restores them exactly.
            image[key] = ("group", value.stream_key, value.next_offset, value.totals(),
                          tuple(value.ranges()))  # fmt: skip
        else:
            image[key] = ("string", value)
    for key, when in state.keyspace.expires.items():
        if key in image:
            image[key] = (*image[key], "ttl", when)
    return image


# The AOF is replayed as a restart a day later would: every TTL set during
# the run has passed by then, so a key that the replay deletes at its
# PEXPIREAT and a later command recreates (issue 8, item 4) shows up.
REPLAY_LATER_S = 0 if AVOID_KNOWN else 86400


def check_replay(state: ServerState) -> None:
    """Load the recorded AOF into an empty server: same keyspace, no errors."""
    log = state.persistence.log  # type: ignore[attr-defined]
    copy = ServerState(Config())
    copy.persistence = NullPersistence()
    later = time.time() + REPLAY_LATER_S
    real_time = time.time
    time.time = lambda: later  # type: ignore[assignment]
    try:
        copy.loading = True
        replayer = FakeClient()
        for argv in log:
            reply = execute(copy, replayer, argv)
            if type(reply) is Error:
                raise Finding(f"AOF replay of {argv!r:.200} failed: {reply.message}")
        copy.loading = False
        while copy.keyspace.expire_due(later * 1000):
            pass
    finally:
        time.time = real_time  # type: ignore[assignment]
    before, after = keyspace_image(state, later * 1000), keyspace_image(copy, later * 1000)
    if before != after:
        diff = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        key = diff[0]
        raise Finding(
            f"AOF replay differs at {key!r}: live {before.get(key)!r:.300}, "
            f"replayed {after.get(key)!r:.300}"
        )


# --------------------------------------------------------------------------
# Parsing every way
# --------------------------------------------------------------------------


def _parse(pieces: Iterable[bytes], method: str) -> tuple[list[list[bytes]], str | None]:
    parser = RequestParser()
    out: list[list[bytes]] = []
    try:
        return _parse_into(parser, pieces, method, out)
    except TypeError as exc:
        if not AVOID_KNOWN:
            raise
        # Issue 8 item 1 (hiredis raising for a map keyed by an array),
        # known: read it as the protocol error it will be.
        return _known_not_bulk(out, exc)


def _known_not_bulk(out: list[list[bytes]], why: object) -> tuple[list[list[bytes]], str]:
    good = []
    for argv in out:
        if any(type(arg) is not bytes for arg in argv):
            break
        good.append(argv)
    return good, f"known: not a bulk string ({why})"


def _parse_into(
    parser: RequestParser, pieces: Iterable[bytes], method: str, out: list[list[bytes]]
) -> tuple[list[list[bytes]], str | None]:
    try:
        for piece in pieces:
            if method == "take":
                out += parser.take(piece)
            elif method == "drain":
                parser.feed(piece)
                out += parser.drain()
            else:
                parser.feed(piece)
                while (argv := parser.gets()) is not None:
                    out.append(argv)
        while more := parser.drain():
            out += more
    except ProtocolError as exc:
        return out, str(exc)
    return out, None


def cut_points(data: bytes, rng: random.Random) -> list[bytes]:
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 8))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


# Byte-by-byte parsing is quadratic in the worst case (an inline line is
# rescanned per byte): only inputs up to this size get it.
BYTEWISE_MAX = 2048


def parse_every_way(
    data: bytes, rng: random.Random | None = None
) -> tuple[list[list[bytes]], str | None]:
    """The commands in data and the protocol error after them, checked to be
    the same for every way of reading them."""
    if rng is None:
        rng = random.Random(zlib.crc32(data))
    whole = _parse([data], "take")
    ways = {
        "gets, one read": _parse([data], "gets"),
        "take, split": _parse(cut_points(data, rng), "take"),
        "drain, split": _parse(cut_points(data, rng), "drain"),
    }
    if len(data) <= BYTEWISE_MAX:
        ways["drain, byte by byte"] = _parse([data[i : i + 1] for i in range(len(data))], "drain")
    if AVOID_KNOWN:
        # Issue 8 item 1, known: a request with an element that is not a
        # bulk string ends the connection wherever it comes.
        results = [whole, *ways.values()]
        if any(any(type(a) is not bytes for a in argv) for r in results for argv in r[0]) or any(
            (r[1] or "").startswith("known:") for r in results
        ):
            return _known_not_bulk(whole[0], "parse")
    for name, result in ways.items():
        if result != whole:
            raise Finding(
                f"parse differs ({name} vs take, one read):\n  {result!r:.600}\n  {whole!r:.600}"
            )
    for argv in whole[0]:
        check_argv(argv, "parsed")
    return whole


# --------------------------------------------------------------------------
# A server of fake clients
# --------------------------------------------------------------------------


# The commands the C lane may run (rcp11/commands/lane.py).
_LANE_COMMANDS = (b"twrite", b"tread")


class Target:
    """A ServerState with fake clients; run() is what the server does with
    one client's parsed commands (the C lane first, with fast=True)."""

    def __init__(self, clients: int = 3, resp3: Iterable[bool] = ()) -> None:
        check_handler_arguments()
        self.state = fresh_state()
        flags = list(resp3)
        self.clients = [FakeClient(3 if i < len(flags) and flags[i] else 2) for i in range(clients)]
        self.offsets = OffsetWatch()
        self.replies: list[list[Any]] = [[] for _ in range(clients)]

    def run(self, index: int, commands: list[list[bytes]], fast: bool = True) -> None:
        client = self.clients[index]
        client.pending.extend(commands)
        self._drain(index, fast)
        self._resume(fast)

    def _drain(self, index: int, fast: bool) -> None:
        client = self.clients[index]
        pending = client.pending
        while pending and client.blocked is None:
            argv = pending[0]
            if AVOID_KNOWN and any(type(arg) is not bytes for arg in argv):
                # Issue 8 item 1, known: the fixed server closes here.
                self.disconnect(index)
                return
            check_argv(argv, "parsed")
            if excluded(argv):
                pending.popleft()
                continue
            if fast and argv[0].lower() in _LANE_COMMANDS and self._lane(index):
                continue
            pending.popleft()
            self.one(index, argv)

    def _lane(self, index: int) -> bool:
        """What the server's read path does first: the C lane runs what it
        can of the client's pending commands, sent as one read. False when
        it ran nothing."""
        client = self.clients[index]
        parts = []
        for argv in client.pending:
            if excluded(argv) or any(type(arg) is not bytes for arg in argv):
                break
            parts.append(encode_command(argv))
        out: list[bytes] = []
        consumed, _ = run_lane(
            self.state, client, RequestParser(), b"".join(parts), out, 0, 1 << 62
        )
        if not consumed:
            return False
        ends = [sum(map(len, parts[: i + 1])) for i in range(len(parts))]
        if consumed not in ends:
            raise Finding(f"the lane consumed {consumed} bytes, not whole requests {ends}")
        reader = hiredis.Reader()
        reader.feed(b"".join(out))
        for _ in range(ends.index(consumed) + 1):
            reply = reader.gets()
            if reply is False:
                raise Finding("the lane ran a request and sent no reply")
            check_argv(client.pending.popleft(), "parsed")
            self._record(index, reply)
        if reader.gets() is not False:
            raise Finding("the lane sent more replies than it ran requests")
        self.offsets.check(self.state)
        return True

    def one(self, index: int, argv: list[bytes]) -> Any:
        state = self.state
        client = self.clients[index]
        before = None
        if argv[0].lower() == b"twrite" and len(argv) > 2 and argv[1] not in state.keyspace.expires:
            # (A key with a TTL may expire between here and the write, and
            # a new stream starts again at 0: a race, not a finding.)
            before = self.offsets.next_of(state, argv[1])
        reply = execute(state, client, argv)
        check_reply(reply)
        if before is not None and type(reply) is int and reply < before:
            raise Finding(f"TWRITE {argv[1]!r} returned {reply}, below next offset {before}")
        self.offsets.check(state)
        if reply is not BLOCKED:
            self._record(index, reply)
        return reply

    def _record(self, index: int, reply: Any) -> None:
        self.replies[index].append(reply)

    def _resume(self, fast: bool) -> None:
        # Clients woken by the last command run what they had pipelined.
        progress = True
        while progress:
            progress = False
            for index, client in enumerate(self.clients):
                if client.pending and client.blocked is None:
                    self._drain(index, fast)
                    progress = True

    def disconnect(self, index: int) -> None:
        client = self.clients[index]
        client_disconnected(self.state, client)
        client.pending.clear()
        client.queued = None

    def finish(self) -> None:
        for index in range(len(self.clients)):
            self.disconnect(index)
        self.offsets.check(self.state)
        check_replay(self.state)


def in_scratch_dir(path: str | None = None) -> Callable[[], None]:
    """Run in directory path (made if missing), or in a new temporary one:
    a command that writes files writes them there. Returns the function
    that goes back."""
    old = os.getcwd()
    if path is None:
        path = tempfile.mkdtemp(prefix="rcp11-fuzz-")
    os.makedirs(path, exist_ok=True)
    os.chdir(path)

    def back() -> None:
        os.chdir(old)

    return back
