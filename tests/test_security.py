"""Security users expect (issue 8): constant-time password checks, and no
CONFIG SET that leaves the server unreachable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from conftest import ServerProcess, redis_cli

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


def test_config_set_port_0_without_unixsocket_is_refused(
    server_factory: Callable[..., ServerProcess],
) -> None:
    srv = server_factory()
    client = srv.client()
    with pytest.raises(redis.ResponseError, match="unreachable: neither unixsocket nor tls-port"):
        client.config_set("port", "0")
    assert client.config_get("port") == {"port": str(srv.port)}
    assert srv.client().ping()


def test_config_set_port_0_with_a_unixsocket_keeps_that_way_in(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = str(tmp_path / "rcp11.sock")
    srv = server_factory(unixsocket=path)
    assert srv.client().config_set("port", "0")
    assert redis.Redis(unix_socket_path=path).ping()
