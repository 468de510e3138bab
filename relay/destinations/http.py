"""HTTP destinations (``type = "http"``): POST each event, signed the Standard Webhooks way."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from relay.destinations.base import DestinationType
from relay.destinations.base_config import DestinationBase, Secrets
from relay.destinations.errors import describe_error, timeout_error, without_credentials
from relay.destinations.outbound import BodyFormat, Outbound, render
from relay.destinations.outcome import EXCERPT_BYTES, Outcome, elapsed_ms, excerpt
from relay.destinations.retry_after import parse_retry_after
from relay.destinations.shards import ShardedTransport
from relay.destinations.signing import Signer

USER_AGENT = "callback-relay"
RETRY_AFTER_STATUSES = frozenset({429, 503})
DOWN_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that say the destination cannot take messages now (too many requests, a gateway
without its upstream, unavailable, a gateway's timeout): the breaker counts them. Any other
non-2xx (a 500, a 4xx) may be answered to one message while others succeed: it is that
message's failure (see :attr:`Outcome.down`)."""
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


class HttpDestinationConfig(DestinationBase):
    """POST to a URL, signed the Standard Webhooks way when secrets are configured."""

    type: Literal["http"]
    url: str
    format: BodyFormat = "envelope"
    secret: Secrets = Field(default_factory=list)
    """``whsec_...`` secrets; with several, each request carries one signature per secret."""
    headers: dict[str, str] = Field(default_factory=dict)

    def target(self) -> str:
        return without_credentials(self.url)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL:
            raise ValueError("url is not a valid URL") from None
        if url.scheme not in ("http", "https"):
            raise ValueError(f"url must be an http:// or https:// URL (not {url.scheme}://)")
        if not url.host:
            raise ValueError("url must name a host")
        return value

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not HEADER_NAME.fullmatch(name):
                raise ValueError(f"header name {name!r} is not a valid HTTP header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by the relay and cannot be configured")
            if not text.isascii() or any(char in text for char in "\r\n\0"):
                raise ValueError(f"header {name!r}: the value must be ASCII on one line")
        return value


def new_http_client(
    transport: httpx.AsyncBaseTransport | None = None, *, limits: httpx.Limits | None = None
) -> httpx.AsyncClient:
    """A client fit for relaying: pooled (in shards, see :class:`ShardedTransport`, unless a
    ``transport`` is given), no redirects followed, no cookies kept."""
    limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
    return CookielessClient(
        transport=transport or ShardedTransport(limits),
        follow_redirects=False,
        headers={"user-agent": USER_AGENT},
    )


