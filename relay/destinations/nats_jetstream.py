"""NATS JetStream destinations: publish each event to a subject a stream captures, and succeed
only on the stream's acknowledgement.

Every message goes through JetStream (a request answered by the stream's ``PubAck``); plain
core NATS is never used, because a core publish is acknowledged by nobody: the relay could
not know the message was kept. A server without JetStream stops the worker's start
(:class:`DestinationRefused`); found later (a server restarted without ``-js``), it fails the
attempt with the same explanation. A subject no stream captures is a failed attempt too (core
NATS would drop the message in silence).

``Nats-Msg-Id`` is the destination's name and the event id, so the stream's duplicate window
(two minutes by default) drops the second copy of an event whose first publish was stored but
whose ack was lost, and two destinations publishing into one stream both keep theirs; a
``PubAck`` marked ``duplicate`` is a success: the stream has the message. The headers are
those of :mod:`relay.destinations.message_headers`.

A ``tls://`` URL is TLS or nothing (:mod:`relay.destinations.nats_connect`): a server that
does not switch to TLS gets no CONNECT, and the attempt fails.

One nats-py connection per destination, shared by concurrent deliveries, opened at ``start``
or at the first delivery, and kept by nats-py itself: it retries a server that was down at
the start, and reconnects to one that went away, every :data:`RECONNECT_WAIT_S` seconds for as
long as it takes (no worker restart). While it is not connected an attempt fails at once with
the reason: nats-py would keep a publish made while it reconnects in its pending buffer, to
send it after the attempt's end, so that buffer is disabled. An attempt whose connection is
lost while it waits for the ack fails then (the stream may have kept the message: its retry
is dropped as a duplicate); one whose server does not answer fails at the attempt's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from urllib.parse import urlsplit

from nats.aio.client import Client
from nats.errors import BadHeaderError, BadSubjectError, MaxPayloadError, OutboundBufferLimitError
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from relay.destinations.broker import BrokerDestination, Undelivered
from relay.destinations.errors import (
    DestinationRefused,
    describe_error,
    storable,
    timeout_error,
)
from relay.destinations.nats_config import NatsDestinationConfig, shown_servers
from relay.destinations.nats_connect import (
    ConnectOptions,
    TlsGuard,
    TlsRefused,
)
from relay.destinations.outbound import Outbound

log = logging.getLogger(__name__)

MSG_ID_HEADER = "Nats-Msg-Id"
RECONNECT_WAIT_S = 1
"""Between two connection attempts to a server that is down (nats-py's own loop)."""
CONNECT_TIMEOUT_S = 2
"""One TCP connection and handshake; an attempt's own timeout bounds its wait anyway."""
HANDSHAKE_STALLED = "the server asked for TLS and did not complete the handshake"
STALL_WINDOW_S = CONNECT_TIMEOUT_S + 1
"""A handshake that began this recently and timed out is the attempt's (a later attempt's
timeout without a handshake comes after the reconnect wait and a connect timeout of its own)."""
PING_INTERVAL_S = 15
"""With nats-py's two outstanding pings, a server that went silent is noticed in 45 s."""
CLOSE_TIMEOUT_S = 5.0
"""How long closing the connection may wait to flush (a server that hangs)."""
JETSTREAM_DISABLED_CODES = frozenset({10039, 10076})
"""JetStream's "not enabled for account" and "not enabled" error codes."""
JETSTREAM_DISABLED = (
    "JetStream is not enabled on the NATS server (core NATS gives no acknowledgement, so the "
    "relay could not know a message was kept): enable it with -js and create a stream "
    "capturing the subjects"
)
NOT_CONNECTED = "not connected to the NATS server"
CONNECTION_LOST = (
    "connection lost before JetStream's ack (if the stream kept it, a retry is dropped)"
)


JETSTREAM_CAPACITY_CODES = frozenset({10002, 10023, 10028, 10047, 10077, 10118})
"""JetStream's refusals for want of room or availability: the account's or the server's
resources (memory, storage), a stream's limits with ``discard = new`` (store failed), a stream
offline. They say the stream cannot take messages now: the breaker counts them."""
PER_SUBJECT_LIMIT = "per subject"
"""In a store failure, a limit of one subject (``max_msgs_per_subject``): that message's own."""


MESSAGE_ERRORS = (MaxPayloadError, BadSubjectError, BadHeaderError)
"""What nats-py refuses to send for the message's sake (its size, its subject, its headers)."""


class NatsDestination(BrokerDestination["_Link", tuple[bytes, dict[str, str]]]):
    """Publishes events to JetStream on a subject built per event."""

    CLIENT = "NATS"
    ERRORS = (NatsError, OSError)
    NOT_YET = "destination %r: cannot use the NATS server at %s yet (%s); deliveries will try again"

    def __init__(self, name: str, config: NatsDestinationConfig) -> None:
        super().__init__(
            name,
            config,
            template=config.subject,
            where=shown_servers(config.url),
            tls=config.tls_files(),
        )
        self._url = config.url
        self._link: _Link | None = None

    def _message(
        self, outbound: Outbound, body: bytes, content_type: str | None, headers: dict[str, str]
    ) -> tuple[bytes, dict[str, str]]:
        """The body, and the relay's headers plus ``Nats-Msg-Id`` (:func:`msg_id`)."""
        headers[MSG_ID_HEADER] = msg_id(self.name, outbound.event_id)
        return body, headers

    async def _check(self) -> None:
        """Connect and ask JetStream for the account's information. A server without
        JetStream raises :class:`DestinationRefused`; one that is not connected yet is logged
        by the connection itself (nats-py keeps trying)."""
        try:
            link = await self._ready(self._start_timeout)
        except Undelivered:
            return  # the connection's own error is logged already
        try:
            await link.jetstream().account_info()
        except ServiceUnavailableError as exc:
            if jetstream_disabled(exc):
                raise DestinationRefused(
                    f"the NATS server at {self._where} has JetStream disabled: core NATS gives "
                    "no acknowledgement, so the relay could not know a message was kept; "
                    "enable JetStream (nats-server -js) and create a stream capturing the "
                    "destination's subjects"
                ) from None
            raise

    def _failure(self, exc: BaseException) -> tuple[str, bool]:
        # what nats-py refuses to send (too large, a bad subject or header) is this message's
        return describe(exc), not isinstance(exc, MESSAGE_ERRORS)

    def _timeout_error(self, timeout: float) -> str:
        error = timeout_error(timeout)  # nats-py's request timeout is one too
        if self._link is not None and self._link.in_handshake():
            error = f"{error}: {HANDSHAKE_STALLED}"  # nats-py's own timeout is later
        return error

    async def aclose(self) -> None:
        """Close the connection (and stop nats-py's connection attempts)."""
        async with self._lock:
            link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def _ready(self, timeout: float) -> _Link:
        """The connected link; :class:`Undelivered` with the reason while it is not
        connected. The first connection's first answer is waited for (the caller's timeout
        bounds it); after that, a link that is not connected fails at once, nats-py retrying in
        the background. A client nats-py closed for good (it does after an authorization
        violation) is replaced by a new one."""
        async with self._lock:
            if self._link is None or self._link.dead:
                if self._link is not None:
                    await self._link.close()  # before the next link's guard takes the context
                tls = self._tls.for_connection(Undelivered)  # the same context for each link
                self._link = _Link(self.name, self._url, self._where, tls)
            link = self._link
        if not link.client.is_connected:
            await link.answered.wait()
        if not link.client.is_connected:
            raise Undelivered(link.problem or NOT_CONNECTED)
        return link

    async def _send(
        self, link: _Link, name: str, message: tuple[bytes, dict[str, str]], deadline: float
    ) -> None:
        """One JetStream publish waiting until ``deadline`` for its ack, or until its
        connection is lost (nats-py would let it wait for an answer that cannot come); what
        failed is raised (:class:`Undelivered` for what nats-py's errors say badly)."""
        body, headers = message
        js = link.jetstream()
        lost = link.lost
        remaining = deadline - asyncio.get_running_loop().time()
        publishing = asyncio.ensure_future(
            js.publish(name, body, timeout=max(remaining, 0.001), headers=headers)
        )
        try:
            await asyncio.wait((publishing, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not publishing.done():
                publishing.cancel()
                await asyncio.gather(publishing, return_exceptions=True)
        if publishing.cancelled():
            raise Undelivered(CONNECTION_LOST)
        try:
            publishing.result()
        except NoStreamResponseError:
            # no responder: no stream captures the subject, or no JetStream at all
            raise await self._no_stream(js, name) from None
        except OutboundBufferLimitError:
            # nats-py refuses to buffer while it reconnects (pending_size=0)
            raise Undelivered(link.problem or NOT_CONNECTED) from None
        except APIError as exc:
            raise Undelivered(jetstream_refusal(exc), down=jetstream_full(exc)) from None

    async def _no_stream(self, js: JetStreamContext, subject: str) -> Undelivered:
        """Why a publish to ``subject`` had no responder: JetStream answers the account
        information request only where it is enabled. A subject no stream captures is this
        message's failure (subjects are built per event); no JetStream at all fails every
        message."""
        try:
            await js.account_info()
        except ServiceUnavailableError as exc:
            if jetstream_disabled(exc):
                return Undelivered(JETSTREAM_DISABLED)
        except NatsError:
            pass  # the account request failed too: the publish's own answer stands
        return Undelivered(f"no JetStream stream captures subject {subject!r}", down=False)


def msg_id(destination: str, event_id: str) -> str:
    """``Nats-Msg-Id`` of an event's message: the same on every attempt (a retry is dropped
    within the stream's duplicate window), different for each destination, so that two
    destinations publishing into one stream both keep their message."""
    return f"{destination}:{event_id}"


class _Link:
    """One nats-py client and the task making its first connection (nats-py's loop retries
    until it succeeds). Its callbacks log through :func:`describe` (nats-py's default
    error callback would log each error with its traceback)."""

    def __init__(self, destination: str, url: str, where: str, tls: ssl.SSLContext | None) -> None:
        self.client = Client()
        self.problem: str | None = None
        """The latest error nats-py reported: an attempt's error while not connected."""
        self.answered = asyncio.Event()
        """Set once the first connection attempt succeeded or failed."""
        self.failed = False
        self._destination = destination
        self._where = where
        self._logged: set[str] = set()
        """The problems logged since the last connection (servers tried in turn alternate)."""
        self._closing = False
        self._js: JetStreamContext | None = None
        self._guard: TlsGuard | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolved when the current connection is lost (a new one for each connection)."""
        self._task = asyncio.create_task(
            self._connect(url, tls), name=f"nats-connect-{destination}"
        )

    @property
    def dead(self) -> bool:
        """Whether this client will never connect again (a new one is needed)."""
        return self.failed or self.client.is_closed

    def jetstream(self) -> JetStreamContext:
        if self._js is None:
            self._js = self.client.jetstream()
        return self._js

    async def close(self) -> None:
        self._closing = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.client.close()

    async def _connect(self, url: str, tls: ssl.SSLContext | None) -> None:
        try:
            hosts = [urlsplit(server).hostname or "" for server in url.split(",")]
            guard = None if tls is None else TlsGuard(self._where, tls, hosts)
            self._guard = guard
            await self.client.connect(
                **ConnectOptions.from_url(url).arguments(guard),
                name=f"callback-relay:{self._destination}",
                allow_reconnect=True,
                max_reconnect_attempts=-1,  # forever: the relay's policy decides what waits
                reconnect_time_wait=RECONNECT_WAIT_S,
                connect_timeout=CONNECT_TIMEOUT_S,
                ping_interval=PING_INTERVAL_S,
                pending_size=0,  # publishing while reconnecting fails at once, queues nothing
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a setting nats-py refuses: this client is done for
            self.failed = True
            self.problem = describe(exc)
            log.warning(
                "destination %r: cannot connect to %s: %s",
                self._destination,
                self._where,
                self.problem,
            )
        else:
            self._connected()
        finally:
            self.answered.set()

    def in_handshake(self) -> bool:
        """Whether a TLS handshake of this client began lately and has not completed."""
        return self._guard is not None and self._guard.handshake_stalled(STALL_WINDOW_S)

    async def _on_error(self, exc: Exception) -> None:
        problem = describe(exc)
        guard = self._guard
        if guard is not None and guard.handshake_stalled(STALL_WINDOW_S):
            problem = (
                f"timeout: {HANDSHAKE_STALLED} within {CONNECT_TIMEOUT_S} s"
                if isinstance(exc, TimeoutError)
                else f"{problem} during the TLS handshake"
            )
            guard.forget_handshake()  # told: the next attempt's error is its own
        self.problem = problem  # reported only while not connected
        if not self.client.is_connected:
            self.answered.set()
        if problem not in self._logged and not self._closing:
            self._logged.add(problem)
            log.warning("destination %r: NATS at %s: %s", self._destination, self._where, problem)

    async def _on_disconnected(self) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.problem = "connection lost"  # until a reconnection attempt tells more
        if not self._closing:
            log.warning(
                "destination %r: disconnected from NATS at %s; reconnecting",
                self._destination,
                self._where,
            )

    async def _on_reconnected(self) -> None:
        self._connected()

    def _connected(self) -> None:
        if self.lost.done():
            self.lost = asyncio.get_running_loop().create_future()
        self.problem = None
        if self._logged:
            log.info("destination %r: connected to NATS at %s", self._destination, self._where)
        self._logged = set()


def describe(exc: BaseException) -> str:
    """:func:`describe_error`, without the class name where nats-py's text names the problem
    (``nats: 'Authorization Violation'``, ``nats: unexpected EOF``)."""
    if isinstance(exc, TlsRefused):
        return str(exc)
    text = describe_error(exc)
    name = f"{type(exc).__name__}: "
    return text.removeprefix(name) if text.startswith(f"{name}nats: ") else text


def jetstream_disabled(exc: ServiceUnavailableError) -> bool:
    """Whether a 503 to a JetStream API request means JetStream is off: nobody answered (the
    server has no JetStream), or the server said it is not enabled (for the account)."""
    return exc.code is None or exc.err_code in JETSTREAM_DISABLED_CODES


def jetstream_full(exc: APIError) -> bool:
    """Whether JetStream's refusal of a message says it cannot take messages now (it is
    unavailable, or out of room: :data:`JETSTREAM_CAPACITY_CODES`), rather than refusing this
    message (over the size limit, a sealed stream, a limit of its subject, which JetStream
    also answers with 503)."""
    if PER_SUBJECT_LIMIT in (exc.description or ""):
        return False
    return exc.code in (429, 503) or exc.err_code in JETSTREAM_CAPACITY_CODES


def jetstream_refusal(exc: APIError) -> str:
    """JetStream's refusal of a message (a sealed stream, a size or count limit), in its own
    words."""
    code = f" (error {exc.err_code})" if exc.err_code else ""
    return storable(f"JetStream refused the message: {exc.description or exc.code}{code}")
