"""Who may connect (Redis's acceptCommonHandler: maxclients, then protected
mode) and the ClientState of who does: its addresses as CLIENT LIST and
MONITOR show them, its descriptor, whether it must authenticate."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rcp11 import errors
from rcp11.logs import VERBOSE
from rcp11.resp import Error, encode
from rcp11.state import ClientState, ServerState

log = logging.getLogger("rcp11")

# The local end of these addresses is the machine itself; protected mode
# accepts only them (and unix sockets) while no password is set.
_LOOPBACK = ("127.0.0.1", "::1")

# Refusals written before a connection becomes a client.
DENIED = encode(Error(errors.DENIED), False)
MAX_CLIENTS = encode(Error(errors.MAX_CLIENTS), False)


def admit(
    state: ServerState, transport: asyncio.BaseTransport, unix_path: str | None
) -> ClientState | None:
    """A new client for this transport, not registered yet; or None when
    the connection is refused (the refusal is written and the transport
    closed, as Redis does)."""
    config = state.config
    state.stats.total_connections_received += 1
    peer = transport.get_extra_info("peername")
    loopback = isinstance(peer, tuple) and peer[0] in _LOOPBACK
    refusal = None
    if len(state.clients) >= config.get("maxclients"):
        log.log(VERBOSE, "Error registering client: max number of clients reached")
        refusal = MAX_CLIENTS
    elif (
        unix_path is None
        and config.get("protected-mode")
        and not config.get("requirepass")
        and not loopback
    ):
        refusal = DENIED
    if refusal is not None:
        state.stats.rejected_connections += 1
        transport.write(refusal)  # type: ignore[attr-defined]
        transport.close()
        return None
    client = ClientState()
    client.addr = _format_addr(peer, unix_path)
    client.local = unix_path is not None or loopback
    client.laddr = _format_addr(transport.get_extra_info("sockname"), unix_path)
    sock = transport.get_extra_info("socket")
    client.fd = sock.fileno() if sock is not None else -1
    client.authenticated = not config.get("requirepass")
    client.unix_path = unix_path or ""
    return client


def _format_addr(sockaddr: Any, unix_path: str | None) -> str:
    if unix_path is not None:
        return f"{unix_path}:0"
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        host = sockaddr[0]
        if ":" in host:
            return f"[{host}]:{sockaddr[1]}"
        return f"{host}:{sockaddr[1]}"
    return "?"
