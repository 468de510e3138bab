"""A router that raises on every call (a fault, not an outage) leaves the events stored and
unrouted, and is logged once when it begins and once when it ends, by the after-commit hook and
by the sweeper alike: not a traceback per hook call or per sweep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import StoredEvent
from relay import outbox
from relay.dispatch.in_process import InProcessDispatcher
from relay.observe.metrics import WorkerMetrics
from relay.outbox.hook import RoutingHook
from relay.outbox.router import Route, Router
from relay.outbox.sweeper import Sweeper
from relay.simulator import factories
from tests.relay_support import Clock, store_events
from tests.store_support import eventually


class SwitchableRouter(Router):
    """Routes every event to ``crm``, or raises while ``broken``."""

    def __init__(self) -> None:
        super().__init__({})
        self.broken = True

    def routes(self, kind: str, source: str, payload: Mapping[str, Any]) -> list[Route]:
        if self.broken:
            raise RuntimeError("a router fault")
        return [Route("crm", "standard")]


def trouble_lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage().split(" (")[0])
        for r in caplog.records
        if r.name == logger and r.levelno >= logging.INFO
    ]


def sweeps(metrics: WorkerMetrics, outcome: str) -> float:
    return metrics.registry.get_sample_value("relay_sweeps_total", {"outcome": outcome}) or 0


async def unrouted_count(engine: AsyncEngine, clock: Clock) -> int:
    return len(await outbox.unrouted_events(engine, clock() + timedelta(hours=1), 1000))


async def test_the_hook_logs_a_failing_router_once_and_its_recovery_once(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    ids = await store_events(
        engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(3)], clock
    )
    events = [StoredEvent(i, "default", "sms.dlr", clock(), {}) for i in ids]
    router = SwitchableRouter()
    hook = RoutingHook(engine, router, clock)
    caplog.set_level(logging.INFO)

    for event in events[:2]:
        await hook([event])  # no exception: the event stays stored, unrouted
    assert await unrouted_count(engine, clock) == 3
    router.broken = False
    await hook([events[2]])
    assert await unrouted_count(engine, clock) == 2
    router.broken = True
    await hook([events[0]])
    routed_in_their_commit = StoredEvent("e", "default", "sms.dlr", clock(), {}, written_with=[])
    await hook([routed_in_their_commit])  # routing works again, in the writer

    assert trouble_lines(caplog, "relay.outbox.hook") == [
        ("ERROR", "routing events after their commit failed"),
        ("INFO", "routing events after their commit works again"),
        ("ERROR", "routing events after their commit failed"),
        ("INFO", "routing events after their commit works again"),
    ]
    assert sum(bool(r.exc_info) for r in caplog.records) == 2


async def test_the_sweeper_logs_a_failing_router_once_and_routes_once_it_works(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(3)], clock)
    clock.advance(timedelta(seconds=10))
    router, metrics = SwitchableRouter(), WorkerMetrics()
    sweeper = Sweeper(
        engine,
        router,
        InProcessDispatcher(concurrency=1),
        clock=clock,
        interval=timedelta(milliseconds=10),
        metrics=metrics,
    )
    caplog.set_level(logging.INFO)
    running = asyncio.create_task(sweeper.run())
    try:
        await eventually(lambda: sweeps(metrics, "failed") >= 5)
        router.broken = False
        await eventually(lambda: sweeps(metrics, "ok") >= 1)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert await unrouted_count(engine, clock) == 0
    assert [line for line in trouble_lines(caplog, "relay.sweeper") if "routed" not in line[1]] == [
        ("ERROR", "sweep failed"),
        ("INFO", "sweep works again"),
    ]
    assert sum(bool(r.exc_info) for r in caplog.records) == 1
