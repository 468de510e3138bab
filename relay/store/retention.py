"""Retention: which stored rows may go, and removing them in short transactions.

An event goes once it was received before the cutoff, it was routed (its deliveries exist), and
each of its deliveries is final (succeeded or dead) and ended before the cutoff: its deliveries,
their attempts and its routed mark go with it. An event not yet routed, or with a pending or held
delivery, stays whole. A quarantined body goes once it was last seen before the cutoff.

Events are found through the ``received_at`` index, oldest first, a page at a time behind a
cursor (rows that must stay are passed over once per pass, not once per batch), and removed
:data:`BATCH_EVENTS` at a time (fewer when their bodies pass :data:`BATCH_BYTES`), one short
transaction each, which checks the rows again under the write lock (SQLite) or row locks
(PostgreSQL): a delivery replayed meanwhile keeps its event. Between two batches the pass pauses
as long as the last one took, so it never holds SQLite's single writer for more than half the
time. Removing is idempotent: two passes at once remove each row once, and count it once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import and_, delete, exists, func, or_, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from receivers.store import ReceivedEvent, RejectedBody
from relay.delivery.policies import BUILTIN_POLICIES, attempt_times
from relay.outbox import LOOKUP_CHUNK
from relay.outbox.tables import DEAD, SUCCEEDED, Delivery, DeliveryAttempt, RoutedEvent
from relay.words import counted

EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__
ROUTED = RoutedEvent.__table__
DELIVERIES = Delivery.__table__
ATTEMPTS = DeliveryAttempt.__table__

FINAL = (SUCCEEDED, DEAD)
BATCH_EVENTS = 200
"""The most events (or quarantined bodies) one transaction removes: in a SQLite store of a
million events, 200 take 20-150 ms (500: 110-280 ms), mostly in the events' random index pages
(``scripts/bench_prune.py``)."""
BATCH_BYTES = 4 * 1024 * 1024
"""The most raw body bytes one transaction removes (at least one row): a SQLite file frees a
large body page by page, about 10 ms per MiB stored, while the receivers wait to write."""
RETENTION_MARGIN = timedelta(days=1)
"""Kept beyond the platform's longest retry window (see :func:`shortest_retention`)."""

Progress = Callable[["Pruned"], object]
Pause = Callable[[float], Awaitable[object]]


@dataclass(frozen=True)
class Pruned:
    """How many rows of each kind a prune removed (or, counted, would remove)."""

    events: int = 0
    deliveries: int = 0
    attempts: int = 0
    rejected: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    @property
    def rows(self) -> int:
        """Events and quarantined bodies together (what a progress bar counts)."""
        return self.events + self.rejected

    def describe(self) -> str:
        """``3 events, 4 deliveries, 9 attempts and 1 quarantined body``."""
        return (
            f"{counted(self.events, 'event')}, {counted(self.deliveries, 'delivery')}, "
            f"{counted(self.attempts, 'attempt')} and "
            f"{counted(self.rejected, 'quarantined body', 'quarantined bodies')}"
        )


@cache
def platform_retry_window() -> timedelta:
    """How long after its first attempt the platform may still send a callback again: the
    longest of its documented schedules (``platform-appa``: 14 days); a schedule without a
    deadline ends with its last attempt."""
    start = datetime(2000, 1, 1, tzinfo=UTC)
    return max(
        policy.give_up_after or max(attempt_times(policy, start, breaker=False)) - start
        for policy in BUILTIN_POLICIES.values()
    )


def shortest_retention() -> timedelta:
    """The shortest ``retention``: an event must outlive every retry of its callback, else the
    retry would be stored (and relayed) again as a new event."""
    return platform_retry_window() + RETENTION_MARGIN


def _keeps_its_event(cutoff: datetime) -> ColumnElement[bool]:
    """For a row of ``deliveries``: not final, or ended at or after the cutoff."""
    return or_(DELIVERIES.c.status.not_in(FINAL), DELIVERIES.c.finished_at >= cutoff)


def prunable(cutoff: datetime) -> ColumnElement[bool]:
    """For a row of ``received_events``: it may go at this cutoff (see the module's rule)."""
    return and_(
        EVENTS.c.received_at < cutoff,
        exists().where(ROUTED.c.event_id == EVENTS.c.id),
        ~exists().where(DELIVERIES.c.event_id == EVENTS.c.id, _keeps_its_event(cutoff)),
    )


@dataclass(frozen=True)
class _Cursor:
    received_at: datetime
    id: str


async def count_prunable(engine: AsyncEngine, cutoff: datetime) -> Pruned:
    """What :func:`prune` would remove at ``cutoff`` now."""
    goes = select(EVENTS.c.id).where(prunable(cutoff)).scalar_subquery()
    their_deliveries = select(DELIVERIES.c.id).where(DELIVERIES.c.event_id.in_(goes))
    queries = (
        select(func.count()).select_from(EVENTS).where(prunable(cutoff)),
        select(func.count()).select_from(DELIVERIES).where(DELIVERIES.c.event_id.in_(goes)),
        select(func.count())
        .select_from(ATTEMPTS)
        .where(ATTEMPTS.c.delivery_id.in_(their_deliveries.scalar_subquery())),
        select(func.count()).select_from(REJECTED).where(REJECTED.c.last_seen_at < cutoff),
    )
    async with engine.connect() as conn:
        return Pruned(*[int((await conn.execute(query)).scalar_one()) for query in queries])


