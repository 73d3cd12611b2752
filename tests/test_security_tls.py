"""TLS as redis-server 7 does it: tls-port beside (or instead of) port,
certificates from tls-cert-file / tls-key-file, client certificates checked
against tls-ca-cert-file per tls-auth-clients. The test makes its own CA and
certificates with the openssl CLI and connects with redis-cli --tls and
redis-py ssl=True."""

from __future__ import annotations

import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import ServerProcess, free_port, require, wait_for


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(name: str, cn: str, ext: str, cwd: Path) -> None:
    openssl(
        "req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=cwd,
    )  # fmt: skip
    (cwd / f"{name}.ext").write_text(ext)
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt, server.crt/.key (localhost, 127.0.0.1), client.crt/.key, a
    passphrase-protected copy of the server key, and a CA nobody uses."""
    require("openssl")
    d = tmp_path_factory.mktemp("certs")
    for ca in ("ca", "other-ca"):
        openssl(
            "req", "-x509", "-new", "-nodes", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", f"{ca}.key",
            "-out", f"{ca}.crt", "-days", "2", "-subj", f"/CN=rcp11 test {ca}", cwd=d,
        )  # fmt: skip
    _signed("server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\n", d)
    _signed("client", "client", "extendedKeyUsage=clientAuth\n", d)
    openssl(
        "pkey", "-in", "server.key", "-aes256", "-passout", "pass:s3cret",
        "-out", "server-pass.key", cwd=d,
    )  # fmt: skip
    return d


def tls_server(
    factory_dir: Path, certs: Path, tcp: bool = True, **directives: object
) -> ServerProcess:
    tls_port = free_port()
    settings: dict[str, object] = {
        "tls_port": tls_port,
        "tls_cert_file": certs / "server.crt",
        "tls_key_file": certs / "server.key",
        "tls_ca_cert_file": certs / "ca.crt",
    }
    settings.update(directives)
    srv = ServerProcess(factory_dir, **settings)
    srv.tls_port = tls_port  # type: ignore[attr-defined]
    if not tcp:
        srv.directives["port"] = "0"  # after --port in argv: TLS only
    return srv


def tls_client(srv: ServerProcess, certs: Path, cert: bool = True, **kwargs: object) -> redis.Redis:
    extra: dict[str, object] = {}
    if cert:
        extra = {
            "ssl_certfile": str(certs / "client.crt"),
            "ssl_keyfile": str(certs / "client.key"),
        }
    extra.update(kwargs)
    return redis.Redis(
        host="localhost",
        port=srv.tls_port,  # type: ignore[attr-defined]
        ssl=True,
        ssl_ca_certs=str(certs / "ca.crt"),
        socket_timeout=10,
        **extra,
    )


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    servers: list[ServerProcess] = []
    yield servers
    for srv in servers:
        srv.kill9()


def start_tls(srv: ServerProcess, certs: Path, started: list[ServerProcess]) -> ServerProcess:
    started.append(srv)
    srv.start(wait=False)

    def answers() -> bool:
        assert srv.proc is not None and srv.proc.poll() is None, srv.output()
        try:
            return bool(tls_client(srv, certs).ping())
        except redis.exceptions.ConnectionError:
            return False

    assert wait_for(answers, 20), srv.output()
    return srv


def redis_cli(
    srv: ServerProcess, certs: Path, *args: str, cert: bool = True
) -> subprocess.CompletedProcess:
    require("redis-cli")
    tls = ["--tls", "--cacert", str(certs / "ca.crt")]
    if cert:
        tls += ["--cert", str(certs / "client.crt"), "--key", str(certs / "client.key")]
    return subprocess.run(
        ["redis-cli", "-h", "localhost", "-p", str(srv.tls_port), *tls, *args],  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.slow
def test_tls_beside_tcp_with_client_certificates(
    tmp_path: Path, certs: Path, started: list[ServerProcess]
) -> None:
    srv = start_tls(tls_server(tmp_path / "a", certs), certs, started)
    secure = tls_client(srv, certs)
    assert secure.execute_command("TWRITE", "s", "over tls") == 0
    # The same data through the plain TCP port, and back through TLS.
    plain = srv.client()
    assert plain.execute_command("TWRITE", "s", "over tcp") == 1
    assert secure.execute_command("TREAD", "s", 0, 10) == [b"over tls", b"over tcp"]

    done = redis_cli(srv, certs, "TREAD", "s", "0", "10")
    assert done.returncode == 0 and done.stdout.split() == ["over", "tls", "over", "tcp"], done
    assert redis_cli(srv, certs, "PING").stdout.strip() == "PONG"

    # tls-auth-clients yes (the default): no certificate, no connection.
    with pytest.raises(redis.exceptions.ConnectionError):
        tls_client(srv, certs, cert=False).ping()
    refused = redis_cli(srv, certs, "PING", cert=False)
    assert "PONG" not in refused.stdout
    # A certificate from another CA is refused as well.
    with pytest.raises(redis.exceptions.ConnectionError):
        tls_client(
            srv,
            certs,
            cert=False,
            ssl_certfile=str(certs / "other-ca.crt"),
            ssl_keyfile=str(certs / "other-ca.key"),
        ).ping()

    shown = plain.config_get("tls-*")
    assert shown["tls-port"] == str(srv.tls_port)  # type: ignore[attr-defined]
    assert shown["tls-cert-file"] == str(certs / "server.crt")
    assert shown["tls-ca-cert-file"] == str(certs / "ca.crt")
    assert shown["tls-auth-clients"] == "yes"
    assert plain.info("server")["tls_port"] == srv.tls_port  # type: ignore[attr-defined]
    # The server keeps serving plain clients after the refused handshakes.
    assert plain.ping() and secure.ping()

    # CONFIG SET port 0 is allowed while the TLS port still reaches it.
    assert plain.config_set("port", 0)
    assert secure.execute_command("TREAD", "s", 0, 10) == [b"over tls", b"over tcp"]


@pytest.mark.slow
def test_tls_only_with_optional_client_auth_and_a_protected_key(
    tmp_path: Path, certs: Path, started: list[ServerProcess]
) -> None:
    srv = tls_server(
        tmp_path / "b",
        certs,
        tcp=False,
        tls_key_file=certs / "server-pass.key",
        tls_key_file_pass="s3cret",
        tls_auth_clients="optional",
        tls_protocols="TLSv1.3",
    )
    start_tls(srv, certs, started)
    # optional: no certificate is fine, a good one too.
    anonymous = tls_client(srv, certs, cert=False)
    assert anonymous.execute_command("TWRITE", "t", "x") == 0
    assert tls_client(srv, certs).execute_command("TREAD", "t", 0, 1) == [b"x"]
    assert redis_cli(srv, certs, "TREAD", "t", "0", "1", cert=False).stdout.strip() == "x"
    # port 0: nothing listens on the TCP port; plain text to the TLS port
    # gets no reply.
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis(port=srv.port, socket_timeout=5).ping()
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        redis.Redis(port=srv.tls_port, socket_timeout=5).ping()  # type: ignore[attr-defined]
    # tls-protocols TLSv1.3: a TLS 1.2-only client is refused.
    with pytest.raises(ssl.SSLError):
        _tls12_only_ping(srv, certs)
    assert anonymous.config_get("tls-auth-clients") == {"tls-auth-clients": "optional"}


def _tls12_only_ping(srv: ServerProcess, certs: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    port = srv.tls_port  # type: ignore[attr-defined]
    with socket.create_connection(("localhost", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"PING\r\n")
            return s.recv(64)


@pytest.mark.slow
@pytest.mark.parametrize(
    "directive, bad",
    [
        ("tls_cert_file", "missing/server.crt"),
        ("tls_key_file", "missing/server.key"),
        ("tls_ca_cert_file", "missing/ca.crt"),
    ],
)
def test_a_bad_certificate_path_refuses_start_up_naming_the_file(
    tmp_path: Path, certs: Path, directive: str, bad: str
) -> None:
    path = tmp_path / bad
    srv = tls_server(tmp_path / "c", certs, **{directive: path})
    srv.start(wait=False)
    assert srv.proc is not None
    assert srv.proc.wait(30) != 0
    output = srv.output()
    assert str(path) in output and directive.replace("_", "-") in output, output


@pytest.mark.slow
def test_client_auth_without_a_ca_and_a_bad_key_passphrase_refuse_start_up(
    tmp_path: Path, certs: Path
) -> None:
    srv = tls_server(tmp_path / "d", certs, tls_ca_cert_file="")
    srv.start(wait=False)
    assert srv.proc is not None and srv.proc.wait(30) != 0
    assert "tls-ca-cert-file" in srv.output()
    srv = tls_server(
        tmp_path / "e", certs, tls_key_file=certs / "server-pass.key", tls_key_file_pass="wrong"
    )
    srv.start(wait=False)
    assert srv.proc is not None and srv.proc.wait(30) != 0
    assert "server-pass.key" in srv.output()
