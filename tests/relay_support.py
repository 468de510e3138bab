"""Support for relay tests: a settable clock and an outbox pre-filled through the receivers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
from arq.connections import ArqRedis
from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import SourceConfig
from relay import outbox
from relay.delivery.deliverer import LINE_DRAIN, Deliverer, Target
from relay.delivery.policies import PolicyConfigs, resolve_policies
from relay.destinations import build_destination, new_http_client, parse_destination_config
from relay.outbox.router import Router
from tests.conftest import TOKEN, running_client

START = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@dataclass
class Clock:
    """An injected clock the test moves by hand."""

    now: datetime = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta

    def to(self, moment: datetime) -> None:
        self.now = moment


def fake_arq_pool() -> ArqRedis:
    """An arq connection to an in-memory Redis (fakeredis) private to the test: the scaled
    mode's queue without a server."""
    return ArqRedis(connection_pool=fakeredis.FakeAsyncRedis().connection_pool)


async def store_events(
    engine: AsyncEngine, posts: list[tuple[str, dict[str, Any]]], clock: Clock
) -> list[str]:
    """POST callbacks to an in-process receiver (no hook): their event ids."""
    ids = []
    sources = {"default": SourceConfig(token=TOKEN)}
    async with running_client(engine, sources, clock=clock) as client:
        for path, body in posts:
            answer = await client.post(f"{path}?token={TOKEN}", json=body)
            assert answer.status_code == 200, answer.text
            ids.append(answer.json()["id"])
    return ids


class Relay:
    """Router + deliverer over real destinations, driven by hand (no queue)."""

    def __init__(
        self,
        engine: AsyncEngine,
        destinations: Mapping[str, dict[str, Any]],
        clock: Clock,
        policies: Mapping[str, Any] | None = None,
        *,
        lease: timedelta = timedelta(minutes=1),
        concurrency: int = 50,
        line_drain: int = LINE_DRAIN,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.configs = {n: parse_destination_config(c) for n, c in destinations.items()}
        self.router = Router(self.configs)
        self.client = new_http_client()
        targets = {
            name: Target(build_destination(name, cfg, http_client=self.client), cfg.timeout)
            for name, cfg in self.configs.items()
        }
        configs = TypeAdapter(PolicyConfigs).validate_python(policies or {})
        self.deliverer = Deliverer(
            engine,
            targets,
            resolve_policies(configs),
            clock=clock,
            lease=lease,
            concurrency=concurrency,
            line_drain=line_drain,
        )

    async def route_all(self) -> list[outbox.Due]:
        events = await outbox.unrouted_events(self.engine, self.clock() + timedelta(days=1), 1000)
        return await outbox.route_events(self.engine, self.router, events, self.clock())

    async def aclose(self) -> None:
        await self.client.aclose()
