"""Read-side queries over the received events and the quarantine (for operators).

Lists name their columns: a stored body (up to the receivers' body limit, 1 MiB by default) is
read only when the caller shows it, never to list a row. Each list is newest first, in the order
of an index (``received_at, id``; ``last_seen_at, id``), so it reads ``limit`` rows off that
index however large the table is.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Row, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel.ext.asyncio.session import AsyncSession

from receivers.store.tables import ReceivedEvent, RejectedBody

EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__


async def list_events(
    engine: AsyncEngine,
    *,
    kind: str | Collection[str] | None = None,
    source: str | None = None,
    limit: int = 50,
    with_payload: bool = True,
) -> list[Row[Any]]:
    """The newest events first, optionally of one kind (or of any of a collection of kinds)
    and/or source: every column but the raw body (and but the payload unless
    ``with_payload``). Several kinds are one query each, merged: each walks its kind's index
    for ``limit`` rows at most, where one query for them all would sort every event of
    those kinds."""
    if kind is not None and not isinstance(kind, str):
        found = [
            row
            for one in sorted(set(kind))
            for row in await list_events(
                engine, kind=one, source=source, limit=limit, with_payload=with_payload
            )
        ]
        found.sort(key=lambda row: (row.received_at, row.id), reverse=True)
        return found[:limit]
    columns = [
        c for c in EVENTS.c if c.name != "raw_body" and (with_payload or c.name != "payload")
    ]
    query = select(*columns).order_by(EVENTS.c.received_at.desc(), EVENTS.c.id.desc())
    if kind is not None:
        query = query.where(EVENTS.c.kind == kind)
    if source is not None:
        query = query.where(EVENTS.c.source == source)
    async with engine.connect() as conn:
        return list(await conn.execute(query.limit(limit)))


async def get_event(engine: AsyncEngine, event_id: str) -> ReceivedEvent | None:
    """One event by id."""
    async with AsyncSession(engine) as session:
        return await session.get(ReceivedEvent, event_id)


async def count_events(engine: AsyncEngine) -> int:
    """How many events are stored."""
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(EVENTS)) or 0)


async def list_rejected(
    engine: AsyncEngine, *, limit: int = 50, with_body: bool = True
) -> list[Row[Any]]:
    """The most recently seen quarantined bodies first (without the raw body unless
    ``with_body``)."""
    columns = [c for c in REJECTED.c if with_body or c.name != "raw_body"]
    query = (
        select(*columns).order_by(REJECTED.c.last_seen_at.desc(), REJECTED.c.id.desc()).limit(limit)
    )
    async with engine.connect() as conn:
        return list(await conn.execute(query))


async def get_rejected(engine: AsyncEngine, rejected_id: str) -> Row[Any] | None:
    """One quarantined body by id, with its raw body."""
    async with engine.connect() as conn:
        return (await conn.execute(select(REJECTED).where(REJECTED.c.id == rejected_id))).first()
