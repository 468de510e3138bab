"""A lean HTTP/1.1 keep-alive client for the simulator's hot path (plain ``http://`` only).

What it buys: httpx spends most of a small callback's cost in its connection pool and stream
layers (its pool checks every connection's socket on every request); against a no-op receiver
`relay simulate sms-dlr --concurrency 50` sent 175-260 callbacks/s through it at 100 % of a
core. This client writes the serialised request on a pooled keep-alive connection (an asyncio
protocol) and reads the answer with httptools (a declared dependency): 5,000-9,500 callbacks/s
on the same 2-core machine, 0.46-0.91 of what ``wrk`` gets from that endpoint
(``scripts/bench_simulator.py``; docs/simulator.md, "Load testing").

A connection the receiver closed while idle (its keep-alive time-out) that meets the next
request is retried once on a new connection, as httpx does.

What it does not do: TLS, proxies, redirects (the platform follows none), HTTP/2. ``https://``
URLs go through httpx (:func:`relay.simulator.senders.sender_for`).

How to turn it off: ``relay simulate ... --client httpx`` (every request through httpx).
"""

from __future__ import annotations

import asyncio
import base64
from collections import deque
from collections.abc import Mapping
from urllib.parse import quote, urlencode, urlsplit

import httptools

from relay.destinations.errors import describe_error
from relay.simulator.senders import NoAnswer, SendFailed
from relay.simulator.wire import Endpoint, Prepared

SAFE_PATH = "/%:@!$&'()*+,;=-._~"
TARGETS_KEPT = 64


class _Stale(Exception):
    """A kept-alive connection was closed by the receiver before our request reached it."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request in flight; the answer's status code resolves
    ``answer`` once the whole answer is read (or the connection closes after its head)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self.answer: asyncio.Future[int] | None = None
        self.answered = 0
        """Answers read on this connection so far."""
        self._heard = False
        self._parser = httptools.HttpResponseParser(self)
        self._status: int | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._heard = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(SendFailed(f"bad answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._status is not None:  # an answer without length ends with the connection
            self._resolve(self._status)
        elif self.answered and not self._heard:
            self._fail(_Stale())  # the receiver had closed it while idle: not our request's fault
        else:
            self._fail(SendFailed("connection reset" if exc is None else describe_error(exc)))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue and the like: the final answer follows
            self._status = None
            return
        self.keep_alive = self._parser.should_keep_alive()
        self.answered += 1
        self._resolve(status)

    # the client's side
    def exchange(self, request: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self._status = None
        self._heard = False
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.answer

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _resolve(self, status: int) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(status)
        self._status = None

    def _fail(self, error: Exception) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(error)


class Http1Sender:
    """A :class:`relay.simulator.senders.Sender`: up to ``connections`` keep-alive HTTP/1.1
    connections to the endpoint's host, opened as needed and reused."""

    def __init__(self, endpoint: Endpoint, connections: int) -> None:
        parts = urlsplit(endpoint.base)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("the lean client speaks plain http:// only")
        if connections < 1:
            raise ValueError("at least one connection")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._origin = f"{parts.scheme}://{parts.netloc}"
        fixed = f"Host: {parts.netloc}\r\n"
        if endpoint.basic_auth is not None:
            token = base64.b64encode(":".join(endpoint.basic_auth).encode()).decode()
            fixed += f"Authorization: Basic {token}\r\n"
        self._fixed = fixed
        self._limit = connections
        self._open = 0
        self._idle: list[_Connection] = []
        self._targets: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        """Request targets by URL and query (POSTs share a few; GETs' queries differ)."""
        self._waiting: deque[asyncio.Future[_Connection | None]] = deque()

    def head(self, prepared: Prepared, headers: Mapping[str, str]) -> bytes:
        """The request line and headers of one attempt (CR or LF in a header is refused)."""
        target = self._targets.get((prepared.url, prepared.query))
        if target is None:
            target = self._target(prepared)
            if len(self._targets) < TARGETS_KEPT:
                self._targets[prepared.url, prepared.query] = target
        lines = [f"{prepared.method} {target} HTTP/1.1\r\n", self._fixed]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        if prepared.body is not None:
            lines.append(f"Content-Length: {len(prepared.body)}\r\n")
        if any(_breaks(name) or _breaks(value) for name, value in headers.items()):
            raise SendFailed("a header holds a line break")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    def _target(self, prepared: Prepared) -> str:
        path = prepared.url[len(self._origin) :] if prepared.url.startswith(self._origin) else ""
        target = quote(path, safe=SAFE_PATH) or "/"
        if prepared.query:
            target += "?" + urlencode(prepared.query)
        return target

    async def send(self, prepared: Prepared, headers: Mapping[str, str], timeout: float) -> int:
        try:
            request = self.head(prepared, headers) + (prepared.body or b"")
        except UnicodeEncodeError:
            raise SendFailed("a header is not Latin-1 text") from None
        try:
            return await self._exchange(request, timeout)
        except _Stale:  # once more, on a new connection (as browsers and httpx do)
            return await self._exchange(request, timeout)

    async def _exchange(self, request: bytes, timeout: float) -> int:
        connection = await self._acquire(timeout)
        answer = connection.exchange(request)
        timer = asyncio.get_running_loop().call_later(timeout, _expire, answer)
        try:
            status = await answer
        except BaseException:
            connection.close()  # an answer may still come: never reuse it
            self._release(connection)
            raise
        finally:
            timer.cancel()
        if not connection.keep_alive:
            connection.close()
        self._release(connection)
        return status

    async def aclose(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    async def _acquire(self, timeout: float) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
            self._open -= 1
        if self._open >= self._limit:
            waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            handed = await waiter
            if handed is not None:
                return handed
        self._open += 1
        try:
            _, connection = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(_Connection, self._host, self._port),
                timeout,
            )
        except TimeoutError:
            self._open -= 1
            self._wake()
            raise NoAnswer from None
        except OSError as exc:
            self._open -= 1
            self._wake()
            raise SendFailed(describe_error(exc)) from None
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        return connection

    def _release(self, connection: _Connection) -> None:
        if connection.closed:
            self._open -= 1
            self._wake()
            return
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append(connection)

    def _wake(self) -> None:
        """A connection slot came free: one waiter may open a new connection."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _breaks(text: str) -> bool:
    return "\r" in text or "\n" in text


def _expire(answer: asyncio.Future[int]) -> None:
    if not answer.done():
        answer.set_exception(NoAnswer())
