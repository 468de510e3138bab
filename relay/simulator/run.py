"""Running a scenario many times: concurrency, rate, causal order or shuffled."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relay.simulator.platform import CallbackResult, Platform
from relay.simulator.scenarios import Callback, Scenario


@dataclass(frozen=True)
class RunOptions:
    """How many scenario instances, how fast, in which order."""

    count: int = 1
    concurrency: int = 10
    rate: float | None = None
    shuffle: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)


class Pacer:
    """Paces callbacks open-loop: with a ``rate``, callback ``i`` is due at ``start + i / rate``
    (start: the first call), whatever the answers before it took. A caller that comes late (its
    connection was busy) goes at once, and the ones after it keep their own due times: the
    schedule never drifts. Without a rate nothing waits. Either way it counts the callbacks it let
    go and when, for :attr:`achieved_rate`.

    ``now`` (seconds, monotonic) and ``sleep`` are injectable so that the schedule is tested
    without waiting."""

    def __init__(
        self,
        rate: float | None,
        *,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if rate is not None and not (0 < rate < math.inf):
            raise ValueError("the rate is a positive, finite number of callbacks per second")
        self.rate = rate
        self._interval = 1 / rate if rate else 0.0
        self._now = now
        self._sleep = sleep
        self._start: float | None = None
        self._issued = 0
        self.sent = 0
        """How many callbacks were let go."""
        self.first_at: float | None = None
        self.last_at: float | None = None

    def due(self, index: int) -> float:
        """When callback ``index`` (from 0) is due (the schedule starts at the first call)."""
        start = self._start if self._start is not None else self._now()
        return start + index * self._interval

    async def wait(self) -> None:
        """Wait for the next callback's due time (no wait when it is already past)."""
        now = self._now()
        if self._start is None:
            self._start = now
        if self._interval:
            due = self._start + self._issued * self._interval
            self._issued += 1
            if due > now:
                await self._sleep(due - now)
                now = self._now()
        self.sent += 1
        if self.first_at is None:
            self.first_at = now
        self.last_at = now

    @property
    def achieved_rate(self) -> float | None:
        """Callbacks let go per second, first to last (None before two of them)."""
        if self.first_at is None or self.last_at is None or self.last_at <= self.first_at:
            return None
        return (self.sent - 1) / (self.last_at - self.first_at)


def plan(scenario: Scenario, options: RunOptions, rng: random.Random) -> list[list[Callback]]:
    """The units of work: each scenario instance in causal order, or every callback on its own
    in random order (``shuffle``: the platform may deliver out of order)."""
    instances = [scenario.build(rng, options.overrides) for _ in range(options.count)]
    if not options.shuffle:
        return instances
    loose = [[callback] for instance in instances for callback in instance]
    rng.shuffle(loose)
    return loose


async def run_units(
    platform: Platform,
    units: list[list[Callback]],
    options: RunOptions,
    progress: Callable[[int], object] | None = None,
    *,
    on_result: Callable[[CallbackResult], object] | None = None,
    pacer: Pacer | None = None,
) -> list[CallbackResult]:
    """Deliver every unit (see :func:`plan`), ``options.concurrency`` units at a time (a fixed
    pool of that many workers, each taking the next unit); the callbacks of one unit in order,
    each started when ``pacer`` (default: one at ``options.rate``) lets it go. Once a callback
    is done, ``progress(1)`` is told, and ``on_result`` gets its result. Results follow the
    units' order."""
    pacer = pacer if pacer is not None else Pacer(options.rate)
    results: list[list[CallbackResult]] = [[] for _ in units]
    pending = iter(range(len(units)))  # shared by the workers: each index taken once

    async def work() -> None:
        for index in pending:
            for callback in units[index]:
                await pacer.wait()
                result = await platform.deliver(callback)
                results[index].append(result)
                if progress is not None:
                    progress(1)
                if on_result is not None:
                    on_result(result)

    await asyncio.gather(*(work() for _ in range(min(options.concurrency, len(units)))))
    return [result for unit in results for result in unit]
