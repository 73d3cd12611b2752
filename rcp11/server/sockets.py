"""Listening sockets, bound before the data loads (as redis-server: a port
in use is reported at once) and by CONFIG SET port/bind: the TCP addresses
a bind list means, and the unix socket."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from typing import Any

from rcp11.logs import VERBOSE

log = logging.getLogger("rcp11")


def bind_tcp_addresses(
    binds: list[str], port: int, keep: dict[tuple[str, int], Any]
) -> tuple[set[tuple[str, int]], dict[tuple[str, int], socket.socket]]:
    """Every (address, port) the bind list means, and listening sockets
    for those not in keep, bound now (so a failure is known at once).
    Raises OSError, after closing what it bound, when a required
    address fails."""
    wanted: set[tuple[str, int]] = set()
    bound: dict[tuple[str, int], socket.socket] = {}
    try:
        for entry in binds:
            optional = entry.startswith("-")
            host = entry[1:] if optional else entry
            host = {"*": "0.0.0.0", "::*": "::"}.get(host, host)
            try:
                infos = socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )
                for family, kind, proto, _name, sockaddr in infos:
                    address = (sockaddr[0], port)
                    wanted.add(address)
                    if address in keep or address in bound:
                        continue
                    sock = socket.socket(family, kind, proto)
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        if family == socket.AF_INET6:
                            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                        sock.bind(sockaddr)
                        sock.listen(511)
                        sock.setblocking(False)
                    except OSError:
                        sock.close()
                        raise
                    bound[address] = sock
            except (OSError, UnicodeError) as exc:
                errno_ = getattr(exc, "errno", None)
                if optional and errno_ in (
                    errno.EADDRNOTAVAIL,
                    errno.EAFNOSUPPORT,
                    errno.EPROTONOSUPPORT,
                    None,
                ):
                    log.log(VERBOSE, "Skipping optional bind address %s: %s", host, exc)
                    continue
                log.warning(
                    "Warning: Could not create server TCP listening socket %s:%d: %s",
                    host,
                    port,
                    getattr(exc, "strerror", None) or exc,
                )
                raise OSError(errno_, f"cannot listen on {host}:{port}") from exc
    except OSError:
        for sock in bound.values():
            sock.close()
        raise
    return wanted, bound


def bind_unix_socket(path: str, perm: int) -> socket.socket:
    """A listening unix socket at path (mode perm unless 0). A socket file
    that a live server answers on is not taken over; a stale one is
    replaced. Raises SystemExit with redis-server's wording."""
    if unix_socket_answers(path):
        raise SystemExit(f"Failed opening Unix socket: {path}: Address already in use")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(511)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise SystemExit(f"Failed opening Unix socket: {exc}") from exc
    if perm:
        os.chmod(path, perm)
    return sock


def unix_socket_answers(path: str) -> bool:
    """Whether a server listens on the unix socket at path (a stale socket
    file left by a dead server refuses the connection)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True
