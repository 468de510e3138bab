"""A guard in front of uvicorn's HTTP protocol: what a client may hold before it is authenticated.

uvicorn's httptools protocol accepts request heads of any size and waits for them forever, so a
few clients sending endless headers, or many that never finish theirs, exhaust memory or file
descriptors before any authentication runs. :class:`ConnectionGuard` bounds, for one server:

- a request's head (request line and header fields): at most ``max_header_bytes`` bytes and
  ``max_headers`` fields, else 431; complete within ``header_timeout`` of the connection's start,
  or of the first byte of the next request on a keep-alive connection, else 408;
- its body: complete within ``body_timeout`` of the end of the head, else 408, or a plain close
  once an answer has started;
- the connections: at most ``max_connections``. A new one at the cap closes the connection that
  has waited longest for its client: a head still coming in (408) or an idle keep-alive
  connection (closed without a word), else a body still coming in (408, or a plain close once
  answered). Only when every connection has a request being answered is the new one refused
  with 503. An idle keep-alive connection (uvicorn closes it after 5 s, but not after an answer
  given before the body was read) is closed after ``header_timeout`` at the latest;
- pipelining: at most :data:`MAX_PIPELINED` requests of a connection read and not yet handled
  by the app (the app is wrapped by :meth:`ConnectionGuard.watch` to tell the guard when it has
  handled one), else the connection is closed.

A request the parser cannot read gets a 400 from the guard. Every answer of the guard is a short
problem+json with ``Connection: close``, and the connection is closed after it. When another
answer may be under way on the connection (a pipelined request is still being answered), it is
closed without one, so that no answer lands in another's place.

Each connection is a :class:`GuardedConnection` that wraps uvicorn's protocol by composition: it
follows the request boundaries with its own ``httptools.HttpRequestParser`` (the parser uvicorn's
protocol uses, with the same leniency) and hands each read to uvicorn only once the read is within
the limits, so nothing over them reaches uvicorn. The head's size is exact: a head ends at its
first blank line (the parser accepts no bare LF), so a read is fed to the parser up to that line,
then up to the end of a ``Content-Length`` body, each piece on its own, and the parser's callbacks
say where each request is. Deadlines are checked by one timer per server, every tenth of the
shorter timeout (at most every second), not one per request. uvicorn's own protocol is given a
:class:`GuardedTransport` that tells the guard when an answer is written and when uvicorn holds
reading up (a pipelined request waiting for the one before it; that time is not the client's).

Cost: 3-4 µs of the event loop per request (two parser calls and seven callbacks for a request
with four header fields; uvicorn's own parse of it takes 0.8 µs). Served by uvicorn, the no-op
endpoint of ``scripts/bench_ingest.py`` used 84 against 80 µs of CPU per request with the guard
and without (medians of 24 alternating turns). Not to be turned off: the limits are what keeps
the server up; they are settings (``relay.settings``).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools
from starlette.types import ASGIApp, Receive, Scope, Send

from receivers.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE

BLANK_LINE = b"\r\n\r\n"
"""Ends a head, and a chunked body."""

MAX_SPLITS = 8
"""Blank lines inside a chunked body tried as its end, per read. A read with more (a body made of
blank lines) is followed in one piece, and a request beginning in it is then judged by the size of
the whole rest of the read (the exact size of its head is unknown)."""

MAX_PIPELINED = 16
"""Requests of one connection read but not yet handled by the app (pipelined). uvicorn reads and
queues every pipelined request of a read, so a client that sends thousands and reads none of the
answers would make the server hold them all (15 MB of them took 850 MB); past this, the
connection is closed. Clients seldom pipeline at all."""

EVICTION_SCAN = 64
"""How many of the oldest waiting connections are looked at for one that can be closed."""

TimeoutSeconds = float
ProtocolFactory = Callable[..., asyncio.Protocol]
Slot = OrderedDict["GuardedConnection", float]
"""Connections waiting for their client, in the order they began to, with that loop time."""


def _answer(status: int, title: str, detail: str, *extra_headers: str) -> bytes:
    body = json.dumps(
        {
            "type": PROBLEM_TYPE_BASE + title.lower().replace(" ", "-"),
            "title": title,
            "status": status,
            "detail": detail,
        }
    ).encode()
    head = [
        f"HTTP/1.1 {status} {title}",
        f"Content-Type: {PROBLEM_MEDIA_TYPE}",
        f"Content-Length: {len(body)}",
        *extra_headers,
        "Connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


HEAD_TOO_LARGE = _answer(
    431, "Request Header Fields Too Large", "The request's head is over the server's limit."
)
TOO_MANY_HEADERS = _answer(
    431, "Request Header Fields Too Large", "The request has more header fields than allowed."
)
TIMED_OUT = _answer(408, "Request Timeout", "The request did not arrive in time.")
MALFORMED = _answer(400, "Bad Request", "The request is not valid HTTP/1.1.")
BUSY = _answer(503, "Service Unavailable", "The server has too many connections.", "Retry-After: 1")


def ignore(data: memoryview) -> None:
    """What a closed connection feeds to."""


class Phase(enum.Enum):
    """Where a connection is in its current request."""

    WAITING = "waiting"  # between requests: nothing of the next one received yet
    HEAD = "head"  # the head is coming in (from the connection's start for the first one)
    BODY = "body"  # the body is coming in


WAITING, HEAD, BODY = Phase.WAITING, Phase.HEAD, Phase.BODY
"""Module names for the members, for the hot paths: in Python 3.11 ``Phase.BODY`` takes ~150 ns,
a module name ~13 ns."""


@dataclass(frozen=True)
class EdgeLimits:
    """What one client connection may hold (see the module's docstring)."""

    max_header_bytes: int
    max_headers: int
    header_timeout: TimeoutSeconds
    body_timeout: TimeoutSeconds
    max_connections: int

    @property
    def check_interval(self) -> TimeoutSeconds:
        """How often deadlines are checked: a tenth of the shorter timeout, 10 ms to 1 s."""
        return min(1.0, max(0.01, min(self.header_timeout, self.body_timeout) / 10))


class ConnectionGuard:
    """The connections of one server: the cap, the deadlines, and who is closed at the cap.

    ``heads``, ``bodies`` and ``idle`` hold the connections waiting for their client, each in the
    order it began waiting (with that time): a head or body coming in, or an idle keep-alive
    connection. A connection whose request is being answered is in none of them."""

    def __init__(self, limits: EdgeLimits) -> None:
        self.limits = limits
        self.active = 0
        self.heads: Slot = OrderedDict()
        self.bodies: Slot = OrderedDict()
        self.idle: Slot = OrderedDict()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.by_peer: dict[tuple[str, int], GuardedConnection] = {}
        """Open connections by the client address the app sees (``scope["client"]``)."""

    def watch(self, app: ASGIApp) -> ASGIApp:
        """``app``, telling each connection when the app has handled one of its requests (what
        bounds pipelining; see :data:`MAX_PIPELINED`)."""
        connections = self.by_peer

        async def watched(scope: Scope, receive: Receive, send: Send) -> None:
            client = scope.get("client")
            connection = connections.get(client) if client is not None else None
            try:
                await app(scope, receive, send)
            finally:
                if connection is not None:
                    connection.handled += 1

        return watched

    def protocol_factory(self, inner: ProtocolFactory) -> ProtocolFactory:
        """What uvicorn's ``http`` option is given: a guarded ``inner`` protocol per connection
        (called with uvicorn's keyword arguments, which are handed on to ``inner``)."""
        return functools.partial(GuardedConnection, self, inner)

    def admit(self, connection: GuardedConnection) -> bool:
        """Count a new connection in, closing the longest-waiting one at the cap; False when
        every connection has a request being read or answered."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if self.active >= self.limits.max_connections:
            victim = self.longest_waiting()
            if victim is None:
                return False
            victim.evict()
        self.active += 1
        return True

    def longest_waiting(self) -> GuardedConnection | None:
        """The connection to close at the cap: the one that has waited longest for a head (or
        as an idle keep-alive connection), else the one that has waited longest for a body;
        only among those whose closing loses no request that was read."""
        head, idle = (self.first_closable(self.heads), self.first_closable(self.idle))
        if head is not None and idle is not None:
            return head if self.heads[head] <= self.idle[idle] else idle
        return head or idle or self.first_closable(self.bodies)

    @staticmethod
    def first_closable(slot: Slot) -> GuardedConnection | None:
        return next((c for c in itertools.islice(slot, EVICTION_SCAN) if c.can_close()), None)

    def place(self, connection: GuardedConnection) -> None:
        """File ``connection`` by its phase, as waiting from now on (in no slot while its
        request is answered)."""
        phase = connection.phase
        if phase is HEAD:
            slot: Slot | None = self.heads
        elif phase is BODY:
            slot = self.bodies
        else:
            slot = None if connection.awaiting_answer else self.idle
        self._file(connection, slot)

    def place_idle(self, connection: GuardedConnection) -> None:
        """:meth:`place` for a connection that is idle from now on."""
        self._file(connection, self.idle)

    def _file(self, connection: GuardedConnection, slot: Slot | None) -> None:
        if connection.slot is not None:
            del connection.slot[connection]
        connection.slot = slot
        if slot is not None:
            slot[connection] = self.now()
            if self.timer is None:
                self.arm()

    def release(self, connection: GuardedConnection) -> None:
        """Count a connection out (it is closing)."""
        if connection.slot is not None:
            del connection.slot[connection]
            connection.slot = None
        if connection.peer is not None and self.by_peer.get(connection.peer) is connection:
            del self.by_peer[connection.peer]
        self.active -= 1

    def now(self) -> float:
        assert self.loop is not None
        return self.loop.time()

    def arm(self) -> None:
        assert self.loop is not None
        self.timer = self.loop.call_later(self.limits.check_interval, self.check)

    def check(self) -> None:
        """Close the connections past their deadline; re-armed while any is waiting."""
        self.timer = None
        now = self.now()
        self.expire(self.heads, now, self.limits.header_timeout)
        self.expire(self.bodies, now, self.limits.body_timeout)
        self.expire(self.idle, now, self.limits.header_timeout)
        if self.heads or self.bodies or self.idle:
            self.arm()

    def expire(self, slot: Slot, now: float, timeout: float) -> None:
        cutoff = now - timeout
        while slot:
            connection, since = next(iter(slot.items()))
            if since > cutoff:
                return
            if connection.paused or connection.awaiting_answer:
                # the server holds the client up (reading paused, or a request before this one
                # is still being answered): its time starts again
                slot.move_to_end(connection)
                slot[connection] = now
                continue
            connection.time_out()


class GuardedConnection(asyncio.Protocol):
    """One client connection: follows its requests, enforces the limits, and hands every read
    within them to the inner (uvicorn's) protocol. Also the callback object of its parser."""

    def __init__(self, guard: ConnectionGuard, inner: ProtocolFactory, **options: Any) -> None:
        self.guard = guard
        self.max_header_bytes = guard.limits.max_header_bytes
        self.max_headers = guard.limits.max_headers
        self.make_inner = inner
        self.options = options
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's
        self.feed: Callable[[memoryview], None] = self.parser.feed_data
        self.slot: Slot | None = None
        self.closed = False
        self.phase = HEAD
        self.moved = False  # the phase changed during this read
        self.paused = False  # uvicorn holds reading up
        self.awaiting_answer = False  # a request was read and nothing written since
        self.answered = False  # something was written since the current head ended
        self.requests = 0
        self.completed = 0  # requests read whole
        self.handled = 0  # requests the app has handled (see ConnectionGuard.watch)
        self.peer: tuple[str, int] | None = None
        self.head_bytes = 0
        self.headers = 0
        self.content_length: bytes | None = None
        self.chunked = False
        self.body_left: int | None = None  # of a Content-Length body
        self.tail = b""  # the last bytes of the previous read, for a blank line across reads

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        if not self.guard.admit(self):
            self.closed = True
            self.transport.write(BUSY)
            self.transport.close()
            return
        self.guard.place(self)
        self.peer = client_address(self.transport)
        if self.peer is not None:
            self.guard.by_peer[self.peer] = self
        self.inner = self.make_inner(**self.options)
        self.inner.connection_made(GuardedTransport(self.transport, self))

    def data_received(self, data: bytes) -> None:
        if self.closed or self.inner is None:
            return
        try:
            refusal = self.follow(data)
        except httptools.HttpParserUpgrade:
            refusal = None  # the rest of this read is no HTTP: uvicorn's parser stops there too
        except httptools.HttpParserError:  # uvicorn's parser would fail alike (plain-text 400)
            self.close(MALFORMED if self.can_answer() else None)
            return
        if refusal is not None:
            self.close(refusal or None)
            return
        if self.moved:
            self.moved = False
            self.guard.place(self)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self.guard.release(self)
        self.parser, self.feed = None, ignore  # no cycle left through the parser
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # --- following the requests -------------------------------------------------------------

    def follow(self, data: bytes) -> bytes | None:
        """Feed one read to the parser piece by piece (each piece ends where a head or a body
        may end). When the read breaks a limit: the refusal to answer, or b"" when an answer
        may be under way on the connection (then it is closed without one); else None."""
        feed = self.feed
        view = memoryview(data)
        size = len(data)
        pos = 0
        splits = 0
        while pos < size:
            if self.body_left and self.phase is BODY:
                stop = pos + self.body_left
                if stop > size:
                    stop = size
                self.body_left -= stop - pos
                feed(view[pos:stop])
                pos = stop
                continue
            if pos or not self.tail:
                end = data.find(BLANK_LINE, pos)
                end = -1 if end < 0 else end + 4
            else:
                end = self.blank_line_end(data)
            stop = size if end < 0 else end
            awaiting = self.awaiting_answer  # before the piece, which may end a request
            if self.phase is not BODY:
                self.head_bytes += stop - pos
                if self.head_bytes > self.max_header_bytes:
                    return HEAD_TOO_LARGE if self.can_answer() else b""
            elif splits == MAX_SPLITS:
                return self.follow_blind(view, pos)
            else:
                splits += 1
            feed(view[pos:stop])
            if self.completed - self.handled > MAX_PIPELINED:
                return b""  # answers are under way: closed without one
            if self.headers > self.max_headers:
                return TOO_MANY_HEADERS if not (awaiting or self.paused) else b""
            if end < 0:
                self.keep_tail(data, pos)
            elif self.tail:
                self.tail = b""
            pos = stop
        return None

    def follow_blind(self, view: memoryview, pos: int) -> bytes | None:
        """The rest of a read inside a chunked body full of blank lines, fed in one piece. When
        a request begins in it, the one before ended in it, unanswered: a refusal closes the
        connection without an answer."""
        requests = self.requests
        rest = len(view) - pos
        self.feed(view[pos:])
        self.tail = bytes(view[-3:])
        if self.completed - self.handled > MAX_PIPELINED:
            return b""
        if self.requests == requests:
            return None
        if rest > self.max_header_bytes or self.headers > self.max_headers:
            return b""  # (a head began in it, of unknown size)
        self.head_bytes = rest if self.phase is HEAD else 0
        self.body_left = None
        return None

    def blank_line_end(self, data: bytes) -> int:
        """Where the first blank line of ``data`` ends, with the previous read's last bytes
        before it; -1 if none."""
        found = (self.tail + data[:3]).find(BLANK_LINE)
        if found >= 0:
            return found + 4 - len(self.tail)
        found = data.find(BLANK_LINE)
        return -1 if found < 0 else found + 4

    def keep_tail(self, data: bytes, pos: int) -> None:
        """Keep the last bytes of a piece that ended with the read (a blank line may span
        reads)."""
        last = data[max(pos, len(data) - 3) :]
        self.tail = (self.tail + last)[-3:] if pos == 0 else last

    # parser callbacks (httptools calls only those a protocol has)

    def on_message_begin(self) -> None:
        self.requests += 1
        self.headers = 0
        self.content_length = None
        self.chunked = False
        if self.phase is WAITING:
            self.phase = HEAD
            self.moved = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers += 1
        size = len(name)
        if size == 14:
            if name.lower() == b"content-length":
                self.content_length = value
        elif size == 17 and name.lower() == b"transfer-encoding":
            self.chunked = True

    def on_headers_complete(self) -> None:
        self.phase = BODY
        self.moved = True
        self.head_bytes = 0
        self.answered = False
        length = self.content_length
        # anything but digits is refused by the parser too
        self.body_left = int(length) if length and length.isdigit() and not self.chunked else None

    def on_message_complete(self) -> None:
        self.completed += 1
        self.phase = WAITING
        self.moved = True
        self.awaiting_answer = not self.answered

    # --- what uvicorn's protocol does (through GuardedTransport) ---------------------------------

    def answering(self) -> None:
        """uvicorn writes the first bytes of an answer (or of a pipelined one before it) to a
        request that was read: an idle keep-alive connection from now on."""
        self.awaiting_answer = False
        if self.phase is WAITING and not self.closed:
            self.guard.place_idle(self)

    # --- closing ----------------------------------------------------------------------------------

    def can_answer(self) -> bool:
        """Whether an answer of the guard would be the only one: nothing read is unanswered,
        nothing held up by uvicorn, and no answer to the current request started."""
        return not (self.awaiting_answer or self.paused or (self.phase is BODY and self.answered))

    def can_close(self) -> bool:
        """Whether closing now loses no request that was read."""
        return not (self.awaiting_answer or self.paused)

    def time_out(self) -> None:
        """Past a deadline: 408 while a request is coming in (and no other answer can be under
        way), nothing for an idle connection."""
        waiting = self.phase is WAITING
        self.close(TIMED_OUT if not waiting and self.can_answer() else None)

    def evict(self) -> None:
        """Closed at the cap to make room (see :meth:`ConnectionGuard.longest_waiting`)."""
        self.time_out()

    def close(self, answer: bytes | None) -> None:
        self.closed = True
        self.guard.release(self)
        assert self.transport is not None
        if answer is not None:
            self.transport.write(answer)
        self.transport.close()


def client_address(transport: asyncio.BaseTransport) -> tuple[str, int] | None:
    """The client's address as uvicorn puts it in ``scope["client"]`` (host, port)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return (str(peer[0]), int(peer[1]))
    return None


class GuardedTransport(asyncio.Transport):
    """The transport uvicorn's protocol is given: the connection's own, which also tells the
    guard when an answer is written and when reading is held up."""

    def __init__(self, transport: asyncio.Transport, connection: GuardedConnection) -> None:
        super().__init__()
        self.transport = transport
        self.connection = connection

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.transport.is_closing():
            return  # the guard or the client closed it: the answer has nobody to reach
        connection = self.connection
        connection.answered = True
        if connection.awaiting_answer:
            connection.answering()
        self.transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def pause_reading(self) -> None:
        self.connection.paused = True
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.connection.paused = False
        self.transport.resume_reading()

    def is_reading(self) -> bool:
        return self.transport.is_reading()

    def write_eof(self) -> None:
        self.transport.write_eof()

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def close(self) -> None:
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def abort(self) -> None:
        self.transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.transport.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """The guard follows HTTP/1.1 only: no upgrade (uvicorn runs with ``ws="none"``)."""
        raise NotImplementedError("a guarded connection cannot switch protocols")

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.connection.inner is not None
        return self.connection.inner
