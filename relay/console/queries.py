"""What the console's pages read: keyset-paginated lists over indexed columns, and details.

Every list is newest first and pages with a cursor (the last row's time and id), never with
an offset, so the 1,000th page costs what the first does (``scripts/bench_console.py``).

Each filter has an index that starts with its equality columns and ends with the list's order,
``(time, id)`` (migration ``0007_console_indexes``): both SQLite and PostgreSQL then walk that
index backwards from the cursor and stop after 51 entries, with no sort step, whatever the
table's size (``tests/test_console_lists.py`` checks the plans). The cursor is one row-value
comparison, ``(time, id) < (:time, :id)``, which both use as the index range. A list names its
columns: it never reads a payload or a raw body (up to 1 MiB each), and no page counts a whole
table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Column, and_, case, column, func, literal, or_, select, tuple_, union_all
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import Select
from sqlalchemy.sql.expression import TableClause

from receivers.store import ReceivedEvent, RejectedBody
from relay.console.filters import Cursor, DeliveryFilter, EventFilter
from relay.console.health import RECENT, Recent
from relay.outbox import ATTEMPTS, DELIVERIES, STATES
from relay.outbox.ordering import order_flags, waiting_behind
from relay.outbox.tables import DEAD, HELD, PENDING

EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__
PAGE_SIZE = 50
BACKLOG_CAP = 1_000
"""The destinations page counts each backlog up to this (and shows more as "1,000+")."""
BACKLOG_STATUSES = (PENDING, HELD, DEAD)
"""The statuses counted as a destination's backlog."""
CHART_BUCKETS = 12
CHART_SPAN = timedelta(hours=1)
LISTED_INDEX = "ix_received_events_listed"
"""SQLite only (migration 0007): the columns an event list shows, by id (see ListedEvents)."""


class ListedEvents(TableClause):
    """``received_events`` as the lists read it: on SQLite ``INDEXED BY
    ix_received_events_listed`` (migration 0007), an index of the columns a list shows, by id.
    SQLite keeps a row's columns in their declared order, so the platform id, event name and
    duplicates lie after the payload and the raw body, at the end of their overflow pages:
    reading them from the row reads the whole body (2 MiB for a 1 MiB callback), and SQLite
    looks a row up by id through the primary key's index, and so the row, unless told.
    PostgreSQL keeps large values apart (TOAST) and reads the row."""

    inherit_cache = True


@compiles(ListedEvents, "sqlite")
def _indexed_by(element: ListedEvents, compiler: Any, **options: Any) -> str:
    text = compiler.visit_table(element, **options)
    return f"{text} INDEXED BY {LISTED_INDEX}" if options.get("asfrom") else text


LISTED = ListedEvents(
    EVENTS.name,
    *(
        column(c.name, c.type)
        for c in EVENTS.c
        if c.name
        in ("id", "source", "kind", "event_name", "platform_id", "received_at", "duplicates")
    ),
)
EVENT_LIST_COLUMNS = (
    LISTED.c.id,
    LISTED.c.source,
    LISTED.c.kind,
    LISTED.c.event_name,
    LISTED.c.platform_id,
    LISTED.c.received_at,
    LISTED.c.duplicates,
)


@dataclass(frozen=True)
class Page:
    """One page of a list and the cursor of the next (None on the last page)."""

    rows: list[Row[Any]]
    next: Cursor | None


@dataclass(frozen=True)
class HealthBucket:
    """Five minutes of one destination's attempts."""

    start: datetime
    attempts: int
    succeeded: int
    mean_ms: float | None


async def events_page(engine: AsyncEngine, where: EventFilter) -> Page:
    """Stored events matching ``where``, newest first."""
    conditions = _event_conditions(where)
    if where.before is not None:
        conditions.append(_below(EVENTS.c.received_at, EVENTS.c.id, where.before))
    page = select(EVENTS.c.id).where(*conditions).order_by(*_newest(EVENTS))
    query = select(*EVENT_LIST_COLUMNS).where(
        LISTED.c.id.in_(page.limit(PAGE_SIZE + 1).scalar_subquery())
    )
    async with engine.connect() as conn:
        rows = sorted(await conn.execute(query), key=lambda r: (r.received_at, r.id), reverse=True)
    return _split(rows, "received_at", "id")


