"""MQTT destinations: publish each event to an MQTT 5 broker with QoS 1 or 2, retain off.

The topic comes from the destination's template; the headers of
:mod:`relay.destinations.message_headers` travel as MQTT 5 user properties, except
``content-type``, which is the message's own MQTT 5 content type. An attempt succeeds once the
broker has taken the message: a PUBACK (QoS 1) or a PUBCOMP (QoS 2) whose reason code is not a
failure. An acknowledgement with a failure code (``Not authorized``, ``Quota exceeded``,
``Payload format invalid``...) is a failed attempt. ``No matching subscribers`` is a success:
the broker took the message, no session wanted it. Delivery is at-least-once (an attempt that
timed out or lost its connection may still have reached the broker): consumers dedupe on the
``webhook-id`` user property.

Why paho-mqtt rather than aiomqtt's ``Client``: aiomqtt 2.5.1's ``publish`` returns once the
acknowledgement arrives but drops its reason code, so a publish the broker refused would count
as delivered. paho-mqtt's ``on_publish`` callback carries it, so this module drives a paho
client on the running event loop through paho's public external-loop API (``on_socket_*``
callbacks, ``loop_read``/``loop_write``/``loop_misc``), as aiomqtt does. Only the blocking
TCP (and TLS) connect runs in a thread; from then on every paho call runs on the loop.

Known limit: paho-mqtt 2.2.0 ignores a PUBREC's reason code and goes on with PUBREL, which
Mosquitto completes with a PUBCOMP ``Success``: with QoS 2, a publish the broker refused
counts as delivered. QoS 1 (the default) reports such refusals.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import ssl
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from relay.destinations.broker import BrokerDestination, Undelivered
from relay.destinations.errors import describe_error, without_credentials
from relay.destinations.mqtt_config import MqttDestinationConfig
from relay.destinations.outbound import Outbound

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}
CLIENT_ID_PREFIX = "callback-relay-"
KEEPALIVE_S = 15
"""A connection that stops answering is found dead within about twice this."""
MISC_INTERVAL_S = 1.0
"""How often paho's keepalive bookkeeping (``loop_misc``) runs."""


QUOTA_EXCEEDED = 0x97
"""The reason code of a broker out of room for the client's messages (PUBACK or DISCONNECT)."""
MESSAGE_DISCONNECTS = frozenset({0x81, 0x82, 0x87, 0x90, 0x95, 0x99, 0x9A, 0x9B})
"""DISCONNECT reason codes a broker may send over one PUBLISH (malformed, a protocol error,
not authorized, a topic name or payload it refuses, too large, retain or QoS it does not
support): the attempts that fail with that connection are not counted as the broker's downs."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect, from an ``mqtt://`` or ``mqtts://`` URL."""

    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        """The endpoint of a URL the settings validated (user and password percent-decoded)."""
        parts = urlsplit(url)
        return cls(
            host=parts.hostname or "",
            port=DEFAULT_PORTS[parts.scheme] if parts.port is None else parts.port,
            username=None if parts.username is None else unquote(parts.username),
            password=None if parts.password is None else unquote(parts.password),
            tls=parts.scheme == "mqtts",
        )


def publish_properties(headers: dict[str, str]) -> Properties:
    """The MQTT 5 properties of one message: ``content-type`` as its content type, every other
    header as a user property."""
    properties = Properties(PacketTypes.PUBLISH)
    if "content-type" in headers:
        properties.ContentType = headers["content-type"]
    properties.UserProperty = [(k, v) for k, v in headers.items() if k != "content-type"]
    return properties


