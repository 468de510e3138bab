"""AMQP destinations (RabbitMQ): publish each event to an exchange, confirmed by the broker.

Each message is persistent (delivery mode 2) and published with ``mandatory`` on a channel in
publisher-confirm mode, so a delivery succeeds only on the broker's ack: a nack is a failed
attempt, and so is a message no queue takes (the broker returns it: "unroutable"), which would
otherwise be dropped in silence. ``message_id`` is the event id, ``timestamp`` the time of
``webhook-timestamp``, ``app_id`` ``callback-relay``; the headers are those of
:mod:`relay.destinations.message_headers`.

One connection and one confirming channel per destination, shared by concurrent deliveries,
opened at ``start`` or at the first delivery. A plain (not "robust") aio-pika connection is
used and replaced here, at the next attempt after it or its channel closed: the relay retries
failed attempts itself, so reconnecting in the background would only add a second schedule
of retries and publishes failing while it runs. A channel the broker closed (a publish to an
exchange that does not exist) is replaced on the same connection; ``declare`` is redone on
every new channel. A connection that died without a word (a host gone from the network) is
noticed by AMQP heartbeats (aiormq's default: 60 s; ``?heartbeat=N`` in the URL changes it);
until then attempts time out.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import unquote, urlsplit

from aio_pika import Connection, DeliveryMode, ExchangeType, Message
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aio_pika.exceptions import (
    AMQPConnectionError,
    AMQPError,
    ChannelInvalidStateError,
    ConnectionClosed,
    DeliveryError,
    InvalidFrameError,
    PublishError,
)
from pamqp.commands import Basic
from yarl import URL

from relay.destinations.amqp_config import AmqpDeclare, AmqpDestinationConfig
from relay.destinations.broker import BrokerDestination
from relay.destinations.errors import (
    MAX_ERROR_LENGTH,
    describe_error,
    storable,
    without_credentials,
)
from relay.destinations.outbound import Outbound
from relay.destinations.tls_files import TlsFiles

APP_ID = "callback-relay"
SHORT_STRING_BYTES = 255
CLOSE_TIMEOUT_S = 5.0
"""How long closing a connection may wait for the broker's answer."""
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    AMQPError,
    ChannelInvalidStateError,
    OSError,
    RuntimeError,  # aio-pika's "connection/channel not opened" states
)
"""What a connection, a channel or a publish can raise for the broker's or the network's sake."""


