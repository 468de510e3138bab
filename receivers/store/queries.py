"""Read-side queries over the received events and the quarantine (for operators)."""

from __future__ import annotations

from sqlalchemy import func
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from receivers.store.tables import ReceivedEvent, RejectedBody


async def list_events(
    engine: AsyncEngine, *, kind: str | None = None, source: str | None = None, limit: int = 50
) -> list[ReceivedEvent]:
    """The newest events first, optionally of one kind and/or source."""
    query = select(ReceivedEvent).order_by(
        ReceivedEvent.received_at.desc(), ReceivedEvent.id.desc()
    )
    if kind is not None:
        query = query.where(ReceivedEvent.kind == kind)
    if source is not None:
        query = query.where(ReceivedEvent.source == source)
    async with AsyncSession(engine) as session:
        return list(await session.exec(query.limit(limit)))


async def get_event(engine: AsyncEngine, event_id: str) -> ReceivedEvent | None:
    """One event by id."""
    async with AsyncSession(engine) as session:
        return await session.get(ReceivedEvent, event_id)


async def count_events(engine: AsyncEngine) -> int:
    """How many events are stored."""
    async with AsyncSession(engine) as session:
        return int((await session.exec(select(func.count()).select_from(ReceivedEvent))).one())


async def list_rejected(engine: AsyncEngine, *, limit: int = 50) -> list[RejectedBody]:
    """The most recently seen quarantined bodies first."""
    query = select(RejectedBody).order_by(col(RejectedBody.last_seen_at).desc()).limit(limit)
    async with AsyncSession(engine) as session:
        return list(await session.exec(query))
