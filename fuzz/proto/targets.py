"""The four fuzz targets. Each takes the fuzzer's bytes and raises (a
Finding, or whatever the server raised) when something is wrong:

raw     the bytes are what one client sent: parsed every way (one read,
        split at random points, byte by byte), then run.
struct  the bytes choose a program: up to three clients, each sending
        commands over a small key space, encoded as RESP arrays, inline
        lines, or with random RESP values of every RESP2/RESP3 type in
        their place (nested, huge counts, lying lengths).
diff    the bytes choose valid-looking command sequences for three clients;
        the server and fuzz.proto.model run them side by side and every reply
        (and every late reply to a blocked reader) must agree.
loop    the bytes choose two clients' reads; the server's front end serves
        them over sockets from the C lane's own event loop and from asyncio
        with the general path alone: the same bytes back, AOF and keyspace.

They run without atheris too (tests replay the corpus through them).
"""

from __future__ import annotations

from typing import Any

import hiredis

from fuzz.proto import gen, model
from fuzz.proto.gen import AVOID_KNOWN, Draw
from fuzz.proto.harness import Finding, Target, fresh_state, keyspace_image, parse_every_way
from rcp11.errors import ProtocolError
from rcp11.resp import RequestParser, encode


def raw(data: bytes) -> None:
    commands, _error = parse_every_way(data)
    target = Target(clients=1)
    target.run(0, commands)
    target.finish()


def struct(data: bytes) -> None:
    d = Draw(data)
    resp3 = [d.chance(64) for _ in range(3)]
    program = gen.steps(d, 3)
    target = Target(3, resp3)
    parsers = [RequestParser() for _ in range(3)]
    sent = [b""] * 3
    taken: list[list[list[bytes]]] = [[], [], []]
    errors: list[str | None] = [None] * 3
    for client, chunk in program:
        if errors[client] is not None:
            continue  # the server closed this connection
        sent[client] += chunk
        commands: list[list[bytes]] = []
        try:
            commands += parsers[client].take(chunk)
            while more := parsers[client].drain():
                commands += more
        except ProtocolError as exc:
            errors[client] = str(exc)
        except TypeError:
            if not AVOID_KNOWN:
                raise
            errors[client] = "known"  # issue 8 item 1; see harness._parse
        taken[client] += commands
        target.run(client, commands)
        if errors[client] is not None:
            target.disconnect(client)
    for client in range(3):
        expected = parse_every_way(sent[client])
        if AVOID_KNOWN and (errors[client] == "known" or (expected[1] or "").startswith("known:")):
            continue
        if expected != (taken[client], errors[client]):
            raise Finding(
                f"client {client}: reads as they came parsed to {taken[client]!r:.400} "
                f"{errors[client]!r}, the whole stream to {expected!r:.400}"
            )
    target.finish()


# --------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------

STREAMS = [b"k0", b"k1", b"k2"]
# Each group reads one stream, as a consumer group does.
GROUP_OF = {b"k0": b"g0", b"k1": b"g1", b"k2": b"g0"}
SMALL = [b"%d" % n for n in range(-4, 9)]


def _diff_command(d: Draw) -> list[bytes]:
    k = d.pick(STREAMS)
    kind = d.below(24)
    if kind < 5:
        return [b"TWRITE", k, gen.value(d)]
    if kind < 7:
        argv = [b"TWRITE", k]
        if d.chance(100):
            argv += [b"BACKLOG", d.pick(SMALL)]
        argv.append(b"ENTRIES")
        return argv + [gen.value(d) for _ in range(1 + d.below(4))]
    if kind < 12:
        argv = [b"TREAD", k, d.pick(SMALL), d.pick(SMALL[4:])]
        for _ in range(d.below(3)):
            argv += d.pick(
                [
                    [b"WITHINFO"],
                    [b"BLOCK", d.pick([b"0", b"1000"])],
                    [b"GROUP", GROUP_OF[k]],
                    [b"GROUPNEW", GROUP_OF[k]],
                ]
            )
        return argv
    if kind == 12:
        return [b"TEVICT", k, d.pick(SMALL)]
    g = d.pick([b"g0", b"g1"])
    return d.pick(
        [
            [b"SET", g, d.pick(SMALL + [b"x", b"007"])],
            [b"GET", d.pick([g, k])],
            [b"INCR", g],
            [b"DEL", d.pick([g, k])],
            [b"EXISTS", k, g],
            [b"TYPE", d.pick([g, k])],
            [b"RENAME", k, d.pick(STREAMS)],
            [b"EXPIRE", d.pick([g, k]), d.pick([b"100", b"0"])],
            [b"PERSIST", k],
            [b"TTL", k],
            [b"WATCH", d.pick([g, k])],
            [b"UNWATCH"],
            [b"MULTI"],
            [b"EXEC"],
            [b"DISCARD"],
            [b"DBSIZE"],
            [b"TWRITE", g, b"x"],
            [b"TREAD", g, b"0", b"1"],
            [b"TREAD", k, b"0", b"1", b"GROUP", k],
        ]
    )


def decode(reply: Any) -> Any:
    """A reply as a RESP2 client reads it, errors as model.Err(code)."""
    reader = hiredis.Reader()
    reader.feed(encode(reply, False))
    return _plain(reader.gets())


