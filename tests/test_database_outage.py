"""The database lost and back: the sweeper, the deliverer and the after-commit hook keep going,
say so once per outage (``the store refuses the relay's writes: it is unavailable (<reason>)``,
``the store takes the relay's writes again after <duration>``) instead of a traceback per call,
and what they could not do waits in the database until it is back.

The outage is real: the machine's PostgreSQL behind a gate (a TCP proxy) that the test closes
(every connection cut, new ones refused) and opens again. PostgreSQL only: a SQLite file cannot
go away like a server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import StoredEvent
from receivers.store import create_engine, is_unavailable
from relay import outbox
from relay.delivery.deliverer import Deliverer, Target
from relay.delivery.policies import resolve_policies
from relay.destinations import build_destination, new_http_client, parse_destination_config
from relay.dispatch.in_process import InProcessDispatcher
from relay.observe.metrics import WorkerMetrics
from relay.outbox.hook import RoutingHook
from relay.outbox.router import Router
from relay.outbox.sweeper import Sweeper
from relay.outbox.tables import SUCCEEDED, Delivery
from relay.simulator import factories
from tests.conftest import TABLES
from tests.outage_support import Gate, gate_to, postgres_refusing_logins
from tests.relay_support import Clock, store_events
from tests.store_support import eventually
from tests.support import Sink

HOOK_PATH = "/hooks/sms/inbound"
DELIVERIES = Delivery.__table__


@pytest.mark.parametrize(
    ("sqlstate", "outage"),
    [
        ("57P03", True),  # the database system is starting up (a restart)
        ("53300", True),  # too many connections
        ("08006", True),  # connection failure
        ("28P01", False),  # a wrong password: a setting to fix, not an outage
        ("3D000", False),  # no such database: the same
    ],
)
async def test_errors_that_say_the_server_cannot_serve_now_are_outages(
    sqlstate: str, outage: bool
) -> None:
    async with postgres_refusing_logins(sqlstate, f"refused with {sqlstate}") as port:
        engine = create_engine(f"postgresql+asyncpg://app@127.0.0.1:{port}/app")
        try:
            with pytest.raises(Exception) as refused:
                async with engine.connect():
                    pass
        finally:
            await engine.dispose()
    assert is_unavailable(refused.value) is outage


@dataclass
class Gated:
    """The test's PostgreSQL database, seen directly and through a gate."""

    gate: Gate
    engine: AsyncEngine
    """Through the gate: what the code under test uses."""
    direct: AsyncEngine
    """Around it: what the test uses to prepare and check."""


@pytest.fixture
async def gated(postgres_url: str) -> AsyncIterator[Gated]:
    url = make_url(postgres_url)
    direct = create_engine(postgres_url)
    async with direct.begin() as conn:
        await conn.execute(text(f"TRUNCATE {', '.join(TABLES)}"))
    async with gate_to(url.port or 5432) as gate:
        engine = create_engine(url.set(port=gate.port).render_as_string(hide_password=False))
        try:
            yield Gated(gate, engine, direct)
        finally:
            await engine.dispose()
            await direct.dispose()


