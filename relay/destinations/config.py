"""Settings of ``[destinations.NAME]`` tables: where to relay, what, and how.

Filters (all must pass):

- ``kinds``: globs on kind names (``"sms.*"``, ``"conversations.status"``); each must match a
  known kind, to catch typos.
- ``events``: globs on the Conversations ``event`` field, without letter case
  (``"messagestatus::*"``). An event without a text ``event`` field is rejected.
- ``channels``: globs on the Conversations ``channel`` field, without letter case. An event
  without a text ``channel`` field is rejected.
- ``sources``: source names, exactly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import httpx
from arq.connections import RedisSettings
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    field_validator,
)
from redis.asyncio.connection import parse_url

from receivers.kinds import KINDS_BY_NAME
from relay.destinations.outbound import BodyFormat
from relay.destinations.signing import secret_key
from relay.durations import Duration

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


class DestinationBase(BaseModel):
    """Filters, retry policy and timeout shared by every destination type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kinds: list[str] = Field(default_factory=lambda: ["*"])
    events: list[str] | None = None
    channels: list[str] | None = None
    sources: list[str] | None = None
    policy: str = Field(default="platform", min_length=1)
    """``platform``: the kind's platform retry policy; otherwise a named policy."""
    timeout: Duration = timedelta(seconds=5)

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError('kinds cannot be empty (omit it, or use ["*"], to relay every kind)')
        names = list(KINDS_BY_NAME)
        for pattern in value:
            if not any(fnmatchcase(name, pattern) for name in names):
                raise ValueError(
                    f"kinds pattern {pattern!r} matches no kind (known: {', '.join(names)})"
                )
        return value

    @field_validator("events", "channels", "sources")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(item.strip() for item in value)):
            raise ValueError("cannot be empty or hold empty names (omit it to accept any)")
        return value

    @field_validator("events", "channels")
    @classmethod
    def _lower(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [item.lower() for item in value]

    @field_validator("timeout")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("timeout must be more than zero")
        return value

    @property
    def timeout_seconds(self) -> float:
        """``timeout`` in seconds, as ``Destination.deliver`` takes it."""
        return self.timeout.total_seconds()

    def wants(self, kind: str, source: str, payload: Mapping[str, Any]) -> bool:
        """Whether an event passes every filter of this destination."""
        if not any(fnmatchcase(kind, pattern) for pattern in self.kinds):
            return False
        if self.sources is not None and source not in self.sources:
            return False
        return _field_matches(payload, "event", self.events) and _field_matches(
            payload, "channel", self.channels
        )


def _field_matches(payload: Mapping[str, Any], field: str, patterns: list[str] | None) -> bool:
    if patterns is None:
        return True
    value = payload.get(field)
    if not isinstance(value, str):
        return False
    value = value.lower()
    return any(fnmatchcase(value, pattern) for pattern in patterns)


class HttpDestinationConfig(DestinationBase):
    """POST to a URL, signed the Standard Webhooks way when secrets are configured."""

    type: Literal["http"]
    url: str
    format: BodyFormat = "envelope"
    secret: list[SecretStr] = Field(default_factory=list)
    """``whsec_...`` secrets; with several, each request carries one signature per secret."""
    headers: dict[str, str] = Field(default_factory=dict)

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

    @field_validator("secret", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    @field_validator("secret")
    @classmethod
    def _whsec(cls, value: list[SecretStr]) -> list[SecretStr]:
        for secret in value:
            secret_key(secret.get_secret_value())
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
    maxlen: int | None = Field(default=100_000, gt=0)
    """Approximate cap on the stream's length (``MAXLEN ~``); None keeps everything."""
    format: BodyFormat = "envelope"

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
    HttpDestinationConfig | RedisStreamDestinationConfig | ArqDestinationConfig,
    Field(discriminator="type"),
]
"""One ``[destinations.NAME]`` table; ``type`` chooses the model."""

DESTINATION_CONFIG: TypeAdapter[DestinationConfig] = TypeAdapter(DestinationConfig)


def parse_destination_config(data: Mapping[str, Any]) -> DestinationConfig:
    """Validate one destination table (raises pydantic's ValidationError)."""
    return DESTINATION_CONFIG.validate_python(data)
