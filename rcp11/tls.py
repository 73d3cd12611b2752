"""TLS listeners, configured as redis-server 7 configures them.

    tls-port 6380                  # 0 (default): no TLS listener
    tls-cert-file server.crt       # the server's certificate (PEM, chain allowed)
    tls-key-file server.key        # its private key (PEM)
    tls-key-file-pass secret       # the key's passphrase, if it has one
    tls-ca-cert-file ca.crt        # CAs that client certificates must chain to
    tls-auth-clients yes           # yes: a client certificate is required,
                                   # optional: checked if sent, no: not asked
    tls-protocols "TLSv1.2 TLSv1.3"

The TLS listener binds the same `bind` addresses as the TCP one (bind() at
start-up, before the data loads; Bound.serve() after) and serves
the same protocol through the same Connection class: the standard library's
ssl does the handshake inside the event loop (uvloop supports it), so a
connection is a plain stream once the handshake is done. `port 0` with a
tls-port gives a TLS-only server.

A certificate, key or CA file that cannot be loaded refuses start-up with
its directive and path named, as Redis does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from rcp11.config import Config, ConfigError

log = logging.getLogger("rcp11")

_PROTOCOLS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}
_VERIFY = {"yes": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "no": ssl.CERT_NONE}


class TLSConfigError(Exception):
    """The TLS settings cannot make a working context; the message names
    the directive and file."""


def make_context(config: Config) -> ssl.SSLContext:
    """A server-side SSLContext from the tls-* directives."""
    cert, key = config.get("tls-cert-file"), config.get("tls-key-file")
    if not cert or not key:
        raise TLSConfigError("tls-port is set but tls-cert-file or tls-key-file is not")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    low, high = _protocol_range(config.get("tls-protocols"))
    context.minimum_version, context.maximum_version = low, high
    password = config.get("tls-key-file-pass") or None
    try:
        context.load_cert_chain(cert, key, password)
    except (OSError, ssl.SSLError) as exc:
        # load_cert_chain does not say which of the two files failed.
        for name, path in (("tls-cert-file", cert), ("tls-key-file", key)):
            _check_readable(name, path)
        raise TLSConfigError(
            f"Failed to load certificate '{cert}' with private key '{key}': {_reason(exc)}"
        ) from None
    ca = config.get("tls-ca-cert-file")
    auth = config.get("tls-auth-clients")
    if ca:
        _check_readable("tls-ca-cert-file", ca)
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(
                f"Failed to load tls-ca-cert-file '{ca}': {_reason(exc)}"
            ) from None
    elif auth != "no":
        raise TLSConfigError(
            "Either tls-ca-cert-file must be specified when tls-auth-clients is enabled!"
        )
    context.verify_mode = _VERIFY[auth]
    return context


def _protocol_range(text: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    names = text.lower().split() if text else list(_PROTOCOLS)
    versions = []
    for name in names:
        if name not in _PROTOCOLS:
            raise TLSConfigError(
                f"tls-protocols: unsupported protocol '{name}' (TLSv1.2 and TLSv1.3 are)"
            )
        versions.append(_PROTOCOLS[name])
    return min(versions), max(versions)


def _check_readable(directive: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TLSConfigError(f"Failed to load {directive} '{path}': {exc.strerror}") from None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)


class Bound:
    """TLS listening sockets bound at start-up, served once loading is done
    (the same order as the TCP ones: a port in use is reported at once)."""

    def __init__(self, context: ssl.SSLContext, sockets: list[socket.socket], port: int) -> None:
        self.context = context
        self.sockets = sockets
        self.port = port

    async def serve(
        self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], asyncio.Protocol]
    ) -> list[asyncio.AbstractServer]:
        """Accept on the bound sockets; protocol makes each connection's
        protocol object (the server's Connection). The listeners made."""
        listeners = [
            await loop.create_server(protocol, sock=sock, backlog=511, ssl=self.context)
            for sock in self.sockets
        ]
        self.sockets = []
        log.info("Ready to accept connections tls (port %d)", self.port)
        return listeners


# How the server binds TCP: (bind addresses, port) -> listening sockets by
# address; raises OSError.
BindTCP = Callable[[list[str], int], dict[Any, socket.socket]]


def bind(config: Config, bind_tcp: BindTCP) -> Bound | None:
    """Build the context and bind tls-port on the bind addresses (None when
    tls-port is 0). Raises SystemExit with Redis's wording when it cannot."""
    port = config.get("tls-port")
    if not port:
        return None
    try:
        context = make_context(config)
    except TLSConfigError as exc:
        raise SystemExit(f"Failed to configure TLS: {exc}") from None
    config.on_change("tls-auth-clients", lambda value: _set_verify(config, context, value))
    try:
        sockets = bind_tcp(config.get("bind"), port)
    except OSError as exc:
        raise SystemExit(f"Failed listening on port {port} (tls), aborting.") from exc
    if not sockets:
        raise SystemExit(f"Failed listening on port {port} (tls), aborting.")
    return Bound(context, list(sockets.values()), port)


def _set_verify(config: Config, context: ssl.SSLContext, value: Any) -> None:
    # Takes effect for handshakes from now on, as in Redis.
    if value != "no" and not config.get("tls-ca-cert-file"):
        raise ConfigError("tls-auth-clients needs tls-ca-cert-file")
    context.verify_mode = _VERIFY[value]
