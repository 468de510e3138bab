"""How the simulated platform puts one request on the wire: the :class:`Sender` interface, and
its httpx implementation (TLS, in-process ASGI apps, every odd case).

The fast path for plain ``http://`` receivers is :class:`relay.simulator.http1.Http1Sender`;
:func:`sender_for` picks one (``client="httpx"`` turns the fast path off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

import httpx

from relay.destinations.errors import describe_error
from relay.simulator.wire import Endpoint, Prepared

ClientChoice = Literal["auto", "lean", "httpx"]
CLIENT_CHOICES: tuple[ClientChoice, ...] = ("auto", "lean", "httpx")


class NoAnswer(Exception):
    """The receiver did not answer within the time-out."""


class SendFailed(Exception):
    """The request failed before an answer (refused, reset, bad answer); ``str()`` says why in a
    few words, without the URL (it may hold a token)."""


class Sender(Protocol):
    """Sends one prepared attempt and returns the receiver's status code, or raises
    :class:`NoAnswer` or :class:`SendFailed`."""

    async def send(self, prepared: Prepared, headers: Mapping[str, str], timeout: float) -> int: ...

    async def aclose(self) -> None: ...


class HttpxSender:
    """A :class:`Sender` over an ``httpx.AsyncClient`` (its pool, TLS and transports)."""

    def __init__(self, client: httpx.AsyncClient, basic_auth: tuple[str, str] | None) -> None:
        self.client = client
        self._auth = basic_auth

    async def send(self, prepared: Prepared, headers: Mapping[str, str], timeout: float) -> int:
        try:
            answer = await self.client.request(
                prepared.method,
                prepared.url,
                params=prepared.query,
                content=prepared.body,
                headers=dict(headers),
                auth=self._auth,
                timeout=timeout,
            )
        except httpx.TimeoutException:
            raise NoAnswer from None
        except httpx.HTTPError as exc:
            raise SendFailed(describe_error(exc)) from None
        return answer.status_code

    async def aclose(self) -> None:
        await self.client.aclose()


def sender_for(endpoint: Endpoint, connections: int, client: ClientChoice = "auto") -> Sender:
    """The sender for ``endpoint``: the lean HTTP/1.1 client for ``http://`` URLs (``auto``,
    ``lean``), httpx for ``https://`` or when asked (``httpx``). ``lean`` on an ``https://``
    URL is refused (ValueError) rather than sent in clear text."""
    if client not in CLIENT_CHOICES:
        raise ValueError(f"unknown client {client!r}: one of {', '.join(CLIENT_CHOICES)}")
    if connections < 1:
        raise ValueError("at least one connection")
    plain = endpoint.base.startswith("http://")
    if client == "lean" and not plain:
        raise ValueError("the lean client speaks plain http:// only; use --client httpx or auto")
    if client != "httpx" and plain:
        from relay.simulator.http1 import Http1Sender

        return Http1Sender(endpoint, connections)
    limits = httpx.Limits(max_connections=connections)
    return HttpxSender(
        httpx.AsyncClient(limits=limits, follow_redirects=False), endpoint.basic_auth
    )
