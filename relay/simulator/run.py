"""Running a scenario many times: concurrency, rate, causal order or shuffled."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
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


class RateLimiter:
    """At most ``rate`` callbacks started per second (None: no limit)."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1 / rate if rate else 0.0
        self._next = time.monotonic()
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self._interval:
            return
        async with self._lock:
            now = time.monotonic()
            if self._next > now:
                await asyncio.sleep(self._next - now)
            self._next = max(self._next, now) + self._interval


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
) -> list[CallbackResult]:
    """Deliver every unit (see :func:`plan`), ``options.concurrency`` units at a time; the
    callbacks of one unit in order. Once a callback is done, ``progress(1)`` is told, and
    ``on_result`` gets its result. Results follow the units' order."""
    limiter = RateLimiter(options.rate)
    gate = asyncio.Semaphore(options.concurrency)
    results: list[list[CallbackResult]] = [[] for _ in units]

    async def play(index: int, unit: list[Callback]) -> None:
        async with gate:
            for callback in unit:
                await limiter.wait()
                result = await platform.deliver(callback)
                results[index].append(result)
                if progress is not None:
                    progress(1)
                if on_result is not None:
                    on_result(result)

    await asyncio.gather(*(play(i, unit) for i, unit in enumerate(units)))
    return [result for unit in results for result in unit]