class AmqpDestination(BrokerDestination[AbstractExchange, Message]):
    """Publishes events to ``config.exchange`` with a routing key per event."""

    CLIENT = "AMQP"
    CANCELLED_DOWN = False
    ERRORS = BROKER_ERRORS
    NOT_YET = "destination %r: cannot connect to %s yet (%s); deliveries will try again"

    def __init__(self, name: str, config: AmqpDestinationConfig) -> None:
        super().__init__(
            name,
            config,
            template=config.routing_key,
            where=without_credentials(config.url),
            tls=tls_files(URL(config.url)),
        )
        self._url = config.url
        self._vhost = vhost_of(config.url)
        self._exchange_name = config.exchange
        self._declare = config.declare
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def _message(
        self, outbound: Outbound, body: bytes, content_type: str | None, headers: dict[str, str]
    ) -> Message:
        return Message(
            body,
            headers=dict(headers),
            content_type=short_string(content_type),
            delivery_mode=DeliveryMode.PERSISTENT,
            message_id=outbound.event_id,
            timestamp=int(headers["webhook-timestamp"]),
            app_id=APP_ID,
        )

    async def _send(
        self, link: AbstractExchange, name: str, message: Message, deadline: float
    ) -> None:
        await link.publish(message, name, mandatory=True)

    def _failure(self, exc: BaseException) -> tuple[str, bool]:
        return self._describe(exc), broker_down(exc)

    async def aclose(self) -> None:
        """Close the connection (and wait for connections being closed in the background)."""
        async with self._lock:
            connection, self._connection = self._connection, None
            self._channel = self._exchange = None
        if connection is not None:
            with contextlib.suppress(*BROKER_ERRORS):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await connection.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def _ready(self, timeout: float) -> AbstractExchange:
        """The exchange to publish to, on an open channel: reconnects (and declares) when the
        connection or the channel has closed since the last attempt."""
        async with self._lock:
            channel, exchange = self._channel, self._exchange
            if channel is not None and exchange is not None and not channel.is_closed:
                return exchange
            self._channel = self._exchange = None
            if channel is not None:
                self._discard(channel)
            connection = self._connection
            if connection is None or not _alive(connection):
                self._connection = None
                if connection is not None:
                    self._discard(connection)
                connection = await self._connect()
                self._connection = connection
            channel = connection.channel(publisher_confirms=True, on_return_raises=True)
            try:
                await channel.initialize()
            except BaseException:
                # a connection that cannot open a channel is replaced by the next attempt
                self._connection = None
                self._discard(connection)
                raise
            try:
                exchange = await self._declared(channel)
            except BaseException:
                # a failed declaration closed the channel already; a cancelled one must not
                # leave it open
                if channel.is_initialized:
                    self._discard(channel)
                raise
            self._channel, self._exchange = channel, exchange
            return exchange

    async def _connect(self) -> AbstractConnection:
        url = URL(self._url)
        # the url's own ``name``, else one that says whose connection it is
        named = url.query.get("name") or f"{APP_ID} {self.name}"
        connection = Connection(
            url,
            ssl_context=self._tls.for_connection(ConnectionError),
            client_properties={"connection_name": named},
        )
        try:
            await connection.connect()
        except BaseException:
            self._discard(connection)
            raise
        return connection

    async def _declared(self, channel: AbstractChannel) -> AbstractExchange:
        """Declare what ``declare`` asks for on ``channel``; the exchange to publish to."""
        declare: AmqpDeclare | None = self._declare
        name = self._exchange_name
        if declare is None or name.startswith("amq."):
            exchange = (
                channel.default_exchange
                if name == ""
                else await channel.get_exchange(name, ensure=False)
            )
        else:
            exchange = await channel.declare_exchange(
                name, ExchangeType(declare.exchange_type), durable=True
            )
        if declare is not None and declare.queue is not None:
            queue = await channel.declare_queue(declare.queue, durable=True)
            await queue.bind(exchange, declare.binding_key)
        return exchange

    def _discard(self, closable: AbstractConnection | AbstractChannel) -> None:
        """Close a connection or channel in the background: an attempt does not wait for it
        (a broker that does not answer would hold it beyond its timeout)."""

        async def close() -> None:
            with contextlib.suppress(*BROKER_ERRORS, asyncio.CancelledError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await closable.close()

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _describe(self, exc: BaseException) -> str:
        """A short, secret-free error, clearer than the client's text where that is obscure."""
        if isinstance(exc, PublishError) and isinstance(exc.frame, Basic.Return):
            frame = exc.frame
            if frame.reply_code == 312:  # NO_ROUTE
                text = (
                    f"unroutable: no queue bound to exchange {frame.exchange!r} "
                    f"for routing key {frame.routing_key!r}"
                )
            else:
                text = f"returned by the broker: {frame.reply_code} {frame.reply_text}"
            return storable(text)[:MAX_ERROR_LENGTH]
        if isinstance(exc, DeliveryError):
            return "not confirmed: the broker nacked the message"
        if isinstance(exc, ChannelInvalidStateError):
            return "channel closed (by the broker or with its connection)"
        if isinstance(exc, InvalidFrameError) and "Connection.Close" in str(exc):
            # aiormq reports the broker's refusal to open the vhost as an unexpected frame
            return storable(
                f"the broker refused to open vhost {self._vhost!r} "
                "(it does not exist, or the user has no permission on it)"
            )[:MAX_ERROR_LENGTH]
        if isinstance(exc, ConnectionClosed) and len(exc.args) == 2:
            code, text = exc.args
            return storable(f"connection closed by the broker: {code} {text}")[:MAX_ERROR_LENGTH]
        return describe_error(exc)


def broker_down(exc: BaseException) -> bool:
    """Whether a publish's error says the broker cannot take any message now: no connection
    (refused, lost, closed by the broker, a login or vhost it refuses) or a nack (RabbitMQ nacks
    what a full queue with ``overflow = reject-publish`` cannot take, and on internal errors).
    What the broker answers to this publish alone is not: a message returned as unroutable
    (its routing key), a channel it closes over the publish (a missing exchange, a permission
    on the routing key, a message over its size limit), and what fails with that channel (the
    other publishes in flight on it: one message must not count as many downs)."""
    if isinstance(exc, PublishError):  # returned: an unroutable message
        return False
    if isinstance(exc, DeliveryError):  # nacked
        return True
    if isinstance(exc, AMQPConnectionError | OSError | InvalidFrameError):
        return True  # InvalidFrameError: the broker closing the connection while it opens
    if isinstance(exc, ChannelInvalidStateError):
        return False  # a channel closed under the publish: maybe by another message
    return isinstance(exc, RuntimeError)  # aio-pika's "connection not opened" states


def _alive(connection: AbstractConnection) -> bool:
    """Whether ``connection`` is still open. aio-pika clears ``connected`` in a callback that
    runs later; aiormq's connection knows at once (else a burst of attempts would each fail
    at once on the dead connection without ever letting that callback run)."""
    transport = connection.transport
    return (
        connection.connected.is_set()
        and transport is not None
        and not transport.connection.is_closed
    )


def short_string(value: str | None) -> str | None:
    """``value`` cut to the 255 UTF-8 bytes an AMQP property holds (a raw body's content type
    is the platform's, up to 255 characters: beyond 255 bytes the client would refuse the
    message). The ``content-type`` header keeps it whole."""
    if value is None:
        return None
    data = value.encode()
    return (
        value
        if len(data) <= SHORT_STRING_BYTES
        else data[:SHORT_STRING_BYTES].decode(errors="ignore")
    )


def vhost_of(url: str) -> str:
    """The virtual host an AMQP URL names (``/`` when its path is empty)."""
    return unquote(urlsplit(url).path[1:]) or "/"


def tls_files(url: URL) -> TlsFiles | None:
    """The TLS files of an ``amqps://`` URL (``None`` for ``amqp://``), from its query as
    aio-pika reads it: ``cafile``/``capath`` (else the system's CA certificates), ``certfile``
    and ``keyfile`` (a client certificate), ``no_verify_ssl=1``; see :class:`TlsFiles`."""
    if url.scheme != "amqps":
        return None
    query = url.query
    return TlsFiles(
        cafile=query.get("cafile"),
        capath=query.get("capath"),
        certfile=query.get("certfile"),
        keyfile=query.get("keyfile"),  # keyfile needs certfile
        verify=query.get("no_verify_ssl") != "1",
    )
