"""A plain model of the contract (docs/PROTOCOL.md), for differential fuzzing.

Written from the contract, not from the server: a stream is a dict of
messages with a next offset and a first readable offset, a group key is a
string holding a decimal offset, eviction moves the first readable offset.
Small on purpose, so that it is obviously right; where the two disagree,
read the contract first.

Replies are plain values as a RESP2 client decodes them: int, bytes (bulk
strings and status replies), None (nulls), lists, and Err(code) for errors,
which are compared by their code only (ERR, WRONGTYPE, EXECABORT).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Err:
    code: str


@dataclass
class MStream:
    next: int = 0  # the offset the next message gets
    first: int = 0  # the oldest readable offset (== next when none is)
    messages: dict[int, bytes] = field(default_factory=dict)


class Blocked:
    """A client now waits (no reply yet)."""


BLOCKED = Blocked()
# TYPE of a stream (docs/PROTOCOL.md section 1: the module build's type name).
STREAM_TYPE = b"rcp11-log"
# TTL of a key with an expiry: any positive number of seconds.
TTL_POSITIVE = "ttl>0"


@dataclass
class Request:
    key: bytes
    start: int
    count: int
    withinfo: bool
    group: bytes | None
    group_new: bool
    nonulls: bool = False


def int64(arg: bytes) -> int | None:
    """A Redis integer: canonical decimal, in the signed 64-bit range."""
    try:
        text = arg.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not text or not text.lstrip("-").isdigit() or text.count("-") > 1:
        return None
    value = int(text)
    if str(value) != text or not INT64_MIN <= value <= INT64_MAX:
        return None
    return value


class ModelError(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


class Model:
    def __init__(self, clients: int) -> None:
        self.data: dict[bytes, MStream | bytes] = {}
        self.ttl: set[bytes] = set()
        self.watched: list[set[bytes]] = [set() for _ in range(clients)]
        self.dirty = [False] * clients
        self.queued: list[list[list[bytes]] | None] = [None] * clients
        self.blocked: dict[int, Request] = {}  # in the order clients blocked
        self.late: list[list[Any]] = [[] for _ in range(clients)]

    # -- keyspace ----------------------------------------------------------

    def touch(self, key: bytes) -> None:
        for client, keys in enumerate(self.watched):
            if key in keys:
                self.dirty[client] = True

    def put(self, key: bytes, value: MStream | bytes, keep_ttl: bool = False) -> None:
        self.data[key] = value
        if not keep_ttl:
            self.ttl.discard(key)
        self.touch(key)

    def remove(self, key: bytes) -> bool:
        if key not in self.data:
            return False
        del self.data[key]
        self.ttl.discard(key)
        self.touch(key)
        return True

    def stream(self, key: bytes) -> MStream | None:
        value = self.data.get(key)
        if isinstance(value, bytes):
            raise ModelError("WRONGTYPE")
        return value

    def group_position(self, group: bytes) -> int | None:
        value = self.data.get(group)
        if value is None:
            return None
        if isinstance(value, MStream):
            raise ModelError("WRONGTYPE")
        position = int64(value)
        if position is None and value == b"%d" % (INT64_MAX + 1):
            position = INT64_MAX + 1  # past the last possible offset
        if position is None or position < 0:
            raise ModelError("ERR")
        return position

    # -- commands ----------------------------------------------------------

    def run(self, client: int, argv: list[bytes]) -> Any:
        """One command from a client; serves blocked readers afterwards."""
        name = argv[0].upper()
        if self.queued[client] is not None and name not in (
            b"EXEC",
            b"DISCARD",
            b"MULTI",
            b"WATCH",
        ):
            self.queued[client].append(argv)  # type: ignore[union-attr]
            return b"QUEUED"
        reply = self.call(client, argv, in_exec=False)
        self.serve()
        return reply

    def call(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        try:
            return getattr(self, "cmd_" + argv[0].decode().lower())(client, argv, in_exec)
        except ModelError as exc:
            return Err(exc.code)

    def cmd_twrite(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        backlog = None
        if len(argv) == 3:
            entries = argv[2:]
        else:
            i = 2
            while True:
                if i >= len(argv):
                    raise ModelError("ERR")
                option = argv[i].upper()
                if option == b"ENTRIES":
                    i += 1
                    break
                if option != b"BACKLOG" or backlog is not None or i + 1 >= len(argv):
                    raise ModelError("ERR")
                backlog = int64(argv[i + 1])
                if backlog is None or backlog < 0:
                    raise ModelError("ERR")
                i += 2
            entries = argv[i:]
            if not entries:
                raise ModelError("ERR")
        stream = self.stream(argv[1])
        if stream is None:
            stream = MStream()
        first_written = stream.next
        for entry in entries:
            stream.messages[stream.next] = entry
            stream.next += 1
        if backlog is not None:
            stream.first = max(stream.first, stream.next - backlog)
        self.put(argv[1], stream, keep_ttl=argv[1] in self.data)
        return first_written

    def cmd_tread(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        offset, count = int64(argv[2]), int64(argv[3])
        if offset is None or count is None or count < 0:
            raise ModelError("ERR")
        block = group = None
        group_new = withinfo = nonulls = False
        seen: set[bytes] = set()
        i = 4
        while i < len(argv):
            option = argv[i].upper()
            if option in seen:
                raise ModelError("ERR")
            seen.add(option)
            if option in (b"WITHINFO", b"NONULLS"):
                withinfo = withinfo or option == b"WITHINFO"
                nonulls = nonulls or option == b"NONULLS"
                i += 1
                continue
            if option not in (b"BLOCK", b"GROUP", b"GROUPNEW") or i + 1 >= len(argv):
                raise ModelError("ERR")
            if option == b"BLOCK":
                block = int64(argv[i + 1])
                if block is None or block < 0:
                    raise ModelError("ERR")
            elif group is not None:
                raise ModelError("ERR")
            else:
                group, group_new = argv[i + 1], option == b"GROUPNEW"
            i += 2
        key = argv[1]
        stream = self.stream(key)
        next_offset = stream.next if stream else 0
        may_block = block is not None and not in_exec
        if group is None:
            start = offset if offset >= 0 else max(next_offset + offset, 0)
            wanted = count
            if nonulls:
                start, count = self.readable(stream, start, count)
            if start >= next_offset and may_block:
                self.blocked[client] = Request(key, start, wanted, withinfo, None, False, nonulls)
                return BLOCKED
            return self.read(stream, start, count, withinfo)[0]
        if group == key:
            raise ModelError("ERR")
        position = self.group_position(group)
        start = position if position is not None else self.default_start(stream, group_new)
        wanted = count
        if nonulls:
            start, count = self.readable(stream, start, count)
        if start >= next_offset and may_block:
            if position is None:
                self.put(group, b"%d" % start)
            self.blocked[client] = Request(key, start, wanted, withinfo, group, group_new, nonulls)
            return BLOCKED
        reply, n = self.read(stream, start, count, withinfo)
        if start + n != position:
            self.put(group, b"%d" % (start + n))
        return reply

    @staticmethod
    def readable(stream: MStream | None, start: int, count: int) -> tuple[int, int]:
        """NONULLS: the first readable offset at or after start and how many
        follow it (the model's streams have no gap: only an evicted prefix)."""
        next_offset = stream.next if stream else 0
        first = max(start, stream.first if stream else 0)
        if first >= next_offset:
            return max(start, next_offset), 0
        return first, min(count, next_offset - first)

    @staticmethod
    def default_start(stream: MStream | None, group_new: bool) -> int:
        if stream is None:
            return 0
        return stream.next if group_new else stream.first

    @staticmethod
    def read(stream: MStream | None, start: int, count: int, withinfo: bool) -> tuple[list, int]:
        next_offset = stream.next if stream else 0
        first = stream.first if stream else 0
        n = min(count, next_offset - start) if start < next_offset else 0
        messages = [
            stream.messages[o] if stream and o >= first else None for o in range(start, start + n)
        ]
        if withinfo:
            return [[first, next_offset - 1, start, n], *messages], n
        return messages, n

    def cmd_tevict(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        offset = int64(argv[2])
        if offset is None:
            raise ModelError("ERR")
        stream = self.stream(argv[1])
        if stream is None:
            return 0
        new_first = offset + 1 if offset >= 0 else stream.next + offset
        new_first = min(max(new_first, stream.first), stream.next)
        evicted = new_first - stream.first
        stream.first = new_first
        if evicted:
            self.touch(argv[1])
        return evicted

    def cmd_set(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        self.put(argv[1], argv[2])
        return b"OK"

    def cmd_get(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        value = self.data.get(argv[1])
        if isinstance(value, MStream):
            raise ModelError("WRONGTYPE")
        return value

    def cmd_incr(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        value = self.data.get(argv[1], b"0")
        if isinstance(value, MStream):
            raise ModelError("WRONGTYPE")
        number = int64(value)
        if number is None or number == INT64_MAX:
            raise ModelError("ERR")
        self.put(argv[1], b"%d" % (number + 1), keep_ttl=True)
        return number + 1

    def cmd_del(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        return sum(self.remove(key) for key in argv[1:])

    def cmd_exists(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        return sum(key in self.data for key in argv[1:])

    def cmd_type(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        value = self.data.get(argv[1])
        return b"none" if value is None else b"string" if isinstance(value, bytes) else STREAM_TYPE

    def cmd_dbsize(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        return len(self.data)

    def cmd_rename(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        src, dst = argv[1], argv[2]
        if src not in self.data:
            raise ModelError("ERR")
        if src == dst:
            return b"OK"
        value, had_ttl = self.data[src], src in self.ttl
        self.remove(src)
        self.remove(dst)
        self.put(dst, value)
        if had_ttl:
            self.ttl.add(dst)
        return b"OK"

    def cmd_expire(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        seconds = int64(argv[2])
        if seconds is None:
            raise ModelError("ERR")
        if argv[1] not in self.data:
            return 0
        if seconds <= 0:
            self.remove(argv[1])
        else:
            self.ttl.add(argv[1])
            self.touch(argv[1])
        return 1

    def cmd_persist(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        if argv[1] not in self.ttl:
            return 0
        self.ttl.discard(argv[1])
        self.touch(argv[1])
        return 1

    def cmd_ttl(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        if argv[1] not in self.data:
            return -2
        return TTL_POSITIVE if argv[1] in self.ttl else -1

    def cmd_watch(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        if self.queued[client] is not None:
            raise ModelError("ERR")
        self.watched[client].update(argv[1:])
        return b"OK"

    def cmd_unwatch(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        self.watched[client].clear()
        self.dirty[client] = False
        return b"OK"

    def cmd_multi(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        if self.queued[client] is not None:
            raise ModelError("ERR")
        self.queued[client] = []
        return b"OK"

    def _end(self, client: int) -> None:
        self.queued[client] = None
        self.watched[client].clear()
        self.dirty[client] = False

    def cmd_discard(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        if self.queued[client] is None:
            raise ModelError("ERR")
        self._end(client)
        return b"OK"

    def cmd_exec(self, client: int, argv: list[bytes], in_exec: bool) -> Any:
        queued = self.queued[client]
        if queued is None:
            raise ModelError("ERR")
        dirty = self.dirty[client]
        self._end(client)
        if dirty:
            return None
        return [self.call(client, queued_argv, in_exec=True) for queued_argv in queued]

    # -- blocked readers ------------------------------------------------------

    def serve(self) -> None:
        """Answer every blocked reader whose start offset now exists, in the
        order they blocked, across keys; a group reader starts where the
        group key says. Passes repeat until one changes nothing (serving a
        later reader may move a group key an earlier one waits on)."""
        changed = True
        while changed:
            changed = False
            for client, request in list(self.blocked.items()):
                if client not in self.blocked:
                    continue
                try:
                    stream = self.stream(request.key)
                    next_offset = stream.next if stream else 0
                    position = None
                    start = request.start
                    if request.group is not None:
                        position = self.group_position(request.group)
                        if position is None:
                            start = self.default_start(stream, request.group_new)
                        else:
                            start = position
                    count = request.count
                    if request.nonulls:
                        start, count = self.readable(stream, start, count)
                    if start >= next_offset:
                        if request.group is not None and position is None:
                            self.put(request.group, b"%d" % start)
                            changed = True
                        continue
                    reply, n = self.read(stream, start, count, request.withinfo)
                    if request.group is not None and start + n != position:
                        self.put(request.group, b"%d" % (start + n))
                except ModelError as exc:
                    reply = Err(exc.code)
                del self.blocked[client]
                self.late[client].append(reply)
                changed = True

    def disconnect(self, client: int) -> None:
        self.blocked.pop(client, None)
        self._end(client)
