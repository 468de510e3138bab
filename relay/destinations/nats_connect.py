"""What a NATS destination's client says in CONNECT (credentials from the URL) and, for a
``tls://`` URL, the guard that it says it only over TLS.

NATS starts every connection in plain text: the server's INFO says whether it requires TLS, and
nats-py upgrades only then, also for a ``tls://`` URL. A server that does not ask (or anyone
in between, answering for it) would get the credentials in CONNECT, then the events, in plain
text. :class:`TlsGuard` refuses that: nats-py calls a credential callback while it writes each
CONNECT, after any upgrade, and the guard's callback fails that connection attempt unless the
TLS context it gave nats-py completed a handshake since the previous CONNECT.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from nats.errors import Error as NatsError


class TlsRefused(NatsError):
    """A ``tls://`` destination's connection was not upgraded to TLS, or was to a server the
    url does not name (a nats-py error, so that nats-py tries again later, as after any failed
    connection)."""


class TlsGuard:
    """The TLS context of a ``tls://`` destination's client (the guard watches its
    handshakes) and the check that each CONNECT follows a TLS handshake made with
    it, whose certificate was verified for one of the url's hosts.

    The second part matters because nats-py also connects to the servers a server's INFO
    names (``connect_urls``), and the first INFO comes in plain text, before TLS: anyone
    answering for the server could name a host of theirs, with a valid certificate of its own.
    A cluster's members that the url does not name are reached only where the server names
    them by address (nats-py then verifies them for the name of the server that named them)."""

    def __init__(self, where: str, context: ssl.SSLContext, hosts: Iterable[str]) -> None:
        """``context`` is the destination's: each new client's guard takes it over (the
        previous client is closed by then)."""
        self._where = where
        self._hosts = frozenset(host.lower() for host in hosts)
        self._verified: list[str | None] = []
        self._handshake_began: float | None = None
        """When the handshake under way began (``time.monotonic``); None when none is."""
        self.context = context
        self.context.sslobject_class = self._witnessed()

    def _witnessed(self) -> type[ssl.SSLObject]:
        guard = self

        class Witnessed(ssl.SSLObject):
            """An SSLObject that tells the guard when its handshake began and the name it
            verified, once its handshake completed."""

            began = False

            def do_handshake(self) -> None:
                if not self.began:  # called again each time the peer's answer arrives
                    self.began = True
                    guard._handshake_began = time.monotonic()
                try:
                    super().do_handshake()
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    raise
                except BaseException:
                    guard._handshake_began = None
                    raise
                guard._handshake_began = None
                guard._verified.append(self.server_hostname)

        return Witnessed

    def forget_handshake(self) -> None:
        """The handshake under way has been accounted for (its connection failed)."""
        self._handshake_began = None

    def handshake_stalled(self, within: float) -> bool:
        """Whether a handshake that began less than ``within`` seconds ago has not completed
        (nats-py gives a stalled handshake ``connect_timeout`` seconds, then a bare timeout)."""
        began = self._handshake_began
        return began is not None and time.monotonic() - began < within

    def passing(self, value: str) -> Callable[[], str]:
        """A credential callback for nats-py: ``value``, if this connection is TLS to one of
        the url's hosts."""

        def credential() -> str:
            verified, self._verified = self._verified, []
            if not verified:
                raise TlsRefused(
                    f"the NATS server at {self._where} did not switch to TLS, and the URL "
                    "asks for it: nothing was sent (the server needs TLS configured, or the "
                    "URL nats://)"
                )
            name = verified[-1]
            if name is None or name.lower() not in self._hosts:
                raise TlsRefused(
                    f"a NATS server of {self._where} named another server, {name!r}, which the "
                    "url does not name: nothing was sent to it (add it to the url to use it)"
                )
            return value

        return credential


@dataclass(frozen=True)
class ConnectOptions:
    """nats-py ``connect`` arguments for a destination URL (one server, or several joined by
    commas, as :func:`~relay.destinations.broker_config.nats_servers` admits them): the servers
    without credentials, and the credentials (user and password, or a token:
    ``nats://TOKEN@host``) percent-decoded, since nats-py would send them as written."""

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    token: str | None = None

    @classmethod
    def from_url(cls, url: str) -> ConnectOptions:
        servers = [urlsplit(server) for server in url.split(",")]
        bare = tuple(
            urlunsplit((p.scheme, p.netloc.rpartition("@")[2], p.path, p.query, p.fragment))
            for p in servers
        )
        given = next((p for p in servers if p.username is not None), None)
        if given is None or given.username is None:
            return cls(bare)
        if given.password is None:
            return cls(bare, token=unquote(given.username))
        return cls(bare, user=unquote(given.username), password=unquote(given.password))

    def arguments(self, guard: TlsGuard | None) -> dict[str, Any]:
        """``servers``, the credentials and, with a ``guard``, its TLS context: the secret (or
        an empty token, where there is none) is then given through the guard, so that each
        CONNECT is checked."""
        given: dict[str, Any] = {"servers": list(self.servers)}
        if self.password is not None:
            given["user"] = self.user
            given["password"] = self.password if guard is None else guard.passing(self.password)
        elif self.token is not None or guard is not None:
            token = self.token or ""
            given["token"] = token if guard is None else guard.passing(token)
        if guard is not None:
            given["tls"] = guard.context
        return given
