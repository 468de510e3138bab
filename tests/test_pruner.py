"""The pruner: the worker's background pass of the ``retention`` setting, on its injected clock,
in embedded mode and on real Redis; its log lines; one pass at a time on PostgreSQL; and what
the retention means for the platform's retries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from arq.connections import RedisSettings, create_pool
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import create_engine
from relay import outbox
from relay.dispatch.in_process import InProcessDispatcher
from relay.dispatch.worker import build_worker
from relay.server.runtime import Runtime, close_worker, start
from relay.server.services import worker_services
from relay.settings import Settings
from relay.simulator import factories
from relay.store.pruner import PRUNE_LOCK, Pruner
from relay.store.retention import Pruned
from tests.conftest import REDIS_URL, TABLES, TOKEN, running_client
from tests.relay_support import START, Clock
from tests.retention_support import Planned, event_with, left, router
from tests.store_support import eventually
from tests.support import free_port

DAY = timedelta(days=1)
RETENTION = timedelta(days=30)


def ended(at: object) -> list[Planned]:
    """One delivery that succeeded an hour after ``at``."""
    assert isinstance(at, type(START))
    return [Planned("succeeded", at + timedelta(hours=1))]


async def test_a_pass_removes_what_is_older_than_the_retention_at_its_clock(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    first = await event_with(engine, "first", START, ended(START))
    second = await event_with(engine, "second", START + 10 * DAY, ended(START + 10 * DAY))
    clock = Clock(START + 20 * DAY)
    pruner = Pruner(engine, RETENTION, clock=clock)

    with caplog.at_level(logging.INFO, logger="relay.pruner"):
        assert await pruner.prune() == Pruned()  # both younger than 30 days
        clock.to(START + 35 * DAY)
        assert await pruner.prune() == Pruned(1, 1, 2, 0)
        assert (await left(engine)).events == {second}
        clock.advance(10 * DAY)
        assert await pruner.prune() == Pruned(1, 1, 2, 0)

    assert (await left(engine)).events == set()
    lines = [r.getMessage() for r in caplog.records if r.name == "relay.pruner"]
    assert len(lines) == 2  # one line per pass that removed something, none for the empty one
    for line, cutoff in zip(lines, (START + 5 * DAY, START + 15 * DAY), strict=True):
        assert re.fullmatch(
            "retention removed 1 event, 1 delivery, 2 attempts and 0 quarantined bodies from "
            rf"before {re.escape(cutoff.isoformat())} in \d+\.\d s",
            line,
        ), line
    assert all(r.levelno == logging.INFO and r.exc_info is None for r in caplog.records)
    assert first not in (await left(engine)).events


async def test_a_failed_pass_is_one_warning_line_and_the_next_pass_tries_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'empty.db'}")  # no tables: every pass fails
    pruner = Pruner(engine, RETENTION, clock=Clock(), interval=timedelta(milliseconds=1))
    task = asyncio.create_task(pruner.run())
    try:
        with caplog.at_level(logging.INFO, logger="relay.pruner"):
            await eventually(lambda: len(caplog.records) >= 2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await engine.dispose()
    failures = caplog.records[:2]
    for record in failures:
        assert record.levelno == logging.WARNING and record.exc_info is None
        message = record.getMessage()
        assert message.startswith("retention pass failed: OperationalError: ")
        assert "no such table" in message and message.endswith("; next pass in 0:00:00.001000")
        assert "\n" not in message


@pytest.fixture
async def pg_engine(postgres_url: str) -> AsyncIterator[AsyncEngine]:
    """The run's PostgreSQL store, emptied."""
    engine = create_engine(postgres_url)
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {', '.join(TABLES)}"))
    yield engine
    await engine.dispose()


