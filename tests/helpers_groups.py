"""A consumer of an acknowledged group for the crash tests
(test_groups_acked_crash.py), run as its own process so that it can be
killed with SIGKILL:

    python tests/helpers_groups.py PORTFILE KEY GROUP OUTFILE LEASE_MS BATCH DELAY_MS

It consumes with rcp11.client's follow_group(lease_ms=...), "processes" a
message by appending its offset to OUTFILE (unbuffered, so a kill loses no
record of what was processed), and reconnects to the port PORTFILE names
whenever the connection fails (a server restarted, a failover).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rcp11.client import Client


def processed(directory: Path) -> list[int]:
    """Every offset the consumers writing into directory processed, with
    repeats (a message processed twice appears twice)."""
    offsets: list[int] = []
    for path in sorted(directory.glob("*.out")):
        offsets += [int(line) for line in path.read_bytes().split()]
    return offsets


def main(argv: list[str]) -> int:
    port_file, key, group, out_path = argv[:4]
    lease_ms, batch, delay_ms = (int(x) for x in argv[4:7])
    name = f"worker-{os.getpid()}"
    with open(out_path, "ab", buffering=0) as out:
        while True:
            port = int(Path(port_file).read_text())
            # No retries of redis-py's own: a dropped connection or a dead
            # server ends this loop at once (what the batch in hand held is
            # not acknowledged: its lease runs out), and it reconnects.
            client = Client(port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
            try:
                for offset, _ in client.follow_group(
                    key, group, batch=batch, block_ms=200, lease_ms=lease_ms, consumer=name
                ):
                    out.write(b"%d\n" % offset)
                    if delay_ms:
                        time.sleep(delay_ms / 1000)
            except redis.RedisError:
                time.sleep(0.05)  # the server restarts or fails over: again
            finally:
                client.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