def _plain(value: Any) -> Any:
    if isinstance(value, hiredis.ReplyError):
        return model.Err(str(value).split(" ", 1)[0])
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _agree(server: Any, expected: Any) -> bool:
    if expected == model.TTL_POSITIVE:
        return type(server) is int and server > 0
    if isinstance(expected, list) and isinstance(server, list) and len(expected) == len(server):
        return all(_agree(s, e) for s, e in zip(server, expected, strict=True))
    return server == expected


def diff(data: bytes) -> None:
    d = Draw(data)
    target = Target(3)
    ref = model.Model(3)
    history: list[str] = []
    steps = 0
    while d.more() and steps < 80:
        steps += 1
        ready = [c for c in range(3) if c not in ref.blocked]
        if not ready or d.chance(4):
            # Everyone waits (or a client goes away): drop the oldest waiter.
            gone = next(iter(ref.blocked)) if ref.blocked else d.below(3)
            target.disconnect(gone)
            ref.disconnect(gone)
            history.append(f"client {gone} disconnects")
            continue
        client = d.pick(ready)
        if d.chance(24):
            # A pipelined run of TWRITEs (the server's fast path).
            k = d.pick(STREAMS)
            batch = [
                [b"TWRITE", k if d.chance(220) else b"k1", gen.value(d)]
                for _ in range(2 + d.below(6))
            ]
        else:
            batch = [_diff_command(d)]
        for argv in batch:
            history.append(f"client {client}: {b' '.join(argv)!r}")
        done = len(target.replies[client])
        target.run(client, batch)
        got = [decode(r) for r in target.replies[client][done:]]
        want = []
        for argv in batch:
            reply = ref.run(client, argv)
            if reply is not model.BLOCKED:
                want.append(reply)
        for index in range(3):
            late_got = [decode(r) for r in target.clients[index].late]
            if not _agree(late_got, ref.late[index]):
                _disagree(history, f"late replies to client {index}", late_got, ref.late[index])
        if not _agree(got, want):
            _disagree(history, "replies", got, want)
        blocked_server = {c for c in range(3) if target.clients[c].blocked is not None}
        if blocked_server != set(ref.blocked):
            _disagree(history, "blocked clients", sorted(blocked_server), sorted(ref.blocked))
    target.finish()


def _disagree(history: list[str], what: str, server: Any, expected: Any) -> None:
    raise Finding(
        f"server and model disagree on {what}:\n  server {server!r:.500}\n  model  {expected!r:.500}\n"
        "after:\n  " + "\n  ".join(history[-30:])
    )


# --------------------------------------------------------------------------
# loop
# --------------------------------------------------------------------------


def loop(data: bytes) -> None:
    """Two clients' reads through the server's front end over sockets, once
    served by the C lane's own event loop (src/netloop.c) and once by
    asyncio with the general path alone: what each client receives after
    each read, the AOF and the keyspace must be the same."""
    d = Draw(data)
    program: list[tuple[int, bytes]] = []
    while d.more() and len(program) < 24:
        client = d.below(2)
        count = 1 + d.below(5)
        # diff's commands: deterministic (no TIME, INFO, CLIENT LIST, whose
        # replies differ between any two runs), most of them the lane's.
        argvs = [_diff_command(d) for _ in range(count)]
        chunk = b"".join(gen.wire(d, argv) if d.chance(24) else gen.request(argv) for argv in argvs)
        if d.chance(32) and len(chunk) > 1:
            cut = 1 + d.below(len(chunk) - 1)  # a read that ends mid-request
            program += [(client, chunk[:cut]), (client, chunk[cut:])]
        else:
            program.append((client, chunk))
    outcomes = [_through_front(program, c_loop) for c_loop in (True, False)]
    if outcomes[0] != outcomes[1]:
        raise Finding(
            f"the C loop and the general path differ on {program!r:.600}: "
            f"{outcomes[0]!r:.600} != {outcomes[1]!r:.600}"
        )


def _through_front(program: list[tuple[int, bytes]], c_loop: bool) -> tuple[Any, ...]:
    from fuzz.proto.front import SocketFront

    state = fresh_state()
    front = SocketFront(state, c_loop, clients=2, ids=[1, 2])
    received: list[tuple[int, bytes]] = []
    try:
        for client, chunk in program:
            if front.conns[client].closed:
                continue  # a protocol error or QUIT closed it
            try:
                front.peers[client].sendall(chunk)
            except OSError:
                continue
            front.run()
            received += [(i, front.received(i)) for i in range(2)]
        log = [
            [
                b"<deadline>" if i == 2 and argv[0].upper() == b"PEXPIREAT" else a
                for i, a in enumerate(argv)
            ]
            for argv in state.persistence.log  # type: ignore[attr-defined]
        ]
        image = {
            key: value[:-1] if "ttl" in value else value
            for key, value in keyspace_image(state, float("-inf")).items()
        }
        stats = state.stats
        counts = (
            stats.total_commands_processed,
            stats.total_messages_written,
            stats.total_error_replies,
        )
        return received, log, image, counts
    finally:
        front.close()


TARGETS = {"raw": raw, "struct": struct, "diff": diff, "loop": loop}
