"""The sockets `relay serve` listens on, bound before anything else starts.

A port that is taken, a host that does not resolve or is not this machine's is then one line
at once, before the database is opened, URLs are printed or the worker and the writer process
start (uvicorn binds its port only after the app's start, and then logs the error and stops).
The sockets are handed to uvicorn, which serves them all with one app and one connection guard.
They are bound but not listening until uvicorn serves them, so that connections are refused
meanwhile, as before: a connection accepted while the app starts would pass a TCP health check.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from relay.settings import Settings, SettingsError, check_host

HIGHEST_PORT = 65535
REASONS = {
    errno.EADDRINUSE: "address already in use",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


def url_host(host: str) -> str:
    """``host`` as written in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class Listener:
    """The sockets bound for one host and port: one per address the host resolves to."""

    host: str
    port: int
    """The port bound: the one asked for, or the one the system chose for 0."""
    sockets: tuple[socket.socket, ...]

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"


@dataclass(frozen=True)
class Listeners:
    """The public listener (the platform's) and, with ``admin_port``, the admin one."""

    public: Listener
    admin: Listener | None

    @property
    def sockets(self) -> list[socket.socket]:
        admin = self.admin.sockets if self.admin is not None else ()
        return [*self.public.sockets, *admin]

    @property
    def console(self) -> Listener:
        """Where the console (and ``/metrics``, ``/openapi.json``) is served."""
        return self.admin if self.admin is not None else self.public


@contextlib.contextmanager
def listening(settings: Settings, host: str, port: int) -> Iterator[Listeners]:
    """Bind the public listener (``host``, ``port``) and the admin one (``admin_host``,
    ``admin_port``, when set); closed on the way out. Any of them that cannot be bound is a
    :class:`SettingsError` saying which and why."""
    if settings.admin_port is not None and settings.admin_port == port:
        raise SettingsError(
            f"admin_port {port} is also the public port (--port): the admin listener needs a "
            "port of its own"
        )
    with contextlib.ExitStack() as stack:
        public = stack.enter_context(listen(host, port))
        admin = None
        if settings.admin_port is not None:
            admin = stack.enter_context(
                listen(settings.admin_host, settings.admin_port, "admin_port")
            )
            if admin.port == public.port:  # only after --port 0 on another address
                raise SettingsError(
                    f"--port 0 was given port {public.port}, admin_port's (on another address): "
                    "give --port a port of its own"
                )
        yield Listeners(public, admin)


@contextlib.contextmanager
def listen(host: str, port: int, setting: str = "") -> Iterator[Listener]:
    """A :class:`Listener` on ``host`` and ``port`` (0: any free port), closed on the way out.
    ``setting`` names the port's setting in the error."""
    named = f" ({setting})" if setting else ""
    try:
        check_host(host)
    except ValueError as exc:
        raise SettingsError(f"cannot listen on port {port}{named}: {exc}") from None
    where = f"{url_host(host)}:{port}{named}"
    if not 0 <= port <= HIGHEST_PORT:
        raise SettingsError(f"cannot listen on {where}: a port is from 0 to {HIGHEST_PORT}")
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise SettingsError(
            f"cannot listen on {where}: the host does not resolve ({why})"
        ) from None
    sockets: list[socket.socket] = []
    try:
        bound = port
        for family, kind, protocol, address in _distinct(addresses):
            sock = socket.socket(family, kind, protocol)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: each address family on its own
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], bound, *address[2:]))  # port 0: all on the first one's
            bound = sock.getsockname()[1]
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise SettingsError(f"cannot listen on {where}: {reason(exc)}") from None
    try:
        yield Listener(host, bound, tuple(sockets))
    finally:
        for sock in sockets:
            sock.close()


def reason(exc: OSError) -> str:
    """Why a socket could not be bound or listen, in a few words."""
    return REASONS.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()


def _distinct(addresses: list[tuple[Any, ...]]) -> list[tuple[Any, Any, Any, Any]]:
    """getaddrinfo's answers, each address once."""
    seen: dict[tuple[Any, ...], tuple[Any, Any, Any, Any]] = {}
    for family, kind, protocol, _, address in addresses:
        seen.setdefault((family, *address[:2]), (family, kind, protocol, address))
    return list(seen.values())
