"""A clock that never runs past what ``datetime`` can hold: at a very small time scale, platform
time reaches the year 9999 after days of running, where a plain scaled clock raises
OverflowError on every ``now()``. Time stops at :data:`LAST` instead."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from relay.simulator.clocks import Clock

LAST = datetime(9000, 1, 1, tzinfo=UTC)
"""Platform time stops here (far enough from 9999 for a year's schedules on top)."""


class BoundedClock:
    """Satisfies :class:`relay.simulator.clocks.Clock`: ``inner``'s time, held at :data:`LAST`."""

    def __init__(self, inner: Clock) -> None:
        self.inner = inner

    def now(self) -> datetime:
        try:
            return min(self.inner.now(), LAST)
        except OverflowError:
            return LAST

    async def sleep_until(self, when: datetime) -> None:
        if when > LAST:
            await asyncio.Event().wait()  # never: time stops at LAST
        try:
            await self.inner.sleep_until(when)
        except OverflowError:
            await asyncio.Event().wait()