class MqttConnection:
    """One MQTT 5 connection (clean start, no session kept), driven by the running loop.

    ``lost`` says why the connection ended (None while it is usable). When it ends, every
    publish still waiting for its acknowledgement fails with :class:`Undelivered`.
    """

    def __init__(self, client: mqtt.Client, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self._connack: asyncio.Future[None] = loop.create_future()
        self._pending: dict[int, asyncio.Future[ReasonCode]] = {}
        self._fd: int | None = None
        self._misc: asyncio.Task[None] | None = None
        self.lost: str | None = None
        self._lost_down = True
        """Whether the end of the connection says the broker is down (see Undelivered)."""

    @classmethod
    async def open(
        cls,
        endpoint: Endpoint,
        client_id: str,
        *,
        connect_timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> MqttConnection:
        """Connect (over TLS with ``tls``, an ``mqtts://`` endpoint's context: the system's
        CAs by default) and wait for the broker's CONNACK; raises Undelivered or OSError."""
        loop = asyncio.get_running_loop()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        if endpoint.username is not None:
            client.username_pw_set(endpoint.username, endpoint.password)
        if endpoint.tls:
            client.tls_set_context(tls or ssl.create_default_context())
        client.connect_timeout = connect_timeout
        connection = cls(client, loop)
        # connect() resolves, connects (and shakes hands for TLS) with blocking calls, then
        # sends CONNECT itself: no callback is set yet, so paho touches no loop from there.
        connecting = loop.run_in_executor(
            None,
            functools.partial(
                client.connect, endpoint.host, endpoint.port, KEEPALIVE_S, clean_start=True
            ),
        )
        try:
            await asyncio.shield(connecting)
        except asyncio.CancelledError:
            connecting.add_done_callback(functools.partial(_drop_late_connect, client))
            raise
        try:
            connection._attach()
            await connection._connack
        except BaseException:
            connection.close()
            raise
        return connection

    async def publish(
        self, topic: str, payload: bytes, qos: int, properties: Properties
    ) -> ReasonCode:
        """Publish and wait for the PUBACK (QoS 1) or PUBCOMP (QoS 2); its reason code."""
        if self.lost is not None:
            raise Undelivered(self.lost, down=self._lost_down)
        info = self._client.publish(topic, payload, qos, retain=False, properties=properties)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise Undelivered(
                f"publish failed: {mqtt.error_string(info.rc)}",
                down=info.rc != mqtt.MQTT_ERR_PAYLOAD_SIZE,
            )
        # the acknowledgement is read by a later turn of the loop: registering now is in time
        acked: asyncio.Future[ReasonCode] = self._loop.create_future()
        self._pending[info.mid] = acked
        try:
            return await acked
        finally:
            if self._pending.get(info.mid) is acked:
                del self._pending[info.mid]

    def close(self) -> None:
        """Send DISCONNECT if the connection stands, and release the socket."""
        if self._misc is not None:
            self._misc.cancel()
        if not self._connack.done():
            self._connack.cancel()
        standing = self.lost is None
        self._end("connection closed")
        if standing:
            # without a write callback paho writes DISCONNECT at once, then closes the socket
            self._client.on_socket_register_write = None
            self._client.disconnect()
        sock = self._client.socket()
        if sock is not None:  # DISCONNECT could not be written at once
            self._forget_socket()
            sock.close()

    def _attach(self) -> None:
        """Hand the connected socket to the loop."""
        client = self._client
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        sock = client.socket()
        if sock is None:
            raise Undelivered("connection closed before CONNACK")
        self._fd = sock.fileno()
        self._loop.add_reader(self._fd, self._readable)
        if client.want_write():
            self._loop.add_writer(self._fd, self._writable)
        self._misc = self._loop.create_task(self._keep_alive())

    def _readable(self) -> None:
        try:
            self._client.loop_read()
            sock = self._client.socket()
            # TLS may hold decrypted bytes the selector cannot see
            while isinstance(sock, ssl.SSLSocket) and sock.pending():
                self._client.loop_read()
                sock = self._client.socket()
        except Exception as exc:  # a packet paho could not decode: drop the connection
            self._fail(exc)

    def _writable(self) -> None:
        try:
            self._client.loop_write()
        except Exception as exc:
            self._fail(exc)

    async def _keep_alive(self) -> None:
        while self.lost is None:
            await asyncio.sleep(MISC_INTERVAL_S)
            try:
                self._client.loop_misc()
            except Exception as exc:
                self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self._end(f"connection dropped: {describe_error(exc)}")
        sock = self._client.socket()
        if sock is not None:
            self._forget_socket()
            sock.close()

    def _end(self, why: str, *, down: bool = True) -> None:
        """The connection is over: fail whatever waits on it."""
        if self.lost is None:
            self.lost, self._lost_down = why, down
        error = Undelivered(self.lost, down=self._lost_down)
        if not self._connack.done():
            self._connack.set_exception(error)
        for acked in self._pending.values():
            if not acked.done():
                acked.set_exception(error)
        self._pending.clear()

    def _forget_socket(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
            self._fd = None

    # paho's callbacks, all called on the loop's thread (from loop_read/write/misc, publish)

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if self._connack.done():
            return
        if reason_code.is_failure:
            self._connack.set_exception(
                Undelivered(f"the broker refused the connection: {reason_code.getName()}")
            )
        else:
            self._connack.set_result(None)

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if flags.is_disconnect_packet_from_server:
            self._end(
                f"disconnected by the broker: {reason_code.getName()}",
                down=reason_code.value not in MESSAGE_DISCONNECTS,
            )
        else:
            self._end("connection lost")

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: object,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        acked = self._pending.pop(mid, None)
        if acked is not None and not acked.done():
            acked.set_result(reason_code)

    def _on_socket_close(self, client: mqtt.Client, userdata: object, sock: object) -> None:
        self._forget_socket()

    def _on_register_write(self, client: mqtt.Client, userdata: object, sock: object) -> None:
        if self._fd is not None:
            self._loop.add_writer(self._fd, self._writable)

    def _on_unregister_write(self, client: mqtt.Client, userdata: object, sock: object) -> None:
        if self._fd is not None:
            self._loop.remove_writer(self._fd)


def _drop_late_connect(client: mqtt.Client, connecting: asyncio.Future[object]) -> None:
    """Close a connection whose attempt was given up while its connect still ran."""
    if connecting.cancelled() or connecting.exception() is not None:
        return
    client.disconnect()  # no callback set: written at once, then the socket is closed
    sock = client.socket()
    if sock is not None:
        sock.close()


class MqttDestination(BrokerDestination[MqttConnection, tuple[bytes, Properties]]):
    """Publishes each event to the topic its template names, over one connection shared by
    concurrent deliveries, opened at the first need and opened again after it was lost.

    The client id is the configured ``client_id_prefix`` and random characters, new for each
    destination object: two workers never share one (a broker closes the older of two
    connections with the same id).
    """

    CLIENT = "MQTT"
    ERRORS = (OSError, ValueError)  # paho's ValueError: a topic or payload it will not send
    NOT_YET = "destination %s: MQTT broker %s not reachable at start (%s); deliveries will retry"

    def __init__(self, name: str, config: MqttDestinationConfig) -> None:
        super().__init__(
            name,
            config,
            template=config.topic,
            where=without_credentials(config.url),
            tls=config.tls_files(),
        )
        self._endpoint = Endpoint.from_url(config.url)
        self._qos = config.qos
        self._client_id = config.client_id_prefix + secrets.token_hex(8)
        self._connection: MqttConnection | None = None

    @property
    def client_id(self) -> str:
        """The MQTT client id this destination connects with."""
        return self._client_id

    def _message(
        self, outbound: Outbound, body: bytes, content_type: str | None, headers: dict[str, str]
    ) -> tuple[bytes, Properties]:
        return body, publish_properties(headers)

    async def _check(self) -> None:
        if self._qos == 2:
            self._log.warning(
                "destination %s: with qos 2 a publish the broker refuses (an ACL) counts as "
                "delivered (paho-mqtt ignores a PUBREC's reason code); qos 1 reports it",
                self.name,
            )
        await self._ready(self._start_timeout)

    async def _send(
        self,
        link: MqttConnection,
        name: str,
        message: tuple[bytes, Properties],
        deadline: float,
    ) -> None:
        body, properties = message
        reason = await link.publish(name, body, self._qos, properties)
        if reason.is_failure:
            raise Undelivered(
                f"the broker refused the message: {reason.getName()} (0x{reason.value:02x})",
                down=reason.value == QUOTA_EXCEEDED,  # out of room; other refusals: the message's
            )

    def _failure(self, exc: BaseException) -> tuple[str, bool]:
        return describe_error(exc), isinstance(exc, OSError)

    async def aclose(self) -> None:
        """Disconnect."""
        async with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    async def _ready(self, timeout: float) -> MqttConnection:
        """The live connection, opened (again) when there is none."""
        async with self._lock:
            if self._connection is not None and self._connection.lost is None:
                return self._connection
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            self._connection = await MqttConnection.open(
                self._endpoint,
                self._client_id,
                connect_timeout=timeout,
                tls=self._tls.for_connection(Undelivered),
            )
            return self._connection
