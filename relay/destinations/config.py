"""Settings of ``[destinations.NAME]`` tables: one model per ``type``.

What every type shares (filters, policy, timeout) is in :mod:`relay.destinations.base_config`;
the message brokers' types are in :mod:`relay.destinations.broker_config`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import httpx
from arq.connections import RedisSettings
from pydantic import Field, StrictInt, TypeAdapter, field_validator
from redis.asyncio.connection import parse_url

from relay.destinations.base_config import DestinationBase, Secrets
from relay.destinations.broker_config import (
    AmqpDestinationConfig,
    MqttDestinationConfig,
    NatsDestinationConfig,
)
from relay.destinations.errors import without_credentials
from relay.destinations.outbound import BodyFormat

__all__ = [
    "AmqpDestinationConfig",
    "ArqDestinationConfig",
    "DestinationBase",
    "DestinationConfig",
    "HttpDestinationConfig",
    "MqttDestinationConfig",
    "NatsDestinationConfig",
    "RedisStreamDestinationConfig",
    "parse_destination_config",
]

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
REDIS_SCHEMES = ("redis", "rediss", "unix")
REDIS_DB_PATH = re.compile(r"/?|/\d+")


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


def _redis_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in REDIS_SCHEMES:
        raise ValueError("url must start with redis://, rediss:// or unix://")
    if parts.scheme != "unix" and not REDIS_DB_PATH.fullmatch(parts.path):
        raise ValueError("url path must be a database number, as in redis://host:6379/0")
    try:
        parse_url(value)
    except ValueError:
        raise ValueError("url is not a valid Redis URL") from None
    return value


class RedisStreamDestinationConfig(DestinationBase):
    """XADD to a Redis stream; consumers dedupe on the entry's ``id`` field (at-least-once)."""

    type: Literal["redis-stream"]
    url: str
    stream: str = Field(min_length=1)
    maxlen: StrictInt | None = Field(default=100_000, gt=0)
    """Approximate cap on the stream's length (``MAXLEN ~``); None keeps everything."""
    format: BodyFormat = "envelope"

    def target(self) -> str:
        return f"{without_credentials(self.url)} stream {self.stream}"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _redis_url(value)


class ArqDestinationConfig(DestinationBase):
    """Enqueue an arq job ``function(envelope)`` with the event id as job id (deduplicated).

    arq job ids share one namespace per Redis database across queues: when two arq
    destinations share a database, give them different ``job_id_prefix`` values.
    """

    type: Literal["arq"]
    url: str
    function: str = Field(min_length=1)
    queue_name: str = Field(default="arq:queue", min_length=1)
    job_id_prefix: str = ""

    def target(self) -> str:
        return f"{without_credentials(self.url)} queue {self.queue_name}"

    @field_validator("url")
    @classmethod
    def _arq_url(cls, value: str) -> str:
        _redis_url(value)
        try:
            RedisSettings.from_dsn(value)
        except (RuntimeError, ValueError):
            raise ValueError("url is not a valid Redis URL for arq") from None
        return value


DestinationConfig = Annotated[
    HttpDestinationConfig
    | RedisStreamDestinationConfig
    | ArqDestinationConfig
    | AmqpDestinationConfig
    | NatsDestinationConfig
    | MqttDestinationConfig,
    Field(discriminator="type"),
]
"""One ``[destinations.NAME]`` table; ``type`` chooses the model."""

DESTINATION_CONFIG: TypeAdapter[DestinationConfig] = TypeAdapter(DestinationConfig)


def parse_destination_config(data: Mapping[str, Any]) -> DestinationConfig:
    """Validate one destination table (raises pydantic's ValidationError)."""
    return DESTINATION_CONFIG.validate_python(data)