def _event_conditions(where: EventFilter) -> list[Any]:
    conditions = []
    if where.source:
        conditions.append(EVENTS.c.source == where.source)
    if where.kind:
        conditions.append(EVENTS.c.kind == where.kind)
    if where.event:
        conditions.append(EVENTS.c.event_name == where.event)
    if where.platform_id:
        conditions.append(EVENTS.c.platform_id == where.platform_id)
    return conditions + _time_range(EVENTS.c.received_at, where.since, where.until)


async def newer_count(
    engine: AsyncEngine, where: EventFilter | DeliveryFilter, after: Cursor | None
) -> int:
    """How many rows of a list filtered by ``where`` lie above ``after`` (the newest row a
    page showed; every row without it), counted up to :data:`BACKLOG_CAP` and one more on
    the list's index, as a page reads it."""
    if isinstance(where, EventFilter):
        table, moment, conditions = EVENTS, EVENTS.c.received_at, _event_conditions(where)
    else:
        table, moment, conditions = DELIVERIES, DELIVERIES.c.created_at, _delivery_conditions(where)
    if after is not None:
        conditions.append(
            tuple_(moment, table.c.id)
            > tuple_(literal(after.moment, moment.type), literal(after.id, table.c.id.type))
        )
    above = select(table.c.id).where(*conditions).limit(BACKLOG_CAP + 1).subquery()
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(above)) or 0)


async def delivery_statuses(
    engine: AsyncEngine, event_ids: Sequence[str]
) -> dict[str, dict[str, int]]:
    """For each event, how many of its deliveries are in each status."""
    if not event_ids:
        return {}
    query = (
        select(DELIVERIES.c.event_id, DELIVERIES.c.status, func.count())
        .where(DELIVERIES.c.event_id.in_(list(event_ids)))
        .group_by(DELIVERIES.c.event_id, DELIVERIES.c.status)
    )
    statuses: dict[str, dict[str, int]] = {}
    async with engine.connect() as conn:
        for event_id, status, count in await conn.execute(query):
            statuses.setdefault(event_id, {})[status] = count
    return statuses


async def event_detail(
    engine: AsyncEngine, event_id: str
) -> tuple[Row[Any], list[Row[Any]], dict[str, list[Row[Any]]]] | None:
    """An event, its deliveries and each delivery's kept attempts."""
    async with engine.connect() as conn:
        event = (await conn.execute(select(EVENTS).where(EVENTS.c.id == event_id))).first()
        if event is None:
            return None
        deliveries = list(
            await conn.execute(
                select(DELIVERIES, *order_flags())
                .where(DELIVERIES.c.event_id == event_id)
                .order_by(DELIVERIES.c.destination)
            )
        )
        attempts: dict[str, list[Row[Any]]] = {d.id: [] for d in deliveries}
        if deliveries:
            rows = await conn.execute(
                select(ATTEMPTS)
                .where(ATTEMPTS.c.delivery_id.in_(list(attempts)))
                .order_by(ATTEMPTS.c.delivery_id, ATTEMPTS.c.number)
            )
            for attempt in rows:
                attempts[attempt.delivery_id].append(attempt)
    return event, deliveries, attempts


async def deliveries_page(engine: AsyncEngine, where: DeliveryFilter) -> Page:
    """Deliveries matching ``where``, newest first, with their event's kind and platform id."""
    query = select(
        DELIVERIES.c.id,
        DELIVERIES.c.event_id,
        DELIVERIES.c.destination,
        DELIVERIES.c.status,
        DELIVERIES.c.attempts,
        DELIVERIES.c.created_at,
        DELIVERIES.c.next_attempt_at,
        DELIVERIES.c.last_status_code,
        DELIVERIES.c.last_error,
        LISTED.c.kind,
        LISTED.c.platform_id,
        *order_flags(),
    ).join(LISTED, LISTED.c.id == DELIVERIES.c.event_id)
    conditions = _delivery_conditions(where)
    return await _page(
        engine, query, conditions, DELIVERIES.c.created_at, DELIVERIES.c.id, where.before
    )


async def delivery_in_line(engine: AsyncEngine, delivery_id: str) -> tuple[Row[Any], int] | None:
    """A delivery with its event's kind and platform id, and how many later deliveries of its
    per-key line wait behind it (what giving it up lets go)."""
    query = select(DELIVERIES, EVENTS.c.kind, EVENTS.c.platform_id, EVENTS.c.received_at).join(
        EVENTS, EVENTS.c.id == DELIVERIES.c.event_id
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query.where(DELIVERIES.c.id == delivery_id))).first()
        if row is None:
            return None
        if row.order_key is None:
            return row, 0
        behind = select(func.count()).select_from(DELIVERIES).where(waiting_behind(row))
        return row, int(await conn.scalar(behind) or 0)


