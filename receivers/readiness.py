"""Whether the database answers, for ``/readyz``: one ping at a time, shared by every caller.

``/readyz`` needs no credentials, so anybody may call it as often as they like: requests that
arrive while a ping is under way wait for that ping's outcome instead of each taking a
connection of the pool that the callbacks need. A failing database is one log line when pings
start failing and one when they succeed again, not a line per request: the lines of the
callbacks' :class:`~receivers.store.writable.StoreWritable` when one is given (an unreachable
store is then one outage, whether callbacks or checks met it), else lines of its own.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.writable import StoreWritable

log = logging.getLogger(__name__)


class DatabasePing:
    """``await ping()``: returns once the database has answered ``SELECT 1`` within
    ``timeout`` seconds, else raises; concurrent calls share one ping."""

    def __init__(
        self, engine: AsyncEngine, timeout: float, writable: StoreWritable | None = None
    ) -> None:
        self._engine = engine
        self._timeout = timeout
        self._writable = writable
        self._pinging: asyncio.Task[None] | None = None
        self._failing = False

    async def __call__(self) -> None:
        pinging = self._pinging
        if pinging is None or pinging.done():
            pinging = self._pinging = asyncio.create_task(self._ping(), name="readiness-ping")
            pinging.add_done_callback(_retrieved)  # its callers may all have left meanwhile
        await asyncio.shield(pinging)

    async def _ping(self) -> None:
        try:
            async with asyncio.timeout(self._timeout), self._engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:
            if self._writable is not None and self._writable.failed(exc):
                raise  # the store's state says it, once
            if not self._failing:
                self._failing = True
                log.warning("readiness check failed: %s", type(exc).__name__)
            raise
        writable = self._writable
        if writable is not None and writable.refusal is not None and not writable.full:
            writable.succeeded()  # it answers: no longer unreachable (a full one says so itself)
        if self._failing:
            self._failing = False
            log.info("readiness check: the database answers again")


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
