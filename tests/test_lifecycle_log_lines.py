"""Log lines name keys as redis-server prints strings (in double quotes,
\\xHH for unprintable bytes), never as Python's b'big'."""

from __future__ import annotations

from collections.abc import Callable

from conftest import ServerProcess


def test_recovery_log_shows_keys_as_redis_does(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(appendonly="yes", appendfsync="always")
    r = server.client()
    r.execute_command("TWRITE", "big", "x")
    r.execute_command("TWRITE", b"odd key\x00\n", "y")
    server.kill9()  # the restart raises each stream to its reservation and says so
    server.start()
    log = server.output()
    assert 'Stream "big": next offset raised' in log
    assert 'Stream "odd key\\x00\\n": next offset raised' in log
    assert "b'" not in log
