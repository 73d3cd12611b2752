"""What the crash tests share (test_crash_random_kills.py,
test_crash_aof_whole.py; a test file never imports another): writers that
remember exactly what the server acknowledged, kill -9 rounds, the check
that no offset was reused, and reading an AOF as the loader does."""

from __future__ import annotations

import io
import random
import threading
import time

import redis
from conftest import wait_for

WRITERS = 3
ROUNDS = 3


class Writers:
    """Threads writing with redis-py pipelines; each remembers exactly what
    the server acknowledged: (key, offset) -> payload."""

    def __init__(self, port: int, seed: int) -> None:
        self.port = port
        self.acked: dict[tuple[bytes, int], bytes] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self.run, args=(index, seed), daemon=True)
            for index in range(WRITERS)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(20)

    def run(self, index: int, seed: int) -> None:
        rng = random.Random(seed * 100 + index)
        client = redis.Redis(port=self.port, socket_timeout=10)
        sequence = 0
        try:
            while not self.stop.is_set():
                pipe = client.pipeline(transaction=False)
                sent: list[tuple[bytes, list[bytes]]] = []
                for _ in range(rng.randint(1, 20)):
                    # Own key and a shared one, so offsets interleave.
                    key = b"shared" if rng.random() < 0.5 else b"own%d" % index
                    batch = []
                    for _ in range(rng.randint(1, 5)):
                        batch.append(
                            b"w%d-%d-" % (index, sequence) + rng.randbytes(rng.randint(0, 40))
                        )
                        sequence += 1
                    pipe.execute_command("TWRITE", key, "ENTRIES", *batch)
                    sent.append((key, batch))
                firsts = pipe.execute()
                with self.lock:
                    for (key, batch), first in zip(sent, firsts, strict=True):
                        for position, payload in enumerate(batch):
                            self.acked[(key, first + position)] = payload
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            pass  # the server was killed under us
        finally:
            client.close()


def read_offsets(client: redis.Redis, key: bytes) -> tuple[int, list[bytes | None]]:
    info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
    next_offset = info[1] + 1
    messages = client.execute_command("TREAD", key, 0, next_offset) if next_offset else []
    return next_offset, messages


def crash_rounds(srv, seed: int, check, rounds: int = ROUNDS) -> int:
    """Run writers, kill -9 after a random time, restart, check; repeat.
    Returns how many writes were acknowledged in total."""
    rng = random.Random(seed)
    acked: dict[tuple[bytes, int], bytes] = {}
    for round_index in range(rounds):
        writers = Writers(srv.port, seed * 10 + round_index)
        writers.start()
        wait_for(lambda w=writers: w.acked)  # writing, however busy the machine is
        time.sleep(rng.uniform(0.3, 1.2))  # then a random moment of the writes
        srv.kill9()

        writers.join()
        acked.update(writers.acked)
        srv.start()
        check(srv.client(), acked)
    return len(acked)


def assert_offsets_not_reused(client: redis.Redis, acked: dict, lost_ok: bool) -> None:
    by_key: dict[bytes, dict[int, bytes]] = {}
    for (key, offset), payload in acked.items():
        by_key.setdefault(key, {})[offset] = payload
    for key, offsets in by_key.items():
        next_offset, messages = read_offsets(client, key)
        assert next_offset > max(offsets), f"{key!r}: next offset {next_offset} reuses offsets"
        for offset, payload in offsets.items():
            if lost_ok:
                # Lost in the crash reads as null, never as other data.
                assert messages[offset] in (payload, None), (key, offset)
            else:
                assert messages[offset] == payload, (key, offset)
        # And a new write really lands above everything acknowledged.
        first = client.execute_command("TWRITE", key, b"after-restart")
        assert first > max(offsets)
        acked[(key, first)] = b"after-restart"


def command_boundaries(data: bytes, start: int) -> list[int]:
    """Offsets in an AOF where a complete command starts (after a snapshot
    preamble), read as the server's loader reads it: a kill -9 in the middle
    of a large write leaves the last command half-written, and the loader
    cuts that tail off (aof-load-truncated), so it holds no boundary. Any
    other damage (BadBytes) is not what a crash leaves: it fails the test."""
    from rcp11.persistence import TornTail, iter_aof_commands

    starts: list[int] = []
    try:
        for _, at, _ in iter_aof_commands(io.BytesIO(data), start):
            starts.append(at)
    except TornTail:
        pass  # the half-written last command
    return starts


def preamble_end(path) -> int:
    from rcp11.config import Config
    from rcp11.persistence import CrcReader, read_snapshot
    from rcp11.state import ServerState

    with open(path, "rb") as file:
        if file.read(9) != b"RCP11SNAP":
            return 0
        file.seek(0)
        reader = CrcReader(file, str(path), path.stat().st_size)
        read_snapshot(reader, ServerState(Config()))
        return reader.pos


def null_offsets(client: redis.Redis, key: bytes) -> int:
    """How many offsets between the stream's oldest readable one and its
    next offset read as null: the gap a crash left (nothing is evicted in
    these tests)."""
    info = client.execute_command("TREAD", key, 0, 0, "WITHINFO")[0]
    first, next_offset = info[0], info[1] + 1
    if next_offset <= first:
        return 0
    return client.execute_command("TREAD", key, first, next_offset - first).count(None)


# The offsets file's AOF slot (rcp11/persistence/offsets_file.py): the tests
# read it, and rewrite it the way a power loss or a reboot leaves it.


def offsets_path(directory) -> str:
    return str(directory / "dump.rcp.offsets")


def read_slot(directory):  # noqa: ANN201 - an AofSlot
    from rcp11.persistence.offsets_file import HEADER_SIZE, SLOT_AT, decode_slot

    with open(offsets_path(directory), "rb") as file:
        return decode_slot(file.read(HEADER_SIZE)[SLOT_AT:])


def write_slot(directory, slot) -> None:
    from rcp11.persistence.offsets_file import SLOT_AT, encode_slot

    with open(offsets_path(directory), "r+b") as file:
        file.seek(SLOT_AT)
        file.write(encode_slot(slot))


def as_if_rebooted(directory, slot=None) -> None:
    """Make the slot (the one on file, or `slot`: an older one a power loss
    left on disk) one written during another boot."""
    slot = slot if slot is not None else read_slot(directory)
    write_slot(directory, slot._replace(boot=b"an earlier boot!"))