class _NoCookies(httpx.Cookies):
    """A jar that refuses every cookie and does not read them either."""

    def __init__(self) -> None:
        super().__init__(CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])))

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class CookielessClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` that keeps no cookies: httpx parses every answer's cookies into
    the client's jar, a cost (~6 % of a worker's time) for cookies a relay must not keep."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._no_cookies = _NoCookies()

    @property  # type: ignore[override]
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        raise TypeError("a relay client keeps no cookies")


class HttpDestination:
    """POSTs events to one URL.

    Body: the envelope as JSON, or (``format = "raw"``) the platform's body with its content
    type (GET callbacks: the query string, form-encoded). Headers: ``webhook-id`` (the event id,
    the same on every attempt), ``webhook-timestamp``, ``webhook-signature`` (when secrets are
    configured), ``user-agent`` and the configured extra headers.

    Share one client between destinations for pooling (``client``, not closed by ``aclose``);
    otherwise the destination makes its own (over ``transport`` if given).
    """

    def __init__(
        self,
        name: str,
        config: HttpDestinationConfig,
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self._url = httpx.URL(str(config.url))  # parsed once, not on every request
        self._format = config.format
        self._headers = dict(config.headers)
        secrets = [secret.get_secret_value() for secret in config.secret]
        self._signer = Signer(secrets) if secrets else None
        self._owns_client = client is None
        self._client = client if client is not None else new_http_client(transport)
        self._clock = clock

    def headers_for(
        self, outbound: Outbound, body: bytes, content_type: str | None
    ) -> dict[str, str | bytes]:
        """The request headers of one attempt."""
        timestamp = int(self._clock())
        headers: dict[str, str | bytes] = {"user-agent": USER_AGENT, **self._headers}
        if content_type:
            headers["content-type"] = header_value(content_type)
        headers["webhook-id"] = outbound.event_id
        headers["webhook-timestamp"] = str(timestamp)
        if self._signer is not None:
            headers["webhook-signature"] = self._signer.signature(
                outbound.event_id, timestamp, body
            )
        return headers

    async def start(self) -> None:
        """Nothing to check before the first delivery."""

    async def deliver(self, outbound: Outbound, *, timeout: float) -> Outcome:
        """POST once; never raises for network errors."""
        started = time.perf_counter()
        body, content_type = render(outbound, self._format)
        headers = self.headers_for(outbound, body, content_type)
        deadline = asyncio.get_running_loop().time() + timeout

        response: httpx.Response | None = None
        head = b""
        try:
            async with asyncio.timeout_at(deadline):  # one deadline for the answer and its head
                request = self._client.build_request(
                    "POST", self._url, content=body, headers=headers, timeout=timeout
                )
                response = await self._client.send(request, stream=True, follow_redirects=False)
                head = await _read_head(response)
        except (TimeoutError, httpx.TimeoutException):
            if response is None:
                return Outcome(
                    ok=False,
                    error=timeout_error(timeout),
                    duration_ms=elapsed_ms(started),
                    down=True,
                )
            # the status came in time; the excerpt is a courtesy
        except (httpx.HTTPError, OSError) as exc:
            if response is None:
                return Outcome(
                    ok=False,
                    error=describe_error(exc),
                    duration_ms=elapsed_ms(started),
                    # no answer: down, unless the request was ours to blame
                    down=not isinstance(exc, httpx.LocalProtocolError),
                )
        finally:
            if response is not None:
                with contextlib.suppress(httpx.HTTPError, OSError):
                    await response.aclose()
        assert response is not None  # every way without an answer returned above
        return judge(response, head, elapsed_ms(started))

    async def aclose(self) -> None:
        """Close the client if this destination made it."""
        if self._owns_client:
            await self._client.aclose()


def header_value(text: str) -> str | bytes:
    """A header value httpx can send: beyond ASCII (a raw body's content type as the platform
    sent it), the latin-1 bytes ASGI decoded it from; UTF-8 for what latin-1 cannot hold."""
    if text.isascii():
        return text
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


async def _read_head(response: httpx.Response) -> bytes:
    """At most ``EXCERPT_BYTES`` of the (decoded) answer, without reading the rest."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= EXCERPT_BYTES:
            break
    return b"".join(chunks)[:EXCERPT_BYTES]


def judge(response: httpx.Response, head: bytes, duration_ms: float) -> Outcome:
    """The outcome of an answer: 2xx is success, anything else (redirects too) a failure;
    one of :data:`DOWN_STATUSES` says the destination is down."""
    status = response.status_code
    text = excerpt(head)
    if 200 <= status < 300:
        return Outcome(ok=True, status_code=status, response_excerpt=text, duration_ms=duration_ms)
    reason = httpx.codes.get_reason_phrase(status)
    error = f"HTTP {status} {reason}".strip()
    if 300 <= status < 400:
        error += " (redirects are not followed)"
    retry_after = None
    if status in RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
    return Outcome(
        ok=False,
        status_code=status,
        error=error,
        response_excerpt=text,
        retry_after=retry_after,
        gone=status == 410,
        duration_ms=duration_ms,
        down=status in DOWN_STATUSES,
    )


def _build(
    name: str, config: HttpDestinationConfig, http_client: httpx.AsyncClient | None
) -> HttpDestination:
    return HttpDestination(name, config, client=http_client)


TYPE = DestinationType("http", HttpDestinationConfig, _build)
