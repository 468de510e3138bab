"""Redis stream destinations: XADD each event.

Entries carry ``id`` (the event id), ``kind``, ``source``, ``received_at``, ``body`` (envelope
JSON or the raw body) and ``content_type``. Delivery is at-least-once (an attempt that timed
out may still have been added), so consumers dedupe on ``id``.
"""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from relay.destinations.config import RedisStreamDestinationConfig
from relay.destinations.errors import describe_error, timeout_error
from relay.destinations.outbound import Outbound, iso_utc, render
from relay.destinations.outcome import Outcome
from relay.destinations.redis_errors import redis_down


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
            return Outcome(ok=ok, error=error, duration_ms=_since(started))
        return Outcome(ok=False, error=error, duration_ms=_since(started), down=down)

    async def aclose(self) -> None:
        """Close the client if this destination made it."""
        if self._owns_client:
            await self._redis.aclose()


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
