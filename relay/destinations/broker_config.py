"""Settings of the message-broker destinations: ``amqp`` (RabbitMQ), ``nats`` (JetStream) and
``mqtt``.

Each publishes one message per event (``format``: the envelope or the platform's raw body),
with the headers of :mod:`relay.destinations.message_headers`, to a name built by a template
(:mod:`relay.destinations.templates`). A delivery succeeds only once the broker has taken
the message: a publisher confirm, a JetStream ack, a PUBACK (QoS 1) or PUBCOMP (QoS 2).
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relay.destinations.base_config import DestinationBase, Secrets
from relay.destinations.errors import without_credentials
from relay.destinations.outbound import BodyFormat
from relay.destinations.templates import NameTemplate
from relay.destinations.tls_files import TlsFiles

AMQP_NAME_BYTES = 255
"""AMQP's limit on routing keys (a short string)."""
AMQP_NAME = re.compile(r"[A-Za-z0-9\-_.:@#,/+ ]{0,127}")
"""Exchange and queue names the AMQP client (pamqp) sends: RabbitMQ would take 255 bytes of
UTF-8, but pamqp refuses anything else before sending."""
MQTT_TOPIC_BYTES = 65_535
NATS_SUBJECT_BYTES = 1024
"""Far below what a server accepts: a longer subject is a mistake, not a need."""


class BrokerDestinationBase(DestinationBase):
    """What every broker destination takes beside filters, policy and timeout."""

    format: BodyFormat = "envelope"
    secret: Secrets = Field(default_factory=list)
    """``whsec_...`` secrets: each message carries a ``webhook-signature`` header."""


class BrokerTlsFiles(BrokerDestinationBase):
    """The TLS files of a broker destination whose URL asks for TLS (its scheme is
    ``TLS_SCHEME``): ``cafile`` (the CAs that sign the broker's certificate; by default the
    system's), ``certfile`` and ``keyfile`` (a client certificate, for a broker that asks for
    one)."""

    TLS_SCHEME: ClassVar[str]
    url: str
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    @property
    def tls(self) -> bool:
        """Whether the url asks for TLS."""
        return self.url.startswith(f"{self.TLS_SCHEME}://")

    @field_validator("cafile", "certfile", "keyfile")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and (not value or not value.isprintable() or len(value) > 4096):
            raise ValueError("must be the path of a file: one printable line, not empty")
        return value

    def tls_files(self) -> TlsFiles | None:
        """What the destination's TLS context is made of, where its URL asks for TLS."""
        return TlsFiles(self.cafile, None, self.certfile, self.keyfile) if self.tls else None

    @model_validator(mode="after")
    def _tls_files(self) -> BrokerTlsFiles:
        if not self.tls and (self.cafile or self.certfile or self.keyfile):
            raise ValueError(f"cafile, certfile and keyfile need a {self.TLS_SCHEME}:// url")
        if self.keyfile and not self.certfile:
            raise ValueError("keyfile needs certfile")
        return self


