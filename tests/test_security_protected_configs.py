"""Protected configs, as redis-server 7: `dir` and `dbfilename` decide where
SAVE writes, so CONFIG SET refuses them unless enable-protected-configs
allows it (`no` by default, `yes`, or `local`: loopback and unix socket
clients only); appendfilename, logfile, pidfile, unixsocket(perm),
daemonize and enable-protected-configs itself can never change at run time.
(Before: CONFIG SET dir /any/dir + CONFIG SET dbfilename authorized_keys +
SAVE wrote a file anywhere, and CONFIG SET dir alone created
dump.rcp.offsets there.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis
from conftest import RawClient, mbulk, require

from rcp11.config import Config, ConfigError


def protected_error(name: str) -> str:
    return f"ERR CONFIG SET failed (possibly related to argument '{name}') - can't set protected config"


@pytest.mark.parametrize("name", ["dir", "dbfilename"])
def test_protected_directives_by_mode(tmp_path: Path, name: str) -> None:
    value = str(tmp_path) if name == "dir" else "other.rcp"
    config = Config()
    assert config.get("enable-protected-configs") == "no"
    for local in (True, False):
        with pytest.raises(ConfigError) as info:
            config.set_many([(name, value)], protected_ok=config.protected_allowed(local))
        assert info.value.message == protected_error(name)
    config = Config()
    config.apply_args(["--enable-protected-configs", "local"])
    assert not config.protected_allowed(False)
    assert config.protected_allowed(True)
    config.set_many([(name, value)], protected_ok=config.protected_allowed(True))
    config = Config()
    config.apply_args(["--enable-protected-configs", "yes"])
    assert config.protected_allowed(False)


@pytest.mark.parametrize(
    "name",
    [
        "appendfilename",
        "logfile",
        "pidfile",
        "unixsocket",
        "unixsocketperm",
        "daemonize",
        "enable-protected-configs",
    ],
)
def test_other_file_directives_are_immutable(name: str) -> None:
    config = Config()
    config.apply_args(["--enable-protected-configs", "yes"])
    value = {"daemonize": "no", "unixsocketperm": "700", "enable-protected-configs": "no"}
    with pytest.raises(ConfigError) as info:
        config.set_many([(name, value.get(name, "x"))], protected_ok=True)
    assert info.value.message == (
        f"ERR CONFIG SET failed (possibly related to argument '{name}') - can't set immutable config"
    )


def test_a_refused_directive_refuses_the_whole_set() -> None:
    config = Config()
    with pytest.raises(ConfigError):
        config.set_many([("hz", "50"), ("dir", "/tmp")], protected_ok=False)
    assert config.get("hz") == 10


# ---------------------------------------------------------------------------
# Through a real server: redis-py, redis-cli, a non-local client
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_issue_reproduction_writes_nothing_elsewhere(server_factory, tmp_path: Path) -> None:
    srv = server_factory()
    client = srv.client()
    client.execute_command("TWRITE", "s", "a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(redis.ResponseError, match="can't set protected config"):
        client.config_set("dir", str(elsewhere))
    with pytest.raises(redis.ResponseError, match="can't set protected config"):
        client.config_set("dbfilename", "authorized_keys")
    with pytest.raises(redis.ResponseError, match="can't set protected config"):
        client.execute_command("CONFIG", "SET", "hz", "20", "dir", str(elsewhere))
    assert client.config_get("hz") == {"hz": "10"}
    assert client.save()
    assert list(elsewhere.iterdir()) == []
    assert not (srv.dir / "authorized_keys").exists()
    assert client.config_get("dir")["dir"] == str(srv.dir)
    assert client.config_get("enable-protected-configs") == {"enable-protected-configs": "no"}


def test_redis_cli_gets_redis_error_text(server_factory) -> None:
    require("redis-cli")
    srv = server_factory()
    done = subprocess.run(
        ["redis-cli", "-p", str(srv.port), "CONFIG", "SET", "dir", "/tmp"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.stdout.strip() == protected_error("dir")


@pytest.mark.slow
def test_enabled_protected_configs_allow_moving_the_snapshot(
    server_factory, tmp_path: Path
) -> None:
    srv = server_factory(enable_protected_configs="yes")
    client = srv.client()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert client.config_set("dir", str(elsewhere))
    assert client.config_set("dbfilename", "moved.rcp")
    assert client.save()
    assert (elsewhere / "moved.rcp").exists()


def _raw_command(port: int, source: str, *args: bytes) -> bytes:
    with RawClient(port, source=source) as raw:
        raw.send(mbulk(*args))
        return raw.read_until(b"\r\n")


@pytest.mark.slow
def test_local_mode_allows_loopback_and_unix_socket_only(server_factory, tmp_path: Path) -> None:
    sock_path = tmp_path / "rcp11.sock"
    srv = server_factory(
        enable_protected_configs="local",
        protected_mode="no",  # so a client from 127.0.0.2 may connect at all
        unixsocket=str(sock_path),
    )
    # 127.0.0.2 is a loopback-network address but not 127.0.0.1: redis-server's
    # islocalClient() counts only 127.0.0.1, ::1 and unix sockets as local.
    reply = _raw_command(srv.port, "127.0.0.2", b"CONFIG", b"SET", b"dbfilename", b"x.rcp")
    assert reply == b"-" + protected_error("dbfilename").encode() + b"\r\n"
    assert srv.client().config_set("dbfilename", "from-loopback.rcp")
    unix = redis.Redis(unix_socket_path=str(sock_path))
    assert unix.config_set("dbfilename", "from-unix.rcp")
    assert unix.config_get("dbfilename") == {"dbfilename": "from-unix.rcp"}
    unix.close()
