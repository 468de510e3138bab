"""Settings of ``amqp`` destinations (RabbitMQ); publishing is :mod:`relay.destinations.amqp`."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relay.destinations.base import Destination, DestinationType
from relay.destinations.broker_config import BrokerDestinationBase, broker_url, checked_template
from relay.destinations.errors import without_credentials

AMQP_NAME_BYTES = 255
"""AMQP's limit on routing keys (a short string)."""
AMQP_NAME = re.compile(r"[A-Za-z0-9\-_.:@#,/+ ]{0,127}")
"""Exchange and queue names the AMQP client (pamqp) sends: RabbitMQ would take 255 bytes of
UTF-8, but pamqp refuses anything else before sending."""


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

    CLIENT_PACKAGE: ClassVar[str] = "aio-pika"
    CLIENT: ClassVar[tuple[str, ...]] = ("aio_pika", "pamqp", "yarl")

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


def _build(name: str, config: AmqpDestinationConfig, http_client: Any) -> Destination:
    from relay.destinations.amqp import AmqpDestination  # the client, when built

    return AmqpDestination(name, config)


TYPE = DestinationType("amqp", AmqpDestinationConfig, _build)
