"""Operators' second chances: replaying deliveries and re-enabling a destination."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.outbox.records import DELIVERIES, LOOKUP_CHUNK, Due, update_health
from relay.outbox.tables import HELD, PENDING


async def replay(
    engine: AsyncEngine,
    now: datetime,
    *,
    delivery_ids: Sequence[str] = (),
    status: str | None = None,
    destination: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> list[Due]:
    """Put deliveries back on a fresh schedule, due now; returns them for enqueueing.

    The matching deliveries are found first, then replayed :data:`LOOKUP_CHUNK` at a time, one
    transaction each: a large replay never holds SQLite's write lock (or PostgreSQL's row locks)
    for long, and any number of ids fits every driver's parameter limit. A delivery that no
    longer matches the filters when its chunk comes is left alone. ``progress(done, total)`` is
    told before the first chunk and after each."""
    conditions = []
    if status is not None:
        conditions.append(DELIVERIES.c.status == status)
    if destination is not None:
        conditions.append(DELIVERIES.c.destination == destination)
    if since is not None:
        conditions.append(DELIVERIES.c.created_at >= since)
    if until is not None:
        conditions.append(DELIVERIES.c.created_at < until)
    if delivery_ids:
        targets = list(dict.fromkeys(delivery_ids))
    elif conditions:
        query = select(DELIVERIES.c.id).where(*conditions).order_by(DELIVERIES.c.id)
        async with engine.connect() as conn:
            targets = list((await conn.execute(query)).scalars())
    else:
        raise ValueError("replay needs delivery ids or a filter")
    replayed: list[Due] = []
    if progress is not None:
        progress(0, len(targets))
    for start in range(0, len(targets), LOOKUP_CHUNK):
        chunk = targets[start : start + LOOKUP_CHUNK]
        statement = (
            update(DELIVERIES)
            .where(DELIVERIES.c.id.in_(chunk), *conditions)
            .values(
                status=PENDING,
                schedule_base=DELIVERIES.c.attempts,
                first_attempt_at=None,
                next_attempt_at=now,
                finished_at=None,
                leased_until=None,
                lease_token=None,
            )
            .returning(DELIVERIES.c.id, DELIVERIES.c.attempts)
        )
        async with engine.begin() as conn:
            replayed += [Due(r.id, r.attempts, now) for r in await conn.execute(statement)]
        if progress is not None:
            progress(start + len(chunk), len(targets))
    return replayed


async def enable_destination(engine: AsyncEngine, name: str, now: datetime) -> list[Due]:
    """Clear a destination's 410 switch and breaker, and release its held deliveries."""

    def healthy(_: Mapping[str, Any]) -> Mapping[str, Any]:
        return {
            "consecutive_failures": 0,
            "paused_until": None,
            "disabled": False,
            "disabled_reason": None,
        }

    await update_health(engine, name, healthy, now)
    statement = (
        update(DELIVERIES)
        .where(DELIVERIES.c.destination == name, DELIVERIES.c.status == HELD)
        .values(status=PENDING, next_attempt_at=now, leased_until=None, lease_token=None)
        .returning(DELIVERIES.c.id, DELIVERIES.c.attempts)
    )
    async with engine.begin() as conn:
        return [Due(r.id, r.attempts, now) for r in await conn.execute(statement)]
