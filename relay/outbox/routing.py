"""Routing stored events into the outbox: one ``deliveries`` row per matching destination.

The after-commit hook (:mod:`relay.outbox.hook`) routes new events at once; the sweeper
(:mod:`relay.outbox.sweeper`) routes what :func:`unrouted_events` finds left behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, true
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import insert_rows_async, new_id
from relay.outbox.records import DELIVERIES, EVENTS, JOB_BATCH, LOOKUP_CHUNK, ROUTED, Due, EventRef
from relay.outbox.router import Router
from relay.outbox.tables import PENDING


async def route_events(
    engine: AsyncEngine, router: Router, events: Sequence[EventRef], now: datetime
) -> list[Due]:
    """Create one delivery per matching destination and mark the events routed, atomically.
    Idempotent: an event routed twice (hook and sweeper racing) gets its deliveries once.

    The rows go in with the store's :func:`~receivers.store.insert_rows_async`. Every
    :data:`JOB_BATCH` new deliveries share one batch job id (kept in ``job_id``), so that their
    first attempts cost one arq job, not one each."""
    if not events:
        return []
    rows: list[dict[str, Any]] = []
    markers: list[dict[str, Any]] = []
    for event in events:
        routes = router.routes(event.kind, event.source, event.payload)
        markers.append({"event_id": event.id, "routed_at": now, "deliveries": len(routes)})
        rows.extend(
            {
                "id": new_id(now),
                "event_id": event.id,
                "destination": route.destination,
                "policy": route.policy,
                "status": PENDING,
                "attempts": 0,
                "schedule_base": 0,
                "created_at": now,
                "next_attempt_at": now,
                "order_key": route.order_key,
                "arrived_at": event.received_at or now,
            }
            for route in routes
        )
    for start in range(0, len(rows), JOB_BATCH):
        job = f"relay:deliver-batch:{new_id(now)}"
        for row in rows[start : start + JOB_BATCH]:
            row["job_id"] = job
    ids = [row["id"] for row in rows]
    async with engine.begin() as conn:
        created = await insert_rows_async(conn, DELIVERIES, rows, ["event_id", "destination"])
        if created < len(ids):  # some existed (a racing route): keep those made now
            ids = [
                found
                for start in range(0, len(ids), LOOKUP_CHUNK)
                for found in (
                    await conn.execute(
                        select(DELIVERIES.c.id).where(
                            DELIVERIES.c.id.in_(ids[start : start + LOOKUP_CHUNK])
                        )
                    )
                ).scalars()
            ]
        await insert_rows_async(conn, ROUTED, markers, ["event_id"])
    created_ids = set(ids)
    return [Due(row["id"], 0, now, row["job_id"]) for row in rows if row["id"] in created_ids]


async def unrouted_events(
    engine: AsyncEngine, before: datetime, limit: int, since: datetime | None = None
) -> list[EventRef]:
    """Events received before ``before`` (and at or after ``since``, when given: the indexed
    received_at keeps a sweep cheap however many events are stored) that were never routed."""
    query = (
        select(EVENTS.c.id, EVENTS.c.source, EVENTS.c.kind, EVENTS.c.payload, EVENTS.c.received_at)
        .select_from(EVENTS.outerjoin(ROUTED, ROUTED.c.event_id == EVENTS.c.id))
        .where(ROUTED.c.event_id.is_(None), EVENTS.c.received_at < before)
        .where(EVENTS.c.received_at >= since if since is not None else true())
        .order_by(EVENTS.c.received_at)
        .limit(limit)
    )
    async with engine.connect() as conn:
        return [
            EventRef(r.id, r.source, r.kind, r.payload, r.received_at)
            for r in await conn.execute(query)
        ]