async def test_on_postgresql_a_worker_leaves_the_pass_to_the_one_already_pruning(
    pg_engine: AsyncEngine,
) -> None:
    await event_with(pg_engine, "old", START, ended(START))
    pruner = Pruner(pg_engine, RETENTION, clock=Clock(START + 31 * DAY))
    other = create_engine(str(pg_engine.url.render_as_string(hide_password=False)))
    try:
        async with other.connect() as holder:  # another worker's pass
            lock = text("SELECT pg_advisory_lock(:key)").bindparams(key=PRUNE_LOCK)
            await holder.execute(lock)
            assert await pruner.prune() is None
            assert len((await left(pg_engine)).events) == 1
            unlock = text("SELECT pg_advisory_unlock(:key)").bindparams(key=PRUNE_LOCK)
            await holder.execute(unlock)
        assert await pruner.prune() == Pruned(1, 1, 2, 0)
        assert await pruner.prune() == Pruned()  # the lock was given back after each pass
    finally:
        await other.dispose()


def settings_with(database_url: str, **extra: object) -> Settings:
    return Settings(
        database_url=database_url,
        sources={"default": {"token": TOKEN}},
        destinations={"crm": {"type": "http", "url": f"http://127.0.0.1:{free_port()}/"}},
        sweep_interval="200ms",
        **extra,
    )


async def test_without_retention_a_worker_has_no_pruner(engine: AsyncEngine) -> None:
    settings = settings_with(str(engine.url.render_as_string(hide_password=False)))
    queue = InProcessDispatcher(concurrency=1)
    services = worker_services(settings, engine, queue, clock=Clock())
    try:
        assert services.pruner is None
    finally:
        await services.aclose()


@contextlib.asynccontextmanager
async def serving_at(runtime: Runtime, clock: Clock) -> AsyncIterator[httpx.AsyncClient]:
    """`relay serve`'s whole app in-process on ``clock``, lifespan running."""
    app = runtime.app(clock)
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client,
        ):
            yield client
    finally:
        await runtime.engine.dispose()


async def test_the_embedded_relay_of_relay_serve_prunes_by_the_retention_setting(
    engine: AsyncEngine, database_url: str
) -> None:
    old = await event_with(engine, "old", START, ended(START))
    recent = await event_with(engine, "recent", START + 20 * DAY, ended(START + 20 * DAY))
    runtime = await start(settings_with(database_url, retention="30d"))

    async with serving_at(runtime, Clock(START + 31 * DAY)):
        await eventually(lambda: _events_are(engine, {recent}))

    assert old not in (await left(engine)).events


async def test_a_relay_worker_on_redis_prunes_by_the_retention_setting(
    engine: AsyncEngine, database_url: str, redis: Redis
) -> None:
    old = await event_with(engine, "old", START, ended(START))
    settings = settings_with(database_url, retention="30d", redis_url=REDIS_URL)
    pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    clock = Clock(START + 31 * DAY)
    worker = build_worker(settings, engine, pool, clock=clock, handle_signals=False)
    task = asyncio.create_task(worker.async_run())
    try:
        await eventually(lambda: _events_are(engine, set()))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await close_worker(worker)
    assert old not in (await left(engine)).events


async def _events_are(engine: AsyncEngine, expected: set[str]) -> bool:
    return (await left(engine)).events == expected


async def test_a_platform_retry_of_a_pruned_event_is_stored_again_as_a_new_event(
    engine: AsyncEngine,
) -> None:
    """The trade-off the shortest retention guards against: deduplication needs the event."""
    body = factories.sms_inbound()
    clock = Clock(START)
    async with running_client(engine, clock=clock) as client:
        first = (await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)).json()
        clock.advance(DAY)
        retried = (await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)).json()
        assert retried == first  # within the retention: a duplicate, stored once

        [event_id] = (await left(engine)).events
        assert event_id == first["id"]
        await _route_and_end(engine, event_id)
        clock.advance(RETENTION)
        assert await Pruner(engine, RETENTION, clock=clock).prune() == Pruned(1, 0, 0, 0)

        again = (await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)).json()

    assert again["status"] == "accepted" and again["id"] != first["id"]
    assert (await left(engine)).events == {again["id"]}


async def _route_and_end(engine: AsyncEngine, event_id: str) -> None:
    """Mark the event routed to no destination (its routing is over)."""
    [ref] = await outbox.unrouted_events(engine, START + 365 * DAY, 10)
    assert ref.id == event_id
    await outbox.route_events(engine, router(0), [ref], START)
