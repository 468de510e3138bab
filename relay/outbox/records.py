"""The outbox's records in SQL: the rows it hands around, claiming due deliveries (a lease),
recording attempts, and each destination's health.

Every state change of a delivery is one transaction. A delivery is attempted only by the worker
holding its lease (an atomic conditional UPDATE), so two workers never attempt it at once; a lease
that outlives a killed worker simply expires and the sweeper hands the delivery out again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, delete, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from receivers.store import ReceivedEvent
from relay.outbox.ordering import LINES_PER_QUERY, first_in_line, first_of_each, free_to_go
from relay.outbox.tables import (
    DEAD,
    PENDING,
    SUCCEEDED,
    Delivery,
    DeliveryAttempt,
    DestinationState,
    RoutedEvent,
)

EVENTS = ReceivedEvent.__table__
ROUTED = RoutedEvent.__table__
DELIVERIES = Delivery.__table__
ATTEMPTS = DeliveryAttempt.__table__
STATES = DestinationState.__table__

KEEP_FIRST_ATTEMPTS = 3
KEEP_LAST_ATTEMPTS = 20
CLOCK_SKEW = timedelta(seconds=1)
LOOKUP_CHUNK = 500
"""How many delivery ids one query looks up (well within every driver's parameter limit)."""
JOB_BATCH = 50
"""How many new deliveries of one routing pass share one arq job (see
:func:`relay.outbox.routing.route_events`)."""
RELAY_WRITES = "the relay's writes"
"""What the relay's :class:`~receivers.store.writable.StoreWritable` calls them in the log."""


HealthChange = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""A pure change of a destination's health row (consecutive_failures, paused_until, disabled)."""


@dataclass(frozen=True)
class EventRef:
    """What routing needs of an event."""

    id: str
    source: str
    kind: str
    payload: Mapping[str, Any]
    received_at: datetime | None = None
    """When it arrived (its place in per-key lines); None: the routing time stands in."""


@dataclass(frozen=True)
class Due:
    """A delivery that needs a job: its id, its attempt count (part of the job id), and when;
    ``job`` names the batch job that carries it with others (first attempts only)."""

    id: str
    attempts: int
    at: datetime
    job: str | None = None


@dataclass(frozen=True)
class Claim:
    """A leased delivery with everything needed to attempt it."""

    delivery: Row[Any]
    event: Row[Any]
    health: Row[Any] | None
    token: str


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt did."""

    started_at: datetime
    duration_ms: float
    status_code: int | None
    error: str | None
    response_excerpt: str | None


@dataclass(frozen=True)
class AttemptRecord:
    """What :func:`record_attempts` writes for one claimed delivery."""

    claimed: Claim
    result: AttemptResult
    status: str
    next_attempt_at: datetime | None
    health_change: HealthChange | None = None
    claim_next: bool = False
    """Whether the transaction that writes it also claims the delivery its end lets go next
    in its per-key line (see :class:`relay.delivery.deliverer.Deliverer`)."""


def _insert(conn: AsyncConnection, table: Any) -> Any:
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(table)


async def due_deliveries(
    engine: AsyncEngine, now: datetime, limit: int, after: Due | None = None
) -> list[Due]:
    """Pending deliveries that are due, not leased and free to go (not waiting their turn in a
    per-key line), whether a job exists for them or not, oldest first; pass the last one of a
    page as ``after`` for the next page."""
    query = select(
        DELIVERIES.c.id, DELIVERIES.c.attempts, DELIVERIES.c.next_attempt_at, DELIVERIES.c.job_id
    ).where(
        DELIVERIES.c.status == PENDING,
        DELIVERIES.c.next_attempt_at <= now,
        or_(DELIVERIES.c.leased_until.is_(None), DELIVERIES.c.leased_until < now),
        free_to_go(),
    )
    if after is not None:
        query = query.where(
            or_(
                DELIVERIES.c.next_attempt_at > after.at,
                and_(DELIVERIES.c.next_attempt_at == after.at, DELIVERIES.c.id > after.id),
            )
        )
    query = query.order_by(DELIVERIES.c.next_attempt_at, DELIVERIES.c.id).limit(limit)
    async with engine.connect() as conn:
        return [
            Due(r.id, r.attempts, r.next_attempt_at, r.job_id) for r in await conn.execute(query)
        ]


async def claim_many(
    engine: AsyncEngine, delivery_ids: Sequence[str], now: datetime, lease: timedelta
) -> dict[str, Claim]:
    """Lease those of the deliveries that are due, free and not waiting their turn in a per-key
    line (:mod:`relay.outbox.ordering`), in one transaction (one conditional UPDATE), and read their
    events and destinations' health; keyed by delivery id."""
    async with engine.begin() as conn:
        return await claim_on(conn, delivery_ids, now, lease)


async def claim_on(
    conn: AsyncConnection, delivery_ids: Sequence[str], now: datetime, lease: timedelta
) -> dict[str, Claim]:
    """:func:`claim_many` in the caller's transaction."""
    token = str(uuid.uuid4())
    statement = (
        update(DELIVERIES)
        .where(
            DELIVERIES.c.id.in_(list(delivery_ids)),
            DELIVERIES.c.status == PENDING,
            DELIVERIES.c.next_attempt_at <= now + CLOCK_SKEW,
            or_(DELIVERIES.c.leased_until.is_(None), DELIVERIES.c.leased_until < now),
            free_to_go(),
        )
        .values(leased_until=now + lease, lease_token=token)
        .returning(*DELIVERIES.c)
    )
    deliveries = (await conn.execute(statement)).all()
    if not deliveries:
        return {}
    event_ids = list({d.event_id for d in deliveries})
    names = list({d.destination for d in deliveries})
    health_query = select(
        STATES.c.name, STATES.c.consecutive_failures, STATES.c.paused_until, STATES.c.disabled
    ).where(STATES.c.name.in_(names))
    events = {e.id: e for e in await conn.execute(select(EVENTS).where(EVENTS.c.id.in_(event_ids)))}
    health = {h.name: h for h in await conn.execute(health_query)}
    return {
        d.id: Claim(d, events[d.event_id], health.get(d.destination), token) for d in deliveries
    }


async def release(
    engine: AsyncEngine,
    claimed: Claim,
    *,
    status: str,
    next_attempt_at: datetime | None,
    error: str | None = None,
) -> bool:
    """Give the lease back without an attempt: wait (paused destination) or hold (disabled)."""
    values: dict[str, Any] = {
        "status": status,
        "next_attempt_at": next_attempt_at,
        "leased_until": None,
        "lease_token": None,
    }
    if error is not None:
        values["last_error"] = error[:1000]
    async with engine.begin() as conn:
        result = await conn.execute(_owned(claimed).values(**values))
    return result.rowcount == 1


async def record_attempts(engine: AsyncEngine, records: Sequence[AttemptRecord]) -> list[bool]:
    """Store each record's attempt, its delivery's new state and (when given) its destination's
    health change, all in one transaction; per record, ``False`` when its lease was lost
    meanwhile (nothing of it written)."""
    try:
        async with engine.begin() as conn:
            return await record_on(conn, records)
    except LeaseLost:
        async with engine.begin() as conn:
            return await record_on(conn, records, one_by_one=True)


class LeaseLost(Exception):
    """A grouped record found a lease gone; the transaction must be rolled back and the
    records written one by one (which tells which one)."""


async def record_on(
    conn: AsyncConnection, records: Sequence[AttemptRecord], *, one_by_one: bool = False
) -> list[bool]:
    """:func:`record_attempts` in the caller's transaction. Health changes of one destination
    are applied in order, as one read-modify-write of its row. Where the driver counts the rows
    of a parameter list, the deliveries are one statement and a lost lease raises
    :class:`LeaseLost`; otherwise (or ``one_by_one``) one statement each, and a lost lease
    answers ``False``."""
    params = [_record_params(record) for record in records]
    if len(params) > 1 and not one_by_one and conn.dialect.supports_sane_multi_rowcount:
        if (await conn.execute(_RECORD, params)).rowcount != len(params):
            raise LeaseLost(f"a lease was lost among {len(params)} deliveries")
        owned = [True] * len(params)
    else:
        owned = [(await conn.execute(_RECORD, p)).rowcount == 1 for p in params]
    attempts: list[dict[str, Any]] = []
    changes: dict[str, list[tuple[HealthChange, datetime]]] = {}
    for record, mine in zip(records, owned, strict=True):
        if not mine:
            continue
        delivery, result = record.claimed.delivery, record.result
        number = delivery.attempts + 1
        attempts.append(
            {
                "delivery_id": delivery.id,
                "number": number,
                "started_at": result.started_at,
                "duration_ms": result.duration_ms,
                "status_code": result.status_code,
                "error": result.error and result.error[:1000],
                "response_excerpt": result.response_excerpt and result.response_excerpt[:1024],
            }
        )
        if number > KEEP_FIRST_ATTEMPTS + KEEP_LAST_ATTEMPTS:
            await conn.execute(
                delete(ATTEMPTS).where(
                    ATTEMPTS.c.delivery_id == delivery.id,
                    ATTEMPTS.c.number > KEEP_FIRST_ATTEMPTS,
                    ATTEMPTS.c.number <= number - KEEP_LAST_ATTEMPTS,
                )
            )
        if record.health_change is not None:
            changes.setdefault(delivery.destination, []).append(
                (record.health_change, _finished(result))
            )
    if attempts:
        await conn.execute(insert(ATTEMPTS), attempts)
    for name, steps in changes.items():
        health: Mapping[str, Any] = await _health_for_update(conn, name)
        for change, _ in steps:
            health = change(health)
        await _save_health(conn, name, health, max(at for _, at in steps))
    return owned


async def next_in_line(
    conn: AsyncConnection, finished: Sequence[Row[Any]], now: datetime
) -> dict[tuple[str, str], Due]:
    """After deliveries with order keys finished (succeeded or dead) in this transaction: for
    each of their (destination, order key) lines, the delivery now first in line, if it is
    pending, due and not leased: its job, due when it was (ahead of newer jobs)."""
    lines = list({(d.destination, d.order_key) for d in finished if d.order_key is not None})
    found: dict[tuple[str, str], Due] = {}
    for start in range(0, len(lines), LINES_PER_QUERY):
        chunk = lines[start : start + LINES_PER_QUERY]
        for row in first_of_each(await conn.execute(first_in_line(chunk))).values():
            free = row.leased_until is None or row.leased_until < now
            if row.status == PENDING and row.next_attempt_at <= now and free:
                found[(row.destination, row.order_key)] = Due(
                    row.id, row.attempts, row.next_attempt_at
                )
    return found


def _finished(result: AttemptResult) -> datetime:
    return result.started_at + timedelta(milliseconds=result.duration_ms)


def _record_params(record: AttemptRecord) -> dict[str, Any]:
    delivery, result = record.claimed.delivery, record.result
    return {
        "b_id": delivery.id,
        "b_token": record.claimed.token,
        "b_status": record.status,
        "b_attempts": delivery.attempts + 1,
        "b_first": delivery.first_attempt_at or result.started_at,
        "b_last": result.started_at,
        "b_next": record.next_attempt_at,
        "b_finished": _finished(result) if record.status in (SUCCEEDED, DEAD) else None,
        "b_code": result.status_code,
        "b_error": (result.error or None) and result.error[:1000],
    }


_RECORD = (
    update(DELIVERIES)
    .where(DELIVERIES.c.id == bindparam("b_id"), DELIVERIES.c.lease_token == bindparam("b_token"))
    .values(
        status=bindparam("b_status"),
        attempts=bindparam("b_attempts"),
        first_attempt_at=bindparam("b_first"),
        last_attempt_at=bindparam("b_last"),
        next_attempt_at=bindparam("b_next"),
        finished_at=bindparam("b_finished"),
        last_status_code=bindparam("b_code"),
        last_error=bindparam("b_error"),
        leased_until=None,
        lease_token=None,
    )
)
"""One delivery's new state after an attempt, only while its lease is still this claim's."""


async def update_health(
    engine: AsyncEngine, name: str, change: HealthChange, now: datetime
) -> Mapping[str, Any]:
    """Apply ``change(current) -> new`` to a destination's health atomically (row lock on
    PostgreSQL; SQLite has a single writer) and return the new health."""
    async with engine.begin() as conn:
        current = await _health_for_update(conn, name)
        new = change(current)
        await _save_health(conn, name, new, now)
    return new


async def _health_for_update(conn: AsyncConnection, name: str) -> dict[str, Any]:
    await conn.execute(
        _insert(conn, STATES)
        .values(name=name, consecutive_failures=0, disabled=False)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    row = (await conn.execute(select(STATES).where(STATES.c.name == name).with_for_update())).one()
    return dict(row._mapping)


async def _save_health(
    conn: AsyncConnection, name: str, health: Mapping[str, Any], now: datetime
) -> None:
    values = {
        "consecutive_failures": health["consecutive_failures"],
        "paused_until": health["paused_until"],
        "disabled": health["disabled"],
        "disabled_reason": health.get("disabled_reason"),
        "updated_at": now,
    }
    statement = _insert(conn, STATES).values(name=name, **values)
    await conn.execute(statement.on_conflict_do_update(index_elements=["name"], set_=values))


async def release_on(conn: AsyncConnection, claims: Sequence[Claim]) -> None:
    """Give leases back unused (the delivery stays due as it was), in the caller's transaction."""
    await conn.execute(_RELEASE, [{"b_id": c.delivery.id, "b_token": c.token} for c in claims])


_RELEASE = (
    update(DELIVERIES)
    .where(DELIVERIES.c.id == bindparam("b_id"), DELIVERIES.c.lease_token == bindparam("b_token"))
    .values(leased_until=None, lease_token=None)
)


def _owned(claimed: Claim) -> Any:
    return update(DELIVERIES).where(
        DELIVERIES.c.id == claimed.delivery.id, DELIVERIES.c.lease_token == claimed.token
    )
