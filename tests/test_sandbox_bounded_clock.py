"""The sandbox's platform clock stops at a date ``datetime`` holds, instead of overflowing when a
tiny time scale has run it for days."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from relay.sandbox.bounded_clock import LAST, BoundedClock
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.settings import SandboxSettings
from relay.simulator.clocks import VirtualClock


class Overflowing:
    """A clock whose time is past what datetime holds (a scaled clock after days at 1e-6)."""

    def now(self) -> datetime:
        raise OverflowError("date value out of range")

    async def sleep_until(self, when: datetime) -> None:
        raise OverflowError("date value out of range")


def test_time_past_the_limit_reads_as_the_limit() -> None:
    assert BoundedClock(Overflowing()).now() == LAST
    assert BoundedClock(VirtualClock(LAST + timedelta(days=1))).now() == LAST


def test_time_before_the_limit_is_the_inner_clocks() -> None:
    start = datetime(2026, 11, 26, tzinfo=UTC)
    assert BoundedClock(VirtualClock(start)).now() == start


async def test_sleeping_past_the_limit_never_returns_nor_raises() -> None:
    clock = BoundedClock(Overflowing())
    sleeper = asyncio.create_task(clock.sleep_until(LAST + timedelta(days=1)))
    other = asyncio.create_task(clock.sleep_until(LAST - timedelta(days=1)))
    for _ in range(20):
        await asyncio.sleep(0)  # let both run as far as they go (no time passes)
    assert not sleeper.done() and not other.done()
    sleeper.cancel()
    other.cancel()


def test_a_sandbox_on_real_time_uses_the_bounded_clock() -> None:
    assert isinstance(Sandbox(SandboxSettings(time_scale=1e-6)).clock, BoundedClock)
