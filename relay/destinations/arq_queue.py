"""arq destinations (``type = "arq"``): enqueue a job per event, with the event id as job id."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import unicodedata
from typing import Any, Literal

from arq.connections import ArqRedis, RedisSettings, create_pool
from pydantic import Field, field_validator
from redis.exceptions import RedisError

from receivers.config import UNSHOWABLE
from relay.destinations.base import DestinationType
from relay.destinations.base_config import DestinationBase
from relay.destinations.errors import describe_error, timeout_error, without_credentials
from relay.destinations.outbound import Outbound, envelope
from relay.destinations.outcome import Outcome, elapsed_ms
from relay.destinations.redis_errors import redis_down
from relay.destinations.redis_stream import redis_url


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

    @field_validator("job_id_prefix")
    @classmethod
    def _showable_prefix(cls, value: str) -> str:
        if any(unicodedata.category(c) in UNSHOWABLE for c in value):
            raise ValueError(
                f"job_id_prefix {value!r} holds a control, format or unassigned character, or "
                "an unpaired surrogate"
            )
        return value

    @field_validator("url")
    @classmethod
    def _arq_url(cls, value: str) -> str:
        redis_url(value)
        try:
            RedisSettings.from_dsn(value)
        except (RuntimeError, ValueError):
            raise ValueError("url is not a valid Redis URL for arq") from None
        return value


class ArqDestination:
    """Enqueues ``function(envelope)`` on ``queue_name``.

    The job id is ``job_id_prefix + event id``: arq refuses a job whose id is queued, running or
    still has a kept result, and that refusal counts as success (the event is already there).
    The pool is created on first use, without arq's own connection retries (the relay retries).
    """

    def __init__(
        self, name: str, config: ArqDestinationConfig, *, pool: ArqRedis | None = None
    ) -> None:
        self.name = name
        self._settings = dataclasses.replace(RedisSettings.from_dsn(config.url), conn_retries=0)
        self._function = config.function
        self._queue_name = config.queue_name
        self._prefix = config.job_id_prefix
        self._owns_pool = pool is None
        self._pool = pool
        self._lock = asyncio.Lock()

    def job_id(self, outbound: Outbound) -> str:
        """The arq job id for an event."""
        return f"{self._prefix}{outbound.event_id}"

    async def _get_pool(self) -> ArqRedis:
        async with self._lock:
            if self._pool is None:
                self._pool = await create_pool(self._settings)
            return self._pool

    async def start(self) -> None:
        """Nothing to check before the first delivery."""

    async def deliver(self, outbound: Outbound, *, timeout: float) -> Outcome:
        """Enqueue once; never raises for connection or Redis errors."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                pool = await self._get_pool()
                await pool.enqueue_job(
                    self._function,
                    envelope(outbound),
                    _job_id=self.job_id(outbound),
                    _queue_name=self._queue_name,
                )
        except TimeoutError:
            error, down = timeout_error(timeout), True
        except (RedisError, OSError) as exc:
            error, down = describe_error(exc), redis_down(exc)
        else:
            return Outcome(ok=True, duration_ms=elapsed_ms(started))
        return Outcome(ok=False, error=error, duration_ms=elapsed_ms(started), down=down)

    async def aclose(self) -> None:
        """Close the pool if this destination made it."""
        if self._owns_pool and self._pool is not None:
            await self._pool.aclose()
            self._pool = None


def _build(name: str, config: ArqDestinationConfig, http_client: Any) -> ArqDestination:
    return ArqDestination(name, config)


TYPE = DestinationType("arq", ArqDestinationConfig, _build)
