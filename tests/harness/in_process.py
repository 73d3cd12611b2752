"""The server's parts wired in this process, without a network: a
ServerState with its Persistence, and a connection's reads run as the
server runs them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def persistence_in_process(directory: Path, **directives: str) -> tuple[Any, Any]:
    """(ServerState, Persistence) on `directory`, in this process, wired as
    the server wires them, with no save rules; `directives` as for CONFIG
    SET (underscores for dashes). Not loaded yet: call .load()."""
    from rcp11.commands import execute
    from rcp11.config import Config
    from rcp11.persistence import Persistence
    from rcp11.state import ServerState

    config = Config()
    config.set("dir", str(directory))
    config.set("save", "")
    for name, value in directives.items():
        config.set(name.replace("_", "-"), value)
    state = ServerState(config)
    state.persistence = persistence = Persistence(state, execute)
    return state, persistence


def finish_rewrite(persistence: Any, timeout: float = 60.0) -> None:
    """Tick an in-process Persistence (as the server's cron does) until its
    background AOF rewrite has ended; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while persistence.info()["aof_rewrite_in_progress"]:
        assert time.monotonic() < deadline, "the AOF rewrite never finished"
        time.sleep(0.02)
        persistence.tick(time.time())


def serve_reads(state: Any, client: Any, chunks: list[bytes], lane: bool = True) -> bytes:
    """What a connection does with each read, in process (the server's
    Connection.data_received() and process() without the network): the C
    lane first (unless lane=False), then the parser and run_pipeline() for
    the rest. Returns the reply bytes; a protocol error ends it as it ends
    the connection."""
    from rcp11.commands import Stop, protocol_error_reply, run_buffered, run_lane, run_pipeline
    from rcp11.errors import ProtocolError
    from rcp11.resp import RequestParser

    parser = client.__dict__.setdefault("_test_parser", RequestParser())
    out: list[bytes] = []
    out_bytes = 0
    mark = 1 << 62
    for data in chunks:
        if client.closing:
            break
        commands: list[list[bytes]] | None = None
        try:
            if lane and client.blocked is None:
                consumed, out_bytes = run_lane(state, client, parser, data, out, out_bytes, mark)
                if consumed == len(data):
                    continue
                if consumed:
                    parser.feed(data[consumed:])  # the lane gets another go at it below
                else:
                    commands = parser.take(data)
            elif client.blocked is not None:
                parser.feed(data)
                continue
            else:
                commands = parser.take(data)
            index = 0
            while True:
                if not commands:
                    if lane:
                        consumed, out_bytes = run_buffered(
                            state, client, parser, out, out_bytes, mark
                        )
                        if consumed:
                            continue
                    commands, index = parser.drain(), 0
                    if not commands:
                        break
                index, out_bytes, stop = run_pipeline(
                    state, client, commands, index, out, out_bytes, mark
                )
                if stop is Stop.DONE:
                    commands = None
                elif stop is not Stop.OUTPUT and stop is not Stop.CLOCK:
                    parser.push_back(commands[index:])
                    break
        except ProtocolError as exc:
            out.append(protocol_error_reply(state, exc.message))
            client.closing = True
    return b"".join(out)


def dispatch_read(state: Any, client: Any, commands: list[list[bytes]]) -> list[Any]:
    """The replies to one read holding commands, as the server runs it
    (serve_reads()), decoded: integers, bytes, lists, and rcp11.resp.Error
    for error replies."""
    import hiredis

    from rcp11.resp import Error, encode_command

    data = serve_reads(state, client, [b"".join(map(encode_command, commands))])
    reader = hiredis.Reader(replyError=Error)
    reader.feed(data)
    replies = []
    while (reply := reader.gets()) is not False:
        replies.append(reply)
    return replies
