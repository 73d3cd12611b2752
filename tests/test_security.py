"""Security users expect (docs/PROTOCOL.md section 7): AUTH and requirepass
(what a client may do before AUTH, byte for byte as redis-server answers),
protected mode and the default loopback bind, constant-time password
checks, and no CONFIG SET that leaves the server unreachable. TLS,
rename-command and protected configs have their own test_security_*.py."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import (
    RawClient,
    ServerProcess,
    exchange,
    mbulk,
    redis_cli,
    require,
    tw,
)
from redis.backoff import NoBackoff
from redis.retry import Retry

from rcp11.commands import connection, execute
from rcp11.config import Config
from rcp11.resp import Error
from rcp11.state import ClientState, ServerState

# -- AUTH --------------------------------------------------------------------------


def test_password_checks_compare_equal_length_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    real = connection.hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(connection.hmac, "compare_digest", recording)
    config = Config()
    config.set("requirepass", "s3cret-\u00e9")
    state = ServerState(config)
    client = ClientState()
    for guess in (b"", b"x", b"s3cret-", b"s3cret-\xc3\xa9" * 50):
        assert type(execute(state, client, [b"AUTH", guess])) is Error
    assert execute(state, client, [b"HELLO", b"3", b"AUTH", b"default", b"nope"]) == Error(
        "WRONGPASS invalid username-password pair or user is disabled."
    )
    assert not client.authenticated
    assert execute(state, client, [b"AUTH", "s3cret-\u00e9".encode()]) == "OK"
    assert client.authenticated
    # Whatever the guess's length, the secret is compared as a 32-byte digest.
    assert seen and all(lengths == (32, 32) for lengths in seen)


@pytest.mark.slow
def test_auth_and_hello_auth_with_a_password(
    server_factory: Callable[..., ServerProcess],
) -> None:
    srv = server_factory(requirepass="pw")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=srv.port, password="wrong").ping()
    assert redis.Redis(port=srv.port, password="pw").ping()
    assert redis.Redis(port=srv.port, password="pw", protocol=3).ping()
    assert "WRONGPASS" in redis_cli(srv.port, "HELLO", "3", "AUTH", "default", "pwx")
    assert "NOAUTH" in redis_cli(srv.port, "GET", "k")


# -- CONFIG SET port 0 ---------------------------------------------------------------


@pytest.mark.slow
def test_config_set_port_0_without_unixsocket_is_refused(
    server_factory: Callable[..., ServerProcess],
) -> None:
    srv = server_factory()
    client = srv.client()
    with pytest.raises(redis.ResponseError, match="unreachable: neither unixsocket nor tls-port"):
        client.config_set("port", "0")
    assert client.config_get("port") == {"port": str(srv.port)}
    assert srv.client().ping()


@pytest.mark.slow
def test_config_set_port_0_with_a_unixsocket_keeps_that_way_in(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = str(tmp_path / "rcp11.sock")
    srv = server_factory(unixsocket=path)
    assert srv.client().config_set("port", "0")
    assert redis.Redis(unix_socket_path=path).ping()


# ----------------------------------------------------------------- passwords


@pytest.mark.slow
def test_requirepass_noauth(server_factory: Any) -> None:
    srv = server_factory(requirepass="pw")
    out = exchange(srv.port, b"TWRITE s x\r\nPING\r\nAUTH pw\r\nPING\r\n", lines=4)
    assert out == (
        b"-NOAUTH Authentication required.\r\n-NOAUTH Authentication required.\r\n+OK\r\n+PONG\r\n"
    )


@pytest.mark.slow
def test_requirepass_limits_what_comes_before_auth(server_factory) -> None:
    srv = server_factory(requirepass="s3cret")
    conn = RawClient(srv.port)
    conn.send(mbulk(b"TWRITE", b"a", b"b"))
    assert str(conn.reply()).startswith("NOAUTH")
    conn.send(mbulk(b"AUTH", b"wrong"))
    assert str(conn.reply()).startswith("WRONGPASS")
    # AUTH and a command too big for an unauthenticated client, in one write:
    # the second is parsed after AUTH succeeded, as Redis does.
    conn.send(mbulk(b"AUTH", b"s3cret") + mbulk(b"TWRITE", b"a", b"ENTRIES", *[b"m"] * 20))
    assert conn.reply() == b"OK"
    assert conn.reply() == 0
    # Before AUTH a client cannot make the server buffer big requests.
    stranger = RawClient(srv.port)
    stranger.send(b"*100\r\n")
    assert "unauthenticated multibulk length" in str(stranger.reply())
    assert stranger.closed()


def test_requirepass_replies_byte_for_byte(server_factory: Any) -> None:
    srv = server_factory(requirepass="s3cret")
    conn = RawClient(srv.port)
    try:
        assert conn.call("PING") == b"-NOAUTH Authentication required.\r\n"
        assert conn.call("TWRITE", "s", "x") == b"-NOAUTH Authentication required.\r\n"
        assert conn.call("HELLO", "3").startswith(b"-NOAUTH HELLO must be called")
        assert conn.call("AUTH", "wrong").startswith(b"-WRONGPASS")
        assert conn.call("AUTH", "default", "wrong").startswith(b"-WRONGPASS")
        assert conn.call("AUTH", "s3cret") == b"+OK\r\n"
        assert conn.call("TWRITE", "s", "x") == b":0\r\n"
        assert conn.call("RESET") == b"+RESET\r\n"
        assert conn.call("GET", "s") == b"-NOAUTH Authentication required.\r\n"
        assert conn.call("HELLO", "3", "AUTH", "default", "s3cret").startswith(b"%7\r\n")
    finally:
        conn.close()
    client = srv.client(password="s3cret", protocol=3)
    assert client.execute_command("TREAD", "s", 0, 1) == [b"x"]
    client.close()


def test_requirepass_flows(server_factory: Any) -> None:
    srv = server_factory(requirepass="s3cret")
    good = srv.client(protocol=3, password="s3cret")
    assert tw(good, "s", "a") == 0
    with pytest.raises(redis.AuthenticationError):
        srv.client(password="wrong", retry=Retry(NoBackoff(), 0)).ping()
    with srv.raw() as raw:
        raw.send(
            mbulk("HELLO", "3")
            + mbulk("HELLO", "3", "AUTH", "default", "s3cret")
            + mbulk("TREAD", "s", "0", "1")
            + mbulk("RESET")
            + mbulk("TREAD", "s", "0", "1")
            + mbulk("AUTH", "s3cret")
            + mbulk("QUIT"),
        )
        out = raw.read_until_closed()

    assert out.startswith(b"-NOAUTH HELLO must be called with the client already authenticated")
    assert b"*1\r\n$1\r\na\r\n+RESET\r\n-NOAUTH Authentication required.\r\n+OK\r\n+OK\r\n" in out
    good.config_set("requirepass", "other")
    assert good.ping()  # an authenticated connection stays authenticated
    with pytest.raises(redis.AuthenticationError):
        srv.client(password="s3cret", retry=Retry(NoBackoff(), 0)).ping()
    assert srv.client(password="other").ping()
    require("redis-cli")  # the redis-cli half: skipped only outside CI
    cli = ["redis-cli", "-p", str(srv.port), "--no-auth-warning"]
    out = subprocess.run([*cli, "-a", "other", "TWRITE", "s", "b"], capture_output=True, text=True)
    assert out.stdout.strip() == "1"
    out = subprocess.run([*cli, "TREAD", "s", "0", "5"], capture_output=True, text=True)
    assert "NOAUTH" in out.stdout + out.stderr


def test_pipelined_twrites_before_auth_are_all_refused(server_factory: Any) -> None:
    srv = server_factory(requirepass="pw")
    cmds = [["TWRITE", "s", "a"], ["TWRITE", "s", "b"], ["AUTH", "pw"], ["TWRITE", "s", "c"]]
    cmds += [["TWRITE", "s", "d"], ["RESET"], ["TWRITE", "s", "e"], ["TWRITE", "s", "f"]]
    out = exchange(
        srv.port,
        b"".join(mbulk(*cmd) for cmd in cmds),
        until=b"+RESET\r\n" + b"-NOAUTH Authentication required.\r\n" * 2,
    )
    noauth = b"-NOAUTH Authentication required.\r\n"
    assert out == noauth * 2 + b"+OK\r\n:0\r\n:1\r\n+RESET\r\n" + noauth * 2


# --------------------------------------------------- protected mode and bind


@pytest.mark.slow
def test_protected_mode_refuses_non_loopback(server_factory) -> None:
    # 127.0.0.2 is not "local" for protected mode: only 127.0.0.1, ::1 and
    # unix sockets are.
    srv = server_factory(bind="127.0.0.1 127.0.0.2")
    outsider = RawClient(srv.port, host="127.0.0.2", source="127.0.0.2")
    error = str(outsider.reply())
    assert error.startswith("DENIED Redis is running in protected mode")
    assert outsider.closed()
    local = RawClient(srv.port)
    local.send(mbulk(b"PING"))
    assert local.reply() == b"PONG"
    srv.client().config_set("requirepass", "pw")
    allowed = RawClient(srv.port, host="127.0.0.2", source="127.0.0.2")
    allowed.send(mbulk(b"AUTH", b"pw") + mbulk(b"PING"))
    assert allowed.reply() == b"OK"
    assert allowed.reply() == b"PONG"


@pytest.mark.slow
def test_protected_mode_off(server_factory) -> None:
    srv = server_factory(bind="127.0.0.1 127.0.0.2", protected_mode="no")
    outsider = RawClient(srv.port, host="127.0.0.2", source="127.0.0.2")
    outsider.send(mbulk(b"PING"))
    assert outsider.reply() == b"PONG"


def _non_loopback_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))  # no packet is sent for UDP connect
            ip = probe.getsockname()[0]
        except OSError:
            ip = ""
    if not ip or ip.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address to test from")
    return ip


def test_default_bind_is_loopback_only(shared_server: ServerProcess) -> None:
    ip = _non_loopback_ip()
    with pytest.raises(OSError):
        socket.create_connection((ip, shared_server.port), timeout=2).close()


@pytest.mark.slow
def test_protected_mode_denies_outside_clients_without_password(server_factory: Any) -> None:
    ip = _non_loopback_ip()
    srv = server_factory(bind="* -::*")
    reply = exchange(srv.port, b"PING\r\n", lines=1, timeout=3)
    assert reply == b"+PONG\r\n"  # loopback is fine
    with RawClient(srv.port, ip, timeout=3) as outsider:
        outsider.send(b"PING\r\n", ignore_closed=True)
        out = outsider.read_until_closed()
    assert out.startswith(b"-DENIED Redis is running in protected mode")
    admin = srv.client()
    admin.config_set("requirepass", "pw")  # with a password, outside clients may try
    answer = exchange(srv.port, b"PING\r\nAUTH pw\r\nPING\r\n", host=ip, lines=3, timeout=3)
    assert answer == b"-NOAUTH Authentication required.\r\n+OK\r\n+PONG\r\n"
    admin.config_set("requirepass", "")
    admin.config_set("protected-mode", "no")
    assert exchange(srv.port, b"PING\r\n", host=ip, lines=1, timeout=3) == b"+PONG\r\n"