def database_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The relay's lines about the store: ``database lost`` (it refuses the relay's writes) and
    ``database back`` (it takes them again)."""
    told = {"refuses": "database lost", "takes": "database back"}
    return [
        told[r.getMessage().split()[2]]
        for r in caplog.records
        if r.name == "receivers.store.writable" and r.levelno >= logging.INFO
    ]


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info and r.levelno >= logging.INFO]


def crm_router(url: str = "http://127.0.0.1:9/") -> Router:
    return Router({"crm": parse_destination_config({"type": "http", "url": url})})


async def deliveries(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(DELIVERIES))).scalar())


async def test_the_sweeper_says_a_database_outage_once_and_sweeps_again_when_it_is_back(
    gated: Gated, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    await store_events(
        gated.direct, [(HOOK_PATH, factories.sms_inbound()) for _ in range(2)], clock
    )
    clock.advance(timedelta(minutes=1))
    metrics = WorkerMetrics()
    queue = InProcessDispatcher(concurrency=1, clock=clock)
    sweeper = Sweeper(
        gated.engine,
        crm_router(),
        queue,
        clock=clock,
        interval=timedelta(milliseconds=20),
        metrics=metrics,
    )

    def sweeps(outcome: str) -> float:
        return metrics.registry.get_sample_value("relay_sweeps_total", {"outcome": outcome}) or 0

    await gated.gate.close()
    task = asyncio.create_task(sweeper.run())
    try:
        await eventually(lambda: sweeps("failed") >= 3)
        assert database_lines(caplog) == ["database lost"]
        await gated.gate.open()
        await eventually(lambda: sweeps("ok") >= 1)
        assert await _routed_and_queued(gated.direct, queue, events=2)
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert database_lines(caplog) == ["database lost", "database back"]
    assert tracebacks(caplog) == []


async def _routed_and_queued(
    engine: AsyncEngine, queue: InProcessDispatcher, *, events: int
) -> bool:
    """Each event has its delivery, and their first attempts a job (one batch job for all)."""
    return await deliveries(engine) == events and queue.held == 1


async def test_attempts_the_database_outage_stops_wait_for_it_without_an_error(
    gated: Gated, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    await store_events(
        gated.direct, [(HOOK_PATH, factories.sms_inbound()) for _ in range(2)], clock
    )
    events = await outbox.unrouted_events(gated.direct, clock() + timedelta(minutes=1), 10)
    router = crm_router(sink.url())
    due = await outbox.route_events(gated.direct, router, events, clock())
    config = parse_destination_config({"type": "http", "url": sink.url()})
    client = new_http_client()
    deliverer = Deliverer(
        gated.engine,
        {"crm": Target(build_destination("crm", config, http_client=client), config.timeout)},
        resolve_policies({}),
        clock=clock,
        lease=timedelta(minutes=1),
    )
    ids = [d.id for d in due]
    try:
        await gated.gate.close()
        for _ in range(3):
            assert await deliverer.attempt_many(ids) == []
        assert sink.requests == []
        assert database_lines(caplog) == ["database lost"]

        await gated.gate.open()
        assert await deliverer.attempt_many(ids) == []  # delivered: no next job
    finally:
        await client.aclose()
    assert len(sink.requests) == 2
    assert database_lines(caplog) == ["database lost", "database back"]
    assert tracebacks(caplog) == []


async def test_an_attempt_whose_record_loses_its_connection_is_recorded_on_a_new_one(
    gated: Gated, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection is reset while the attempt's record is written (PostgreSQL terminating
    its backends): the record is written again at once on a new connection, so the delivery
    is not left leased, to be sent again once its lease ends."""
    caplog.set_level(logging.INFO)
    clock = Clock()
    await store_events(gated.direct, [(HOOK_PATH, factories.sms_inbound())], clock)
    events = await outbox.unrouted_events(gated.direct, clock() + timedelta(minutes=1), 10)
    [due] = await outbox.route_events(gated.direct, crm_router(sink.url()), events, clock())
    config = parse_destination_config({"type": "http", "url": sink.url()})
    client = new_http_client()
    deliverer = Deliverer(
        gated.engine,
        {"crm": Target(build_destination("crm", config, http_client=client), config.timeout)},
        resolve_policies({}),
        clock=clock,
        lease=timedelta(minutes=1),
    )

    def cut_during_the_record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO delivery_attempts") and not cuts:
            cuts.append(statement)
            gated.gate.cut()

    cuts: list[str] = []
    event.listen(gated.engine.sync_engine, "before_cursor_execute", cut_during_the_record)
    try:
        assert await deliverer.attempt_many([due.id]) == []
    finally:
        event.remove(gated.engine.sync_engine, "before_cursor_execute", cut_during_the_record)
        await client.aclose()
    assert len(cuts) == 1
    async with gated.direct.connect() as conn:
        status = (
            await conn.execute(select(DELIVERIES.c.status).where(DELIVERIES.c.id == due.id))
        ).scalar()
    assert status == SUCCEEDED
    assert len(sink.requests) == 1
    assert tracebacks(caplog) == []


async def test_the_after_commit_hook_leaves_the_events_to_the_sweepers_while_it_is_lost(
    gated: Gated, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    await store_events(
        gated.direct, [(HOOK_PATH, factories.sms_inbound()) for _ in range(2)], clock
    )
    refs = await outbox.unrouted_events(gated.direct, clock() + timedelta(minutes=1), 10)
    events = [StoredEvent(e.id, e.source, e.kind, e.received_at, e.payload) for e in refs]
    hook = RoutingHook(gated.engine, crm_router(), clock)

    await gated.gate.close()
    for _ in range(3):
        await hook(events)  # no error: the events stay unrouted, for the sweepers
    assert await deliveries(gated.direct) == 0
    assert database_lines(caplog) == ["database lost"]

    await gated.gate.open()
    await hook(events)
    assert await deliveries(gated.direct) == 2
    assert database_lines(caplog) == ["database lost", "database back"]
    assert tracebacks(caplog) == []


async def test_a_hook_fault_that_is_no_outage_is_logged_with_its_traceback_once(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """An event the store does not hold cannot be routed (a fault, not an outage): logged with
    its traceback, once however often it comes back; the store's state is not touched."""
    clock = Clock()
    ghost = StoredEvent("no-such-event", "default", "sms.inbound", clock(), {})
    hook = RoutingHook(engine, crm_router(), clock)
    for _ in range(3):
        await hook([ghost])
    assert [r.levelname for r in caplog.records if r.levelno >= logging.INFO] == ["ERROR"]
    (logged,) = tracebacks(caplog)
    assert "routing events after their commit failed" in logged
