"""Support for the retention tests: a store's history built through the real write and routing
paths, its deliveries then set to the states a test needs, and what is left of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.batches import in_transaction, write_items
from receivers.store.records import Receipt, StoreUnavailable
from relay import outbox
from relay.destinations import parse_destination_config
from relay.outbox.router import Router
from relay.outbox.tables import DEAD, SUCCEEDED
from tests.store_support import arrival, rejection

EVENTS = outbox.EVENTS
ROUTED = outbox.ROUTED
DELIVERIES = outbox.DELIVERIES
ATTEMPTS = outbox.ATTEMPTS
DESTINATIONS = ("a", "b", "c")
ATTEMPTS_PER_DELIVERY = 2


@dataclass(frozen=True)
class Planned:
    """A delivery's state: its status, and when it ended (final ones)."""

    status: str
    finished_at: datetime | None = None


async def store_event(engine: AsyncEngine, key: str, at: datetime, **changes: Any) -> str:
    """One event stored through the receivers' write path at ``at``: its id."""
    [answer] = await write_items(in_transaction(engine), [arrival(key, **changes)], at)
    assert isinstance(answer, Receipt), answer
    return answer.event_id


async def quarantine(engine: AsyncEngine, body: bytes, at: datetime) -> None:
    """A body quarantined (or seen again) at ``at``."""
    [answer] = await write_items(in_transaction(engine), [rejection(body)], at)
    assert not isinstance(answer, StoreUnavailable), answer


def router(count: int) -> Router:
    """A router to the first ``count`` of :data:`DESTINATIONS` (every kind)."""
    configs = {
        name: parse_destination_config({"type": "http", "url": f"http://127.0.0.1:9/{name}"})
        for name in DESTINATIONS[:count]
    }
    return Router(configs)


async def route(engine: AsyncEngine, event_id: str, count: int, at: datetime) -> list[str]:
    """Route one event to ``count`` destinations at ``at`` (the real routing path): its
    delivery ids, in destination order."""
    [ref] = [
        e
        for e in await outbox.unrouted_events(engine, at + timedelta(days=1), 10_000)
        if e.id == event_id
    ]
    await outbox.route_events(engine, router(count), [ref], at)
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(DELIVERIES.c.id)
            .where(DELIVERIES.c.event_id == event_id)
            .order_by(DELIVERIES.c.destination)
        )
        return list(rows.scalars())


async def settle(engine: AsyncEngine, delivery_id: str, planned: Planned, at: datetime) -> None:
    """Give a delivery ``planned``'s state, with :data:`ATTEMPTS_PER_DELIVERY` attempts made
    from ``at`` on (as the deliverer records them)."""
    final = planned.status in (SUCCEEDED, DEAD)
    async with engine.begin() as conn:
        await conn.execute(
            update(DELIVERIES)
            .where(DELIVERIES.c.id == delivery_id)
            .values(
                status=planned.status,
                attempts=ATTEMPTS_PER_DELIVERY,
                first_attempt_at=at,
                last_attempt_at=at,
                next_attempt_at=None if final else at,
                finished_at=planned.finished_at,
            )
        )
        await conn.execute(
            insert(ATTEMPTS),
            [
                {
                    "delivery_id": delivery_id,
                    "number": number,
                    "started_at": at,
                    "duration_ms": 1.0,
                    "status_code": 200 if planned.status == SUCCEEDED else 500,
                }
                for number in range(1, ATTEMPTS_PER_DELIVERY + 1)
            ],
        )


async def event_with(
    engine: AsyncEngine,
    key: str,
    at: datetime,
    deliveries: Sequence[Planned] | None,
    **changes: Any,
) -> str:
    """An event received at ``at``; routed to one delivery per ``deliveries`` item, each set
    to that state (None: never routed)."""
    event_id = await store_event(engine, key, at, **changes)
    if deliveries is not None:
        ids = await route(engine, event_id, len(deliveries), at)
        for delivery_id, planned in zip(ids, deliveries, strict=True):
            await settle(engine, delivery_id, planned, at)
    return event_id


@dataclass(frozen=True)
class Left:
    """What is left of events in the store: their ids, and their deliveries and attempts."""

    events: set[str]
    routed: set[str]
    deliveries: dict[str, str]
    """delivery id -> event id"""
    attempts: dict[str, int]
    """delivery id -> attempts kept"""


async def left(engine: AsyncEngine) -> Left:
    """Every event, routed mark, delivery and attempt still stored."""
    async with engine.connect() as conn:
        events = set((await conn.execute(select(EVENTS.c.id))).scalars())
        routed = set((await conn.execute(select(ROUTED.c.event_id))).scalars())
        deliveries = {
            row.id: row.event_id
            for row in await conn.execute(select(DELIVERIES.c.id, DELIVERIES.c.event_id))
        }
        attempts = {
            row.delivery_id: row.count
            for row in await conn.execute(
                select(ATTEMPTS.c.delivery_id, func.count().label("count")).group_by(
                    ATTEMPTS.c.delivery_id
                )
            )
        }
    return Left(events, routed, deliveries, attempts)


async def row_counts(engine: AsyncEngine, tables: Sequence[Any]) -> dict[str, int]:
    """How many rows each table holds."""
    async with engine.connect() as conn:
        return {
            table.name: int(
                (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            )
            for table in tables
        }
