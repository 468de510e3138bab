"""The pruner: the worker's background pass that applies the ``retention`` setting.

Every worker (``relay worker``, or the one ``relay serve`` embeds) runs one when ``retention``
is set: a pass at start-up, then every :data:`PASS_INTERVAL`, removing what
:mod:`relay.store.retention` says may go at ``now - retention``. On PostgreSQL one pass runs at a
time across workers (a session advisory lock, tried: a worker that finds it taken leaves the
pass to its holder); elsewhere passes at once are harmless, since removing is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from relay.destinations.errors import describe_error
from relay.store import retention
from relay.store.retention import Pruned

log = logging.getLogger("relay.pruner")  # stable: users filter on it

PASS_INTERVAL = timedelta(hours=1)
PRUNE_LOCK = 0x72656C6179 + 1
"""PostgreSQL's advisory lock key of a pruning pass (next to the migrations' key)."""


class Pruner:
    """Removes what is older than ``retention`` at ``clock()``, once per ``interval``."""

    def __init__(
        self,
        engine: AsyncEngine,
        retention: timedelta,
        *,
        clock: Callable[[], datetime],
        interval: timedelta = PASS_INTERVAL,
    ) -> None:
        self._engine = engine
        self._retention = retention
        self._clock = clock
        self._interval = interval

    async def prune(self) -> Pruned | None:
        """One pass; None when another worker's pass holds the lock. A pass that removed
        something logs one line with its counts."""
        cutoff = self._clock() - self._retention
        started = time.monotonic()
        async with only_pass(self._engine) as alone:
            if not alone:
                return None
            pruned = await retention.prune(self._engine, cutoff)
        if pruned:
            log.info(
                "retention removed %s from before %s in %.1f s",
                pruned.describe(),
                cutoff.isoformat(timespec="seconds"),
                time.monotonic() - started,
            )
        return pruned

    async def run(self) -> None:
        """Prune now and then every interval, until cancelled; a failed pass is one warning
        line, and the next pass tries again."""
        while True:
            try:
                await self.prune()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "retention pass failed: %s; next pass in %s",
                    _one_line(exc),
                    self._interval,
                )
            await asyncio.sleep(self._interval.total_seconds())


def _one_line(exc: Exception) -> str:
    """A failure in a line: for a database error, the driver's own words (not the statement
    SQLAlchemy adds on lines of their own)."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return " ".join(describe_error(cause).split())


@asynccontextmanager
async def only_pass(engine: AsyncEngine) -> AsyncIterator[bool]:
    """Whether this is the only pass under way (always true but on PostgreSQL, where the
    answer is held in a session advisory lock until the block ends). The lock's connection
    stays outside any transaction meanwhile, so that it holds back no vacuum."""
    if engine.dialect.name != "postgresql":
        yield True
        return
    async with engine.connect() as conn:
        taken = text("SELECT pg_try_advisory_lock(:key)").bindparams(key=PRUNE_LOCK)
        alone = bool((await conn.execute(taken)).scalar_one())
        await conn.commit()
        try:
            yield alone
        finally:
            if alone:
                await _unlock(conn)


async def _unlock(conn: AsyncConnection) -> None:
    """Release the pass's lock; should that fail, the connection is dropped (its session's end
    releases the lock), never handed back to the pool still holding it."""
    try:
        await conn.execute(text("SELECT pg_advisory_unlock(:key)").bindparams(key=PRUNE_LOCK))
        await conn.commit()
    except BaseException:
        await conn.invalidate()
        raise
