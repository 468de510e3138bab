"""Redis stream destinations (``type = "redis-stream"``): XADD each event.

Entries carry ``id`` (the event id), ``kind``, ``source``, ``received_at``, ``body`` (envelope
JSON or the raw body) and ``content_type``. Delivery is at-least-once (an attempt that timed
out may still have been added), so consumers dedupe on ``id``.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, StrictInt, field_validator
from redis.asyncio import Redis
from redis.asyncio.connection import parse_url
from redis.exceptions import RedisError

from relay.destinations.base import DestinationType
from relay.destinations.base_config import DestinationBase
from relay.destinations.errors import describe_error, timeout_error, without_credentials
from relay.destinations.outbound import BodyFormat, Outbound, iso_utc, render
from relay.destinations.outcome import Outcome, elapsed_ms
from relay.destinations.redis_errors import redis_down

REDIS_SCHEMES = ("redis", "rediss", "unix")
REDIS_DB_PATH = re.compile(r"/?|/\d+")


def redis_url(value: str) -> str:
    """``value`` if it is a Redis URL the client reads as written (a database number as path)."""
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
        return redis_url(value)


class RedisStreamDestination:
    """Adds events to one stream, trimmed to about ``maxlen`` entries."""

    def __init__(
        self, name: str, config: RedisStreamDestinationConfig, *, client: Redis | None = None
    ) -> None:
        self.name = name
        self._stream = config.stream
        self._maxlen = config.maxlen
        self._format = config.format
        self._owns_client = client is None
        self._redis = client if client is not None else Redis.from_url(config.url)

    def fields_for(self, outbound: Outbound) -> dict[str, str | bytes]:
        """The stream entry's fields."""
        body, content_type = render(outbound, self._format)
        return {
            "id": outbound.event_id,
            "kind": outbound.kind,
            "source": outbound.source,
            "received_at": iso_utc(outbound.received_at),
            "body": body,
            "content_type": content_type or "",
        }

    async def start(self) -> None:
        """Nothing to check before the first delivery."""

    async def deliver(self, outbound: Outbound, *, timeout: float) -> Outcome:
        """XADD once; never raises for connection or Redis errors."""
        started = time.perf_counter()
        fields = self.fields_for(outbound)
        try:
            async with asyncio.timeout(timeout):
                entry_id = await self._redis.xadd(
                    self._stream, fields, maxlen=self._maxlen, approximate=True
                )
        except TimeoutError:
            error, down = timeout_error(timeout), True
        except (RedisError, OSError) as exc:
            error, down = describe_error(exc), redis_down(exc)
        else:
            ok = bool(entry_id)
            error = None if ok else "XADD returned no entry id"
            return Outcome(ok=ok, error=error, duration_ms=elapsed_ms(started))
        return Outcome(ok=False, error=error, duration_ms=elapsed_ms(started), down=down)

    async def aclose(self) -> None:
        """Close the client if this destination made it."""
        if self._owns_client:
            await self._redis.aclose()


def _build(
    name: str, config: RedisStreamDestinationConfig, http_client: Any
) -> RedisStreamDestination:
    return RedisStreamDestination(name, config)


TYPE = DestinationType("redis-stream", RedisStreamDestinationConfig, _build)
