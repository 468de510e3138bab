"""Time for the simulator: real time with the schedule compressed, or virtual time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """The platform's idea of now, and a way to wait until a time."""

    def now(self) -> datetime: ...

    async def sleep_until(self, when: datetime) -> None: ...


class ScaledClock:
    """Platform time runs ``1 / scale`` times faster than real time: with ``scale=0.001`` a
    48 h schedule takes about 3 minutes."""

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("the time scale must be positive")
        self._scale = scale
        self._real_start = time.monotonic()
        self._start = datetime.now(UTC)

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._real_start) / self._scale)

    async def sleep_until(self, when: datetime) -> None:
        delay = (when - self.now()).total_seconds() * self._scale
        if delay > 0:
            await asyncio.sleep(delay)


class VirtualClock:
    """No waiting at all: sleeping moves time forward. ``tick`` is told each step, e.g. a
    freezegun ``frozen.tick`` so that the app under test sees the same time."""

    def __init__(
        self, start: datetime | None = None, tick: Callable[[timedelta], object] | None = None
    ) -> None:
        self._now = start or datetime.now(UTC)
        self._tick = tick

    def now(self) -> datetime:
        return self._now

    async def sleep_until(self, when: datetime) -> None:
        if when > self._now:
            step, self._now = when - self._now, when
            if self._tick is not None:
                self._tick(step)
