"""A clock that a test moves by hand: time stands still between ``advance`` calls.

The simulator's clocks (:mod:`relay.simulator.clocks`) either follow real time, compressed, or
jump to whatever time is awaited; a test that wants to look at the sandbox half-way through a
schedule (a message still BUFFERED) needs time to stop instead.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class SteppedClock:
    """Satisfies :class:`relay.simulator.clocks.Clock`; ``sleep_until`` returns once a test
    has moved the time that far."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)
        self._moved = asyncio.Event()

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        """Move time forward by ``delta`` (not backwards) and wake the sleepers now due."""
        if delta < timedelta(0):
            raise ValueError("time only moves forward")
        self._now += delta
        self._moved.set()
        self._moved = asyncio.Event()

    async def sleep_until(self, when: datetime) -> None:
        while self._now < when:
            await self._moved.wait()
