"""rename-command as redis-server 7 does it (issue 8, security users
expect): from redis.conf and the command line, "" disables, bad lines refuse
the start with Redis's text, and the AOF keeps original names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import RedisServer, ServerProcess, free_port, redis_cli, require, run_server

RENAMES = ["--rename-command", "CONFIG", "", "--rename-command", "SET", "XSET"]


@pytest.fixture
def renamed_redis(tmp_path: Path) -> Iterator[int]:
    """redis-server 7 with the same renames; yields its port."""
    require("redis-server")
    server = RedisServer(tmp_path / "redis", extra_args=RENAMES).start(timeout=10)
    yield server.port
    server.kill9()


SCRIPT = [
    ["CONFIG", "GET", "port"],
    ["SET", "k", "v"],
    ["set", "k", "v"],
    ["XSET", "k", "v"],
    ["xset", "k", "w"],
    ["GET", "k"],
    ["XSET", "k"],
    ["CONFIG", "SET", "maxmemory", "1"],
]


@pytest.mark.slow
def test_rename_command_on_the_command_line_answers_like_redis(
    server_factory: Callable[..., ServerProcess], renamed_redis: int
) -> None:
    srv = server_factory(extra_args=RENAMES)
    for args in SCRIPT:
        assert redis_cli(srv.port, *args) == redis_cli(renamed_redis, *args), args
    transaction = "MULTI\nXSET a 1\nGET a\nEXEC\nGET a\n"
    assert redis_cli(srv.port, stdin=transaction) == redis_cli(renamed_redis, stdin=transaction)


@pytest.mark.slow
def test_rename_command_in_redis_conf_and_the_aof_keeps_original_names(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    conf = tmp_path / "redis.conf"
    conf.write_text('rename-command SET ""\nrename-command TWRITE put\nrename-command put PUT2\n')
    srv = server_factory(conf, appendonly="yes", appendfsync="always")
    assert redis_cli(srv.port, "PUT2", "s", "a").strip() == "0"
    assert redis_cli(srv.port, "put2", "s", "b").strip() == "1"
    assert "unknown command 'TWRITE'" in redis_cli(srv.port, "TWRITE", "s", "c")
    assert "unknown command 'put'" in redis_cli(srv.port, "put", "s", "c")
    assert "unknown command 'SET'" in redis_cli(srv.port, "SET", "g", "0")
    # A group read logs its position as SET, which clients cannot call here.
    assert redis_cli(srv.port, "TREAD", "s", "0", "1", "GROUP", "g").split() == ["a"]
    # Pipelined writes under the new name (the run fast path) are logged too.
    pipeline = "".join(f"PUT2 s m{i}\n" for i in range(50))
    redis_cli(srv.port, "--pipe", stdin=pipeline)
    aof = (srv.dir / "appendonly.aof").read_bytes()
    assert b"put" not in aof.lower() and aof.lower().count(b"twrite") == 52
    srv.kill9()
    srv.start()
    assert redis_cli(srv.port, "TREAD", "s", "0", "1", "GROUP", "g").split() == ["b"]
    # 52 messages came back; a kill -9 leaves the offsets up to the stream's
    # reservation unused (docs/PROTOCOL.md section 8), so the next is >= 52.
    assert redis_cli(srv.port, "TREAD", "s", "51", "1").split() == ["m49"]
    assert int(redis_cli(srv.port, "PUT2", "s", "c")) >= 52
    # Without the renames the same AOF loads: it holds the original names.
    srv.kill9()
    srv.conf = None
    srv.start()
    assert srv.client().execute_command("TREAD", "s", "51", "1") == [b"m49"]
    assert srv.client().execute_command("TWRITE", "s", "d") >= 53
    assert srv.client().get("g") == b"2"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("rename-command nosuch x", "No such command in rename-command"),
        ("rename-command SET GET", "Target command name already exists"),
        ("rename-command SET", "Bad directive or wrong number of arguments"),
    ],
)
def test_bad_rename_command_refuses_to_start_like_redis(
    tmp_path: Path, line: str, message: str
) -> None:
    conf = tmp_path / "redis.conf"
    conf.write_text(f"port {free_port()}\n{line}\n")
    done = run_server(str(conf), cwd=tmp_path)
    assert done.returncode == 1
    assert f">>> '{line}'\n{message}" in done.stdout + done.stderr
    assert "at line 2" in done.stdout + done.stderr


def _command_answers(port: int) -> dict[str, object]:
    """What redis-cli shows for the renamed commands (COMMAND COUNT aside:
    redis-server has more commands)."""
    listed = set(redis_cli(port, "COMMAND", "LIST").split())
    return {
        "listed": {name for name in ("set", "xset", "config") if name in listed},
        "info": redis_cli(port, "COMMAND", "INFO", "set", "xset", "config").split("\n")[:3],
        "docs xset": redis_cli(port, "COMMAND", "DOCS", "xset").split("\n")[:2],
        "docs set": redis_cli(port, "COMMAND", "DOCS", "set", "config"),
        "getkeys": redis_cli(port, "COMMAND", "GETKEYS", "xset", "a", "b"),
    }


def test_command_introspection_shows_commands_as_renamed_like_redis(
    server_factory: Callable[..., ServerProcess], renamed_redis: int
) -> None:
    """COMMAND, COUNT, LIST, INFO, DOCS and GETKEYS list a disabled command
    nowhere and find a renamed one by its new name, described under its own
    name (Redis 7's fullname), as redis-server does."""
    srv = server_factory(start=False)
    srv.argv = lambda: ServerProcess.argv(srv) + RENAMES  # type: ignore[method-assign]
    srv.start()
    ours = _command_answers(srv.port)
    assert ours == _command_answers(renamed_redis)
    assert ours["listed"] == {"set"} and ours["info"] == ["", "set", "-3"]
    plain = server_factory()
    count = int(redis_cli(plain.port, "COMMAND", "COUNT"))
    assert int(redis_cli(srv.port, "COMMAND", "COUNT")) == count - 1  # CONFIG is gone
