"""What operators read of the outbox: deliveries per status, backlog and health."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.outbox.records import DELIVERIES, STATES
from relay.outbox.tables import DEAD, PENDING


async def delivery_counts(engine: AsyncEngine) -> dict[str, int]:
    """How many deliveries are in each status."""
    query = select(DELIVERIES.c.status, func.count()).group_by(DELIVERIES.c.status)
    async with engine.connect() as conn:
        return {status: count for status, count in await conn.execute(query)}


async def store_figures(
    engine: AsyncEngine, statuses: Sequence[str] = (PENDING, DEAD)
) -> tuple[list[Row[Any]], list[Row[Any]]]:
    """What operators read of the store (metrics, the console): per destination and status
    among ``statuses`` (found through the status indexes, so succeeded rows are never read),
    the deliveries' ``count`` and ``oldest`` creation time; and each destination's health."""
    backlog = (
        select(
            DELIVERIES.c.destination,
            DELIVERIES.c.status,
            func.count().label("count"),
            func.min(DELIVERIES.c.created_at).label("oldest"),
        )
        .where(DELIVERIES.c.status.in_(list(statuses)))
        .group_by(DELIVERIES.c.destination, DELIVERIES.c.status)
    )
    async with engine.connect() as conn:
        return list((await conn.execute(backlog)).all()), list(
            (await conn.execute(select(STATES))).all()
        )
