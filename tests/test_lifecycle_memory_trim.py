"""Memory freed by deleting keys goes back to the system: glibc's malloc
keeps it for reuse, and a server whose keys were all deleted stayed at
405 MB RSS (45 MB empty) while used_memory said 24 KB. The cron trims the
heap after large frees (rcp11/server/trim.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import wait_for


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["DEL", "FLUSHALL"])
def test_rss_falls_back_after_every_key_is_deleted(server_factory, how: str) -> None:
    server = server_factory(save="")
    r = server.client()
    empty = rss_mb(server.proc.pid)
    messages = [b"x" * (200 + i % 300) for i in range(100)]
    keys = [f"k{n}" for n in range(120)]
    for key in keys:
        pipe = r.pipeline(transaction=False)
        for _ in range(40):
            pipe.execute_command("TWRITE", key, "ENTRIES", *messages)
        pipe.execute()
    full = rss_mb(server.proc.pid)
    assert full - empty > 100, (empty, full)  # the data really took memory
    if how == "DEL":
        for start in range(0, len(keys), 10):
            r.delete(*keys[start : start + 10])
    else:
        r.flushall()
    assert r.info("memory")["used_memory"] < 1 << 20
    bound = empty + 0.25 * (full - empty)
    # The cron trims within a tick or two of the frees (hz 10).
    wait_for(lambda: rss_mb(server.proc.pid) < bound, timeout=20)
