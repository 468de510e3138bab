"""The console's login throttle, kept in the database so that every replica shares its counts.

An attempt is counted as failed from the moment it starts (:meth:`LoginThrottle.begin`, under
a lock on its keys' rows) until it succeeds: attempts sent together cannot slip through the
same gap, whichever replica they reach. The rules are :mod:`relay.console.throttle_rule`'s.
The table stays bounded: keys are forgotten a day after their last attempt and, past
:data:`MAX_KEYS`, the least recently tried are dropped first (never the configured users').
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from relay.console.tables import LoginThrottleEntry
from relay.console.throttle_rule import FORGET_AFTER, LoginAttempt, delay_after

THROTTLE = LoginThrottleEntry.__table__
MAX_KEYS = 100_000
"""Keys kept at most, beyond the configured users' (checked every :data:`PRUNE_EVERY`)."""
PRUNE_EVERY = timedelta(minutes=1)


class LoginThrottle:
    """Counts console login attempts per key; one per console app, all sharing the table."""

    def __init__(
        self,
        engine: AsyncEngine,
        clock: Callable[[], datetime],
        *,
        kept_keys: Iterable[str] = (),
        max_keys: int = MAX_KEYS,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._kept_keys = sorted(set(kept_keys))
        self._max_keys = max_keys
        self._next_prune: datetime | None = None

    async def begin(self, attempt: LoginAttempt) -> int:
        """Start an attempt: 0 when it may go ahead (it then counts as failed until
        :meth:`succeeded`), else the seconds it must wait first (then nothing is counted)."""
        now = self._clock()
        async with self._engine.connect() as conn:  # a throttled attempt writes nothing
            rows = await conn.execute(select(THROTTLE).where(THROTTLE.c.key.in_(attempt.keys)))
            wait = _wait(rows.all(), now)
        if wait:
            return wait
        async with self._engine.begin() as conn:
            wait = await _count(conn, attempt.keys, now)
        if not wait:
            await self._prune_now_and_then(now)
        return wait

    async def succeeded(self, attempt: LoginAttempt) -> None:
        """The attempt was right: it no longer counts, and its device cookie (replaced by a
        new one) is forgotten."""
        async with self._engine.begin() as conn:
            await conn.execute(
                update(THROTTLE)
                .where(THROTTLE.c.key.in_(attempt.keys), THROTTLE.c.failures > 0)
                .values(failures=THROTTLE.c.failures - 1)
            )
            if attempt.device_key is not None:
                await conn.execute(delete(THROTTLE).where(THROTTLE.c.key == attempt.device_key))

    async def prune(self) -> int:
        """Drop forgotten keys, then the least recently tried beyond :data:`MAX_KEYS` (never a
        configured user's); how many were dropped."""
        now = self._clock()
        async with self._engine.begin() as conn:
            forgotten = await conn.execute(
                delete(THROTTLE).where(THROTTLE.c.updated_at < now - FORGET_AFTER)
            )
            dropped = forgotten.rowcount or 0
            others = THROTTLE.c.key.not_in(self._kept_keys)
            count = await conn.scalar(select(func.count()).select_from(THROTTLE).where(others))
            excess = (count or 0) - self._max_keys
            if excess > 0:
                oldest = (
                    select(THROTTLE.c.key)
                    .where(others)
                    .order_by(THROTTLE.c.updated_at, THROTTLE.c.key)
                    .limit(excess)
                )
                evicted = await conn.execute(delete(THROTTLE).where(THROTTLE.c.key.in_(oldest)))
                dropped += evicted.rowcount or 0
        return dropped

    async def _prune_now_and_then(self, now: datetime) -> None:
        if self._next_prune is not None and now < self._next_prune:
            return
        self._next_prune = now + PRUNE_EVERY
        await self.prune()


async def _count(conn: AsyncConnection, keys: Sequence[str], now: datetime) -> int:
    """Count an attempt against ``keys`` unless one of them makes it wait (the seconds)."""
    insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(THROTTLE)
    fresh = [{"key": key, "failures": 0, "updated_at": now} for key in keys]
    # a write first: SQLite's write lock is taken before the rows are read
    await conn.execute(insert.values(fresh).on_conflict_do_nothing(index_elements=["key"]))
    locked = select(THROTTLE).where(THROTTLE.c.key.in_(keys)).order_by(THROTTLE.c.key)
    rows = (await conn.execute(locked.with_for_update())).all()
    wait = _wait(rows, now)
    if wait:
        return wait
    for row in rows:
        failures = _failures(row, now) + 1
        delay = delay_after(failures)
        await conn.execute(
            update(THROTTLE)
            .where(THROTTLE.c.key == row.key)
            .values(
                failures=failures,
                blocked_until=now + delay if delay else None,
                updated_at=now,
            )
        )
    return 0


def _failures(row: Any, now: datetime) -> int:
    """The row's count, or 0 once it is forgotten."""
    return int(row.failures) if row.updated_at >= now - FORGET_AFTER else 0


def _wait(rows: Sequence[Any], now: datetime) -> int:
    """Whole seconds until every row lets an attempt through (0: now)."""
    until = [row.blocked_until for row in rows if row.blocked_until is not None]
    longest = max(until, default=now)
    if longest <= now:
        return 0
    return max(1, math.ceil((longest - now).total_seconds()))