async def count_deliveries(engine: AsyncEngine, where: DeliveryFilter) -> int:
    """How many deliveries match ``where`` (the bulk replay's confirmation): exact, as the
    replay is bound to it, and counted on an index alone (status or destination and status,
    then the creation time)."""
    query = select(func.count()).select_from(DELIVERIES).where(*_delivery_conditions(where))
    async with engine.connect() as conn:
        return int(await conn.scalar(query) or 0)


async def backlog_counts(
    engine: AsyncEngine, destinations: Sequence[str], statuses: Sequence[str]
) -> dict[str, dict[str, int]]:
    """Per destination and status, how many deliveries, counted up to :data:`BACKLOG_CAP`
    and one more (more than the cap shows as "1,000+"): each count reads at most that many
    entries of ``ix_deliveries_destination_status``, so the destinations page costs the same
    with a backlog of a million."""
    parts = [
        select(
            literal(name).label("destination"),
            literal(status).label("status"),
            select(func.count())
            .select_from(
                select(DELIVERIES.c.id)
                .where(DELIVERIES.c.destination == name, DELIVERIES.c.status == status)
                .limit(BACKLOG_CAP + 1)
                .subquery()
            )
            .scalar_subquery()
            .label("count"),
        )
        for name in destinations
        for status in statuses
    ]
    counts: dict[str, dict[str, int]] = {name: dict.fromkeys(statuses, 0) for name in destinations}
    if not parts:
        return counts
    async with engine.connect() as conn:
        for name, status, count in await conn.execute(union_all(*parts)):
            counts[name][status] = int(count)
    return counts


async def destination_states(engine: AsyncEngine) -> list[Row[Any]]:
    """Every destination's stored health (breaker, 410 switch)."""
    async with engine.connect() as conn:
        return list(await conn.execute(select(STATES)))


def _delivery_conditions(where: DeliveryFilter) -> list[Any]:
    conditions = []
    if where.status:
        conditions.append(DELIVERIES.c.status == where.status)
    if where.destination:
        conditions.append(DELIVERIES.c.destination == where.destination)
    return conditions + _time_range(DELIVERIES.c.created_at, where.since, where.until)


async def recent_outcomes(engine: AsyncEngine, now: datetime) -> dict[str, Recent]:
    """Per destination, among the deliveries attempted within :data:`RECENT` before ``now``
    (found through the attempts' time index, as the chart's are): those dead since, and those
    pending after a failed attempt (attempted since their last replay)."""
    since = now - RECENT
    dead = and_(DELIVERIES.c.status == DEAD, DELIVERIES.c.finished_at >= since)
    retrying = and_(
        DELIVERIES.c.status == PENDING, DELIVERIES.c.attempts > DELIVERIES.c.schedule_base
    )
    query = (
        select(
            DELIVERIES.c.destination,
            func.count(func.distinct(case((dead, DELIVERIES.c.id)))),
            func.count(func.distinct(case((retrying, DELIVERIES.c.id)))),
        )
        .join(DELIVERIES, DELIVERIES.c.id == ATTEMPTS.c.delivery_id)
        .where(ATTEMPTS.c.started_at > since, DELIVERIES.c.status.in_([DEAD, PENDING]))
        .group_by(DELIVERIES.c.destination)
    )
    async with engine.connect() as conn:
        return {
            name: Recent(dead=int(dead_count), retrying=int(retrying_count))
            for name, dead_count, retrying_count in await conn.execute(query)
        }


