"""Log lines name keys as redis-server prints strings (in double quotes,
\\xHH for unprintable bytes), never as Python's b'big'."""

from __future__ import annotations

from collections.abc import Callable

from conftest import ServerProcess


def test_recovery_log_shows_keys_as_redis_does(
    server_factory: Callable[..., ServerProcess],
) -> None:
    # Snapshots only: after kill -9 nothing proves the snapshot holds every
    # write, so the restart raises each stream to its reservation and says so
    # (a whole AOF would resume without a gap, and log nothing).
    server = server_factory(appendonly="no")
    r = server.client()
    r.execute_command("TWRITE", "big", "x")
    r.execute_command("TWRITE", b"odd key\x00\n", "y")
    r.save()
    r.execute_command("TWRITE", "big", "lost")  # after the snapshot: lost
    r.execute_command("TWRITE", b"odd key\x00\n", "lost")
    server.kill9()
    server.start()
    log = server.output()
    assert 'Stream "big": next offset raised' in log
    assert 'Stream "odd key\\x00\\n": next offset raised' in log
    assert "b'" not in log