async def prune(
    engine: AsyncEngine,
    cutoff: datetime,
    *,
    progress: Progress | None = None,
    pause: Pause = asyncio.sleep,
) -> Pruned:
    """Remove what may go at ``cutoff``, batch by batch; ``progress`` is told the running
    totals after each batch. Between batches it awaits ``pause(seconds the batch took)``."""
    total = Pruned()
    cursor: _Cursor | None = None
    while True:
        page = await _candidates(engine, cutoff, cursor)
        if not page:
            break
        cursor = _Cursor(page[-1].received_at, page[-1].id)
        started = time.monotonic()
        total += await remove_events(engine, cutoff, [row.id for row in page])
        if progress is not None:
            progress(total)
        await pause(time.monotonic() - started)
    while True:
        started = time.monotonic()
        removed = await _remove_rejected(engine, cutoff)
        if not removed:
            break
        total += Pruned(rejected=removed)
        if progress is not None:
            progress(total)
        await pause(time.monotonic() - started)
    return total


async def _candidates(
    engine: AsyncEngine, cutoff: datetime, after: _Cursor | None
) -> list[Row[Any]]:
    """The next page of events that may go, after ``after`` in (received_at, id) order, cut
    where their bodies pass :data:`BATCH_BYTES`."""
    query = select(EVENTS.c.id, EVENTS.c.received_at, func.length(EVENTS.c.raw_body).label("size"))
    query = query.where(prunable(cutoff))
    if after is not None:  # written so that the received_at index bounds the scan
        query = query.where(
            EVENTS.c.received_at >= after.received_at,
            or_(EVENTS.c.received_at > after.received_at, EVENTS.c.id > after.id),
        )
    query = query.order_by(EVENTS.c.received_at, EVENTS.c.id).limit(BATCH_EVENTS)
    async with engine.connect() as conn:
        return _within_bytes(list(await conn.execute(query)))


def _within_bytes(rows: list[Row[Any]]) -> list[Row[Any]]:
    """The first ``rows`` whose ``size`` adds up to at most :data:`BATCH_BYTES` (at least one)."""
    taken: list[Row[Any]] = []
    size = 0
    for row in rows:
        size += row.size or 0
        if taken and size > BATCH_BYTES:
            break
        taken.append(row)
    return taken


async def remove_events(engine: AsyncEngine, cutoff: datetime, ids: Sequence[str]) -> Pruned:
    """Remove those of ``ids`` that may go at ``cutoff`` (checked again here, under lock),
    with their deliveries, attempts and routed marks, in one transaction. Rows are deleted by
    their keys, :data:`LOOKUP_CHUNK` at a time, so that every statement goes through an index
    and fits every driver's parameter limit, however many destinations an event had."""
    async with _writing(engine) as conn:
        locked = await conn.execute(  # PostgreSQL: a replay waits for this transaction, or wins
            select(DELIVERIES.c.id, DELIVERIES.c.event_id)
            .where(DELIVERIES.c.event_id.in_(ids))
            .with_for_update()
        )
        deliveries_of = [(row.id, row.event_id) for row in locked]
        going = set(
            (
                await conn.execute(
                    select(EVENTS.c.id).where(EVENTS.c.id.in_(ids), prunable(cutoff))
                )
            ).scalars()
        )
        if not going:
            return Pruned()
        events = sorted(going)
        deliveries = [delivery for delivery, event in deliveries_of if event in going]
        attempts = await _delete(conn, ATTEMPTS.c.delivery_id, deliveries)
        removed_deliveries = await _delete(conn, DELIVERIES.c.id, deliveries)
        await _delete(conn, ROUTED.c.event_id, events)
        return Pruned(await _delete(conn, EVENTS.c.id, events), removed_deliveries, attempts)


async def _delete(conn: AsyncConnection, key: Any, values: Sequence[str]) -> int:
    """Delete the rows of ``key``'s table whose ``key`` is among ``values``; how many."""
    removed = 0
    for start in range(0, len(values), LOOKUP_CHUNK):
        chunk = values[start : start + LOOKUP_CHUNK]
        removed += (await conn.execute(delete(key.table).where(key.in_(chunk)))).rowcount
    return removed


async def _remove_rejected(engine: AsyncEngine, cutoff: datetime) -> int:
    """Remove the oldest quarantined bodies last seen before ``cutoff`` (one batch)."""
    query = (
        select(REJECTED.c.id, func.length(REJECTED.c.raw_body).label("size"))
        .where(REJECTED.c.last_seen_at < cutoff)
        .order_by(REJECTED.c.last_seen_at)
        .limit(BATCH_EVENTS)
    )
    async with engine.connect() as conn:
        ids = [row.id for row in _within_bytes(list(await conn.execute(query)))]
    if not ids:
        return 0
    async with engine.begin() as conn:  # seen again meanwhile: it stays
        statement = delete(REJECTED).where(REJECTED.c.id.in_(ids), REJECTED.c.last_seen_at < cutoff)
        return (await conn.execute(statement)).rowcount


@asynccontextmanager
async def _writing(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction that writes from its first statement on: on SQLite it takes the write
    lock first (``BEGIN IMMEDIATE``), so that what it reads stays true until it commits."""
    async with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            await conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield conn