def broker_url(value: str, schemes: tuple[str, ...], *, query: bool = False) -> str:
    """``value`` if it is a ``scheme://[user:password@]host[:port]...`` URL of ``schemes``."""
    if any(not c.isprintable() or c.isspace() for c in value):
        raise ValueError("url cannot hold spaces or control characters")
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise ValueError(f"url must start with {' or '.join(s + '://' for s in schemes)}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError("url has an invalid port") from None
    if not parts.hostname:
        raise ValueError("url must name a host")
    if parts.fragment or (parts.query and not query):
        raise ValueError("url cannot hold a query or a fragment")
    if "@" in parts.netloc:
        _credentials(parts.netloc.rpartition("@")[0])
    return value


BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _credentials(userinfo: str) -> None:
    """Refuse credentials that would not reach the broker as written: an empty user (or
    token), a ``%`` that starts no escape, escapes that are not UTF-8, or control characters
    once decoded (the broker would get other bytes, or a NUL)."""
    user = userinfo.partition(":")[0]
    if not user:
        raise ValueError("url has credentials without a user (or token) before '@'")
    if BAD_ESCAPE.search(userinfo):
        raise ValueError("url credentials hold a '%' that is not an escape: write '%25' for '%'")
    try:
        decoded = unquote(userinfo, errors="strict")
    except UnicodeDecodeError:
        raise ValueError("url credentials hold escapes that are not UTF-8 text") from None
    if not decoded.isprintable():
        raise ValueError("url credentials cannot hold control characters, even escaped")


NATS_SCHEMES = ("nats", "tls")
NATS_MAX_SERVERS = 32


def nats_servers(value: str) -> list[str]:
    """The server URLs of a NATS destination's ``url``: one, or several joined by commas (the
    seeds of a cluster, tried one after the other in a random order), all ``nats://`` or all
    ``tls://``, with the same credentials where any are given (they are the client's)."""
    urls = value.split(",")
    if len(urls) > NATS_MAX_SERVERS:
        raise ValueError(f"url lists more than {NATS_MAX_SERVERS} servers")
    if len(urls) > 1 and not all(urls):
        raise ValueError("url lists servers joined by single commas, without spaces")
    for url in urls:
        broker_url(url, NATS_SCHEMES)
        if urlsplit(url).path not in ("", "/"):
            raise ValueError("url cannot hold a path (NATS has none)")
    if len({urlsplit(url).scheme for url in urls}) > 1:
        raise ValueError("the servers of url must be all nats:// or all tls://")
    if len({urlsplit(url).netloc.rpartition("@")[0] for url in urls} - {""}) > 1:
        raise ValueError("the servers of url must have the same user and password, or none")
    return urls


def shown_servers(value: str) -> str:
    """A NATS ``url`` to show: each server without its credentials."""
    return ",".join(without_credentials(url) for url in value.split(","))


AMQP_TLS_PARAMETERS = ("cafile", "capath", "certfile", "keyfile", "no_verify_ssl")
AMQP_AUTH_MECHANISMS = ("plain", "external")
"""The SASL mechanisms the AMQP client (aiormq) speaks."""
AMQP_MAX_HEARTBEAT = 65_534
AMQP_MAX_CONNECTION_NAME = 255


def amqp_query(query: str, scheme: str) -> None:
    """Raise :class:`ValueError` unless ``query`` holds only connection parameters the AMQP
    client reads, each once, with a value it reads as written: ``heartbeat`` (seconds, 0 to
    65534; 0 turns it off), ``name`` (the connection's name in RabbitMQ, at most 255
    characters), ``auth`` (``plain`` or ``external``) and, with ``amqps://`` only,
    ``cafile``, ``capath``, ``certfile``, ``keyfile`` (with ``certfile``) and ``no_verify_ssl``
    (0 or 1). The
    client would silently read a bad number as 0 (a heartbeat turned off) and ignore an
    unknown name."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise ValueError("url query must be name=value pairs joined by &") from None
    seen: set[str] = set()
    allowed = ("heartbeat", "name", "auth", *AMQP_TLS_PARAMETERS)
    for name, value in pairs:
        if name not in allowed:
            raise ValueError(f"url query parameter {name!r} is not one of {', '.join(allowed)}")
        if name in seen:
            raise ValueError(f"url query parameter {name!r} is given twice")
        seen.add(name)
        if not value or not value.isprintable():
            raise ValueError(f"url query parameter {name!r} needs a printable value")
        if name in AMQP_TLS_PARAMETERS and scheme != "amqps":
            raise ValueError(f"url query parameter {name!r} needs an amqps:// url")
        if name == "heartbeat" and not (
            value.isascii()
            and value.isdigit()
            and len(value) <= 5
            and int(value) <= AMQP_MAX_HEARTBEAT
        ):
            raise ValueError(f"url heartbeat must be 0 to {AMQP_MAX_HEARTBEAT} seconds")
        if name == "name" and len(value) > AMQP_MAX_CONNECTION_NAME:
            raise ValueError(f"url name must be at most {AMQP_MAX_CONNECTION_NAME} characters")
        if name == "no_verify_ssl" and value not in ("0", "1"):
            raise ValueError("url no_verify_ssl must be 0 or 1")
        if name == "auth" and value.lower() not in AMQP_AUTH_MECHANISMS:
            raise ValueError(f"url auth must be one of {', '.join(AMQP_AUTH_MECHANISMS)}")
    if "keyfile" in seen and "certfile" not in seen:
        raise ValueError("url keyfile needs certfile (the client certificate)")


def checked_template(value: str, *, limit: int, forbidden: str = "", what: str = "name") -> str:
    """``value`` if it is a template whose names stay within ``limit`` UTF-8 bytes and whose
    own text holds none of ``forbidden`` (nor control characters)."""
    template = NameTemplate(value)
    literal = template.literal
    if any(not c.isprintable() for c in literal):
        raise ValueError(f"the {what} cannot hold control characters")
    bad = sorted({c for c in literal if c in forbidden})
    if bad:
        raise ValueError(f"the {what} cannot hold {' or '.join(repr(c) for c in bad)}")
    longest = len(template.longest().encode())
    if longest > limit:
        raise ValueError(f"the {what} can reach {longest} bytes, over the limit of {limit}")
    return value


def _amqp_name(value: str, what: str) -> str:
    if not AMQP_NAME.fullmatch(value):
        raise ValueError(
            f"{what} must be at most 127 characters among letters, digits, '-_.:@#,/+' and "
            "space (what the AMQP client can send)"
        )
    return value


class AmqpDeclare(BaseModel):
    """What an ``amqp`` destination declares when it connects (durable; nothing by default).

    The exchange is declared unless it is a broker's own (``amq.*``); with ``queue``, a durable
    queue is declared and bound to it with ``binding_key``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exchange_type: Literal["direct", "fanout", "topic", "headers"] = "topic"
    queue: str | None = Field(default=None, min_length=1)
    binding_key: str = "#"

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        return None if value is None else _amqp_name(value, "queue")

    @field_validator("binding_key")
    @classmethod
    def _binding_key(cls, value: str) -> str:
        if len(value.encode()) > AMQP_NAME_BYTES or not value.isprintable():
            raise ValueError(f"binding_key must be printable, at most {AMQP_NAME_BYTES} bytes")
        return value

    @field_validator("queue")
    @classmethod
    def _not_reserved(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("amq."):
            raise ValueError("queue names starting with 'amq.' are reserved by the broker")
        return value


class AmqpDestinationConfig(BrokerDestinationBase):
    """Publish to a RabbitMQ (AMQP 0-9-1) exchange: persistent, mandatory, confirmed."""

    type: Literal["amqp"]
    url: str
    """``amqp://user:password@host:5672/vhost`` (or ``amqps://``)."""
    exchange: str
    """The exchange; ``""`` is the default exchange (routing key = queue name)."""
    routing_key: str = "{kind}.{source}"
    declare: AmqpDeclare | None = None

    def target(self) -> str:
        exchange = repr(self.exchange) if self.exchange else "(default)"
        return f"{without_credentials(self.url)} exchange {exchange} key {self.routing_key}"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        broker_url(value, ("amqp", "amqps"), query=True)
        parts = urlsplit(value)
        amqp_query(parts.query, parts.scheme)
        return value

    @field_validator("exchange")
    @classmethod
    def _exchange(cls, value: str) -> str:
        return _amqp_name(value, "exchange")

    @field_validator("routing_key")
    @classmethod
    def _routing_key(cls, value: str) -> str:
        return checked_template(value, limit=AMQP_NAME_BYTES, what="routing_key")

    @model_validator(mode="after")
    def _declarable(self) -> AmqpDestinationConfig:
        if self.declare is not None and self.exchange == "":
            raise ValueError(
                "declare needs a named exchange (the default exchange exists and takes no "
                "bindings: its routing key is the queue name)"
            )
        return self


class NatsDestinationConfig(BrokerTlsFiles):
    """Publish to NATS JetStream; a stream must capture the subjects (core NATS is refused)."""

    TLS_SCHEME: ClassVar[str] = "tls"

    type: Literal["nats"]
    url: str
    """``nats://[user:password@]host:4222``, ``nats://TOKEN@host`` (or ``tls://``: TLS or
    nothing, see :mod:`relay.destinations.nats_connect`); several servers joined by commas."""
    subject: str
    """A template, as ``"callbacks.{kind}.{source}"``."""

    def target(self) -> str:
        return f"{shown_servers(self.url)} subject {self.subject}"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        nats_servers(value)
        return value

    @field_validator("subject")
    @classmethod
    def _subject(cls, value: str) -> str:
        checked_template(value, limit=NATS_SUBJECT_BYTES, forbidden=" *>", what="subject")
        tokens = NameTemplate(value).longest().split(".")
        if not all(tokens):
            raise ValueError("the subject cannot start or end with '.' nor hold '..'")
        if value.startswith("$"):
            raise ValueError("subjects starting with '$' are the server's own ($JS, $SYS, ...)")
        return value


class MqttDestinationConfig(BrokerTlsFiles):
    """Publish to an MQTT 5 broker with QoS 1 or 2, retain off."""

    TLS_SCHEME: ClassVar[str] = "mqtts"

    type: Literal["mqtt"]
    url: str
    """``mqtt://[user:password@]host:1883`` (or ``mqtts://``)."""
    topic: str
    """A template, as ``"callbacks/{kind}/{source}"``."""
    qos: Literal[1, 2] = 1
    client_id_prefix: str = Field(default="callback-relay-", min_length=1, max_length=48)
    """Each connection's client id is this and 16 random hex digits: every worker process
    needs its own id (a broker closes the older of two connections with one id)."""

    def target(self) -> str:
        return f"{without_credentials(self.url)} topic {self.topic} QoS {self.qos}"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return broker_url(value, ("mqtt", "mqtts"))

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        checked_template(value, limit=MQTT_TOPIC_BYTES, forbidden="+#\0", what="topic")
        if value.startswith("$"):
            raise ValueError("topics starting with '$' are the broker's own")
        return value

    @field_validator("client_id_prefix")
    @classmethod
    def _client_id_prefix(cls, value: str) -> str:
        if not value.isascii() or not value.isprintable():
            raise ValueError("client_id_prefix must be printable ASCII")
        return value
