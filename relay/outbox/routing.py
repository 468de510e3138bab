"""Routing stored events into the outbox: one ``deliveries`` row per matching destination.

The receivers' writer routes new events in the transaction that stores them
(:mod:`relay.outbox.in_commit`); the after-commit hook (:mod:`relay.outbox.hook`) routes those
the writer stored without it, and the sweeper (:mod:`relay.outbox.sweeper`) what
:func:`unrouted_events` finds left behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, true
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import insert_rows, new_id
from relay.outbox.records import DELIVERIES, EVENTS, JOB_BATCH, LOOKUP_CHUNK, ROUTED, Due, EventRef
from relay.outbox.router import Router
from relay.outbox.tables import PENDING


async def route_events(
    engine: AsyncEngine, router: Router, events: Sequence[EventRef], now: datetime
) -> list[Due]:
    """Create one delivery per matching destination and mark the events routed, atomically
    (:func:`write_routes` in a transaction of its own). The receivers' writer routes new
    events in their own transaction instead (:mod:`relay.outbox.in_commit`); this routes those
    left behind."""
    if not events:
        return []
    routed = routed_rows(router, events, now)
    async with engine.begin() as conn:
        created = await conn.run_sync(write_routes, routed)
    return [
        Due(row["id"], 0, now, row["job_id"]) for row in routed.deliveries if row["id"] in created
    ]


@dataclass(slots=True)
class RoutedRows:
    """The rows that route some events: their deliveries, and a marker per event."""

    deliveries: list[dict[str, Any]]
    markers: list[dict[str, Any]]

    def due(self, now: datetime, created: set[str]) -> list[Due]:
        """The first jobs of the deliveries among ``created``."""
        return [
            Due(row["id"], 0, now, row["job_id"]) for row in self.deliveries if row["id"] in created
        ]


def routed_rows(router: Router, events: Sequence[EventRef], now: datetime) -> RoutedRows:
    """One delivery per matching destination of each event, due ``now``; every
    :data:`JOB_BATCH` new deliveries share one batch job id (kept in ``job_id``), so that their
    first attempts cost one job, not one each."""
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
    return RoutedRows(rows, markers)


def write_routes(conn: Connection, routed: RoutedRows) -> set[str]:
    """Insert the rows with the store's :func:`~receivers.store.insert_rows`; the ids of the
    deliveries made now. Idempotent: an event routed twice (the sweeper racing another) gets
    its deliveries once."""
    ids = [row["id"] for row in routed.deliveries]
    created = insert_rows(conn, DELIVERIES, routed.deliveries, ["event_id", "destination"])
    if created < len(ids):  # some existed (a racing route): keep those made now
        ids = [
            found
            for start in range(0, len(ids), LOOKUP_CHUNK)
            for found in conn.execute(
                select(DELIVERIES.c.id).where(
                    DELIVERIES.c.id.in_(ids[start : start + LOOKUP_CHUNK])
                )
            ).scalars()
        ]
    insert_rows(conn, ROUTED, routed.markers, ["event_id"])
    return set(ids)


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
