"""Per-key ordering in SQL: which deliveries must wait for others, and which one goes next.

A destination with ``ordering = "per-key"`` gives each delivery an order key
(:mod:`relay.outbox.order_keys`) and its event's arrival time (``arrived_at``). Its deliveries of
one key form a line, in arrival order (``arrived_at``, then the event id): a delivery may be claimed
only when no delivery ahead of it in its line is unfinished (pending, whatever it waits for,
or held), and no earlier event of the same platform id is still unrouted (stored, but its
deliveries not yet created: a receiver process that died, or another replica still routing).

The rule is part of the claim's conditional UPDATE and of the sweeper's due query, so it holds
across workers and survives a killed one: the truth is in SQL, never in a worker's memory. When
a delivery of a key succeeds or goes dead, the same transaction looks up the delivery now first
in its line (:func:`first_in_line`), which the worker claims in that transaction and attempts
next in the same job (or, past the job's bound, enqueues as a job of its own); the sweeper finds
any that such a hand-over missed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import CompoundSelect, and_, case, exists, false, or_, select, tuple_, union_all
from sqlalchemy.engine import Row
from sqlalchemy.sql.elements import ColumnElement, Label

from receivers.store import ReceivedEvent
from relay.outbox.tables import DEAD, HELD, PENDING, Delivery, RoutedEvent

DELIVERIES = Delivery.__table__
EVENTS = ReceivedEvent.__table__
ROUTED = RoutedEvent.__table__
UNFINISHED = (PENDING, HELD)


def _before(at: Any, tie: Any, other_at: Any, other_tie: Any) -> ColumnElement[bool]:
    return or_(at < other_at, and_(at == other_at, tie < other_tie))


@functools.cache
def free_to_go() -> ColumnElement[bool]:
    """For a row of ``deliveries``: true unless it has an order key and must wait its turn.
    Built once (an expression is immutable): its aliases of two wide tables took 3-4 ms to
    build, more than the claim's SQL."""
    ahead = DELIVERIES.alias("ahead")
    unfinished_ahead = exists().where(
        ahead.c.destination == DELIVERIES.c.destination,
        ahead.c.order_key == DELIVERIES.c.order_key,
        ahead.c.status.in_(UNFINISHED),
        _before(
            ahead.c.arrived_at, ahead.c.event_id, DELIVERIES.c.arrived_at, DELIVERIES.c.event_id
        ),
    )
    # Its own event's platform id and arrival are scalar subqueries by id, so that its earlier
    # events are one range of ix_received_events_platform_id (platform_id, received_at, id).
    # Joined instead, PostgreSQL (estimating that hardly any event is unrouted) planned a hash
    # anti-join of every event against routed_events first: 1.5 s a row at a million events.
    mine, earlier = EVENTS.alias("mine"), EVENTS.alias("earlier")

    def of_mine(column: Any) -> Any:
        by_id = select(column).where(mine.c.id == DELIVERIES.c.event_id)
        return by_id.correlate(DELIVERIES).scalar_subquery()

    unrouted_earlier = exists().where(
        earlier.c.platform_id == of_mine(mine.c.platform_id),
        tuple_(earlier.c.received_at, earlier.c.id)
        < tuple_(of_mine(mine.c.received_at), DELIVERIES.c.event_id),
        ~exists().where(ROUTED.c.event_id == earlier.c.id),
    )
    return or_(DELIVERIES.c.order_key.is_(None), ~or_(unfinished_ahead, unrouted_earlier))


def waiting_behind(delivery: Any) -> ColumnElement[bool]:
    """For a row of ``deliveries``: whether it is unfinished and behind ``delivery`` (a row
    with its destination, order key, arrival and event id) in that delivery's line."""
    return and_(
        DELIVERIES.c.destination == delivery.destination,
        DELIVERIES.c.order_key == delivery.order_key,
        DELIVERIES.c.status.in_(UNFINISHED),
        _before(
            delivery.arrived_at, delivery.event_id, DELIVERIES.c.arrived_at, DELIVERIES.c.event_id
        ),
    )


LINES_PER_QUERY = 100
"""How many lines one :func:`first_in_line` query looks up (two members each: SQLite takes at
most 500 in one compound SELECT)."""


def first_in_line(lines: Sequence[tuple[str, str]]) -> CompoundSelect:
    """Candidates for the first unfinished delivery of each (destination, order key) line: its
    first pending and its first held delivery, each one short range of ``ix_deliveries_order``
    read in arrival order up to its first row, however long the line (a window over the whole
    line took 2-4 ms per look-up at 2,000 deliveries). :func:`first_of_each` picks the earlier
    of each line. Columns: line, id, attempts, status, next attempt, lease, arrival, event id."""
    members = []
    for destination, key in lines:
        for status in UNFINISHED:
            first = (
                select(
                    DELIVERIES.c.destination,
                    DELIVERIES.c.order_key,
                    DELIVERIES.c.id,
                    DELIVERIES.c.attempts,
                    DELIVERIES.c.status,
                    DELIVERIES.c.next_attempt_at,
                    DELIVERIES.c.leased_until,
                    DELIVERIES.c.arrived_at,
                    DELIVERIES.c.event_id,
                )
                .where(
                    DELIVERIES.c.destination == destination,
                    DELIVERIES.c.order_key == key,
                    DELIVERIES.c.status == status,
                )
                .order_by(DELIVERIES.c.arrived_at, DELIVERIES.c.event_id)
                .limit(1)
                .subquery()
            )
            members.append(select(first))
    return union_all(*members)


def first_of_each(rows: Iterable[Row[Any]]) -> dict[tuple[str, str], Row[Any]]:
    """The first in arrival order of each line among :func:`first_in_line`'s rows."""
    first: dict[tuple[str, str], Row[Any]] = {}
    for row in rows:
        line = (row.destination, row.order_key)
        ahead = first.get(line)
        if ahead is None or (row.arrived_at, row.event_id) < (ahead.arrived_at, ahead.event_id):
            first[line] = row
    return first


def order_flags() -> list[Label[bool]]:
    """What operators see of a delivery's line, as two columns for a query over
    ``deliveries``: ``out_of_order_if_replayed`` (dead, and a later delivery of its line has
    been attempted since: replayed, it would arrive after that one) and ``waiting_in_line``
    (pending, and not free to go: an earlier delivery of its line comes first).

    Each is a CASE, so that its subqueries run only for the rows it is about: SQLite evaluates
    both sides of an AND in a result column, and the line's checks read the delivery's event
    row (on a page of 1 MiB events, 2 MiB for each row listed)."""
    ordered = DELIVERIES.c.order_key.is_not(None)
    return [
        case((and_(DELIVERIES.c.status == DEAD, ordered), _overtaken()), else_=false()).label(
            "out_of_order_if_replayed"
        ),
        case((and_(DELIVERIES.c.status == PENDING, ordered), ~free_to_go()), else_=false()).label(
            "waiting_in_line"
        ),
    ]


def _overtaken() -> ColumnElement[bool]:
    behind = DELIVERIES.alias("behind")
    return and_(
        DELIVERIES.c.order_key.is_not(None),
        exists().where(
            behind.c.destination == DELIVERIES.c.destination,
            behind.c.order_key == DELIVERIES.c.order_key,
            behind.c.attempts > 0,
            _before(
                DELIVERIES.c.arrived_at,
                DELIVERIES.c.event_id,
                behind.c.arrived_at,
                behind.c.event_id,
            ),
        ),
    )