async def destination_health(engine: AsyncEngine, now: datetime) -> dict[str, list[HealthBucket]]:
    """The last hour of attempts per destination (up to ``now``) in five-minute buckets,
    oldest first."""
    span = CHART_SPAN / CHART_BUCKETS
    start = now - CHART_SPAN
    succeeded = case(
        (
            and_(
                ATTEMPTS.c.error.is_(None),
                or_(ATTEMPTS.c.status_code.is_(None), ATTEMPTS.c.status_code.between(200, 299)),
            ),
            1,
        ),
        else_=0,
    )
    buckets: dict[str, list[HealthBucket]] = {}
    async with engine.connect() as conn:
        for index in range(CHART_BUCKETS):
            low, high = start + span * index, start + span * (index + 1)
            rows = await conn.execute(
                select(
                    DELIVERIES.c.destination,
                    func.count(),
                    func.sum(succeeded),
                    func.avg(ATTEMPTS.c.duration_ms),
                )
                .join(DELIVERIES, DELIVERIES.c.id == ATTEMPTS.c.delivery_id)
                .where(ATTEMPTS.c.started_at > low, ATTEMPTS.c.started_at <= high)
                .group_by(DELIVERIES.c.destination)
            )
            seen = {row[0]: row for row in rows}
            for name in set(buckets) | set(seen):
                series = buckets.setdefault(
                    name, [HealthBucket(start + span * i, 0, 0, None) for i in range(index)]
                )
                row = seen.get(name)
                series.append(
                    HealthBucket(
                        low,
                        int(row[1]) if row else 0,
                        int(row[2] or 0) if row else 0,
                        float(row[3]) if row and row[3] is not None else None,
                    )
                )
    return buckets


async def median_latency(engine: AsyncEngine, now: datetime) -> dict[str, float]:
    """Per destination, the median (p50, nearest rank: the lower of the two middle ones for
    an even number) duration of its attempts in the hour up to ``now``. The hour's attempts
    are found through their time index, as the chart's are; only the medians leave the
    database."""
    ranked = (
        select(
            DELIVERIES.c.destination,
            ATTEMPTS.c.duration_ms,
            func.row_number()
            .over(partition_by=DELIVERIES.c.destination, order_by=ATTEMPTS.c.duration_ms)
            .label("rank"),
            func.count().over(partition_by=DELIVERIES.c.destination).label("total"),
        )
        .join(DELIVERIES, DELIVERIES.c.id == ATTEMPTS.c.delivery_id)
        .where(ATTEMPTS.c.started_at > now - CHART_SPAN, ATTEMPTS.c.started_at <= now)
        .subquery()
    )
    query = select(ranked.c.destination, ranked.c.duration_ms).where(
        ranked.c.rank == (ranked.c.total + 1) // 2
    )
    async with engine.connect() as conn:
        return {name: float(duration) for name, duration in await conn.execute(query)}


async def quarantine_page(engine: AsyncEngine, before: Cursor | None) -> Page:
    """Quarantined bodies, the most recently seen first."""
    query = select(
        REJECTED.c.id,
        REJECTED.c.source,
        REJECTED.c.path,
        REJECTED.c.kind,
        REJECTED.c.status,
        REJECTED.c.reason,
        REJECTED.c.count,
        REJECTED.c.last_seen_at,
    )
    return await _page(engine, query, [], REJECTED.c.last_seen_at, REJECTED.c.id, before)


async def rejected_body(engine: AsyncEngine, rejected_id: str) -> Row[Any] | None:
    """One quarantined body."""
    async with engine.connect() as conn:
        return (await conn.execute(select(REJECTED).where(REJECTED.c.id == rejected_id))).first()


async def _page(
    engine: AsyncEngine,
    query: Select[Any],
    conditions: list[Any],
    moment: Column[Any],
    key: Column[Any],
    before: Cursor | None,
) -> Page:
    if before is not None:
        conditions = [*conditions, _below(moment, key, before)]
    statement = query.where(*conditions).order_by(moment.desc(), key.desc()).limit(PAGE_SIZE + 1)
    async with engine.connect() as conn:
        rows = list(await conn.execute(statement))
    return _split(rows, moment.name, key.name)


def _newest(table: Any) -> tuple[Any, Any]:
    return table.c.received_at.desc(), table.c.id.desc()


def _below(moment: Column[Any], key: Column[Any], before: Cursor) -> Any:
    """Rows after the cursor in the list's order: one row-value comparison, an index range."""
    return tuple_(moment, key) < tuple_(
        literal(before.moment, moment.type), literal(before.id, key.type)
    )


def _split(rows: list[Row[Any]], moment: str, key: str) -> Page:
    """Up to a page of ``rows`` (fetched one more than a page) and the next page's cursor."""
    if len(rows) <= PAGE_SIZE:
        return Page(rows, None)
    last = rows[PAGE_SIZE - 1]
    return Page(rows[:PAGE_SIZE], Cursor(last._mapping[moment], last._mapping[key]))


def _time_range(column: Column[Any], since: datetime | None, until: datetime | None) -> list[Any]:
    conditions = []
    if since is not None:
        conditions.append(column >= since)
    if until is not None:
        conditions.append(column < until)
    return conditions
