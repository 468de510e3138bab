"""Giving deliveries up: an operator makes pending or held deliveries dead now.

The way to unblock a per-key line whose first delivery keeps failing (it would hold every later
delivery of its key for its whole schedule). No attempt is made or counted; the delivery's last
error says who gave it up and why; the next delivery of its line is found in the same
transaction, for the caller to enqueue at once. A delivery being attempted at that moment loses
its lease with it: its attempt's record is not written (:func:`relay.outbox.record_on` writes
only while the lease is the attempt's), so it stays dead. ``relay deliveries replay`` brings a
given-up delivery back like any dead one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.outbox import DELIVERIES, LOOKUP_CHUNK, Due, next_in_line
from relay.outbox.tables import DEAD, HELD, PENDING

GIVABLE = (PENDING, HELD)
"""The statuses a delivery can be given up from; the others are final."""
LONGEST_REASON = 200
LONGEST_NAME = 64


@dataclass
class GivenUp:
    """What :func:`give_up` did with each id it was given."""

    given_up: list[str] = field(default_factory=list)
    finished: dict[str, str] = field(default_factory=dict)
    """Ids left alone because they were final already, with their status."""
    unknown: list[str] = field(default_factory=list)
    next_in_line: list[Due] = field(default_factory=list)
    """The jobs of the deliveries that now come first in the lines of those given up, if they
    are due (per-key ordering): to enqueue at once."""


def checked_text(value: str, longest: int) -> str:
    """``value`` stripped, if it can go into a delivery's last error; else ValueError saying
    why (empty, too long, control characters)."""
    text = value.strip()
    if not text:
        raise ValueError("empty")
    if len(text) > longest:
        raise ValueError(f"at most {longest} characters")
    if not text.isprintable():
        raise ValueError("control characters are not allowed")
    return text


def note(by: str, reason: str | None) -> str:
    """The last error of a delivery ``by`` gave up: ``given up by <by>[: <reason>]``."""
    return f"given up by {by}: {reason}" if reason else f"given up by {by}"


async def give_up(
    engine: AsyncEngine,
    now: datetime,
    delivery_ids: Sequence[str],
    *,
    by: str,
    reason: str | None = None,
) -> GivenUp:
    """Make each pending or held delivery of ``delivery_ids`` dead at ``now`` (its lease, if
    any, given up with it); final ones and unknown ids are reported, left alone. Works
    :data:`~relay.outbox.LOOKUP_CHUNK` ids per transaction; an id given twice counts once."""
    last_error = note(
        checked_text(by, LONGEST_NAME), checked_text(reason, LONGEST_REASON) if reason else None
    )
    result = GivenUp()
    targets = list(dict.fromkeys(delivery_ids))
    for start in range(0, len(targets), LOOKUP_CHUNK):
        chunk = targets[start : start + LOOKUP_CHUNK]
        statement = (
            update(DELIVERIES)
            .where(DELIVERIES.c.id.in_(chunk), DELIVERIES.c.status.in_(GIVABLE))
            .values(
                status=DEAD,
                finished_at=now,
                next_attempt_at=None,
                leased_until=None,
                lease_token=None,
                last_status_code=None,
                last_error=last_error,
            )
            .returning(DELIVERIES.c.id, DELIVERIES.c.destination, DELIVERIES.c.order_key)
        )
        async with engine.begin() as conn:
            ended = (await conn.execute(statement)).all()
            lines = await next_in_line(conn, ended, now) if ended else {}
            done = {row.id for row in ended}
            others = [i for i in chunk if i not in done]
            found: dict[str, str] = {}
            if others:
                query = select(DELIVERIES.c.id, DELIVERIES.c.status).where(
                    DELIVERIES.c.id.in_(others)
                )
                found = {row.id: row.status for row in await conn.execute(query)}
        result.given_up += [i for i in chunk if i in done]
        result.finished.update(found)
        result.unknown += [i for i in others if i not in found]
        result.next_in_line += lines.values()
    return result
