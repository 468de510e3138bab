"""`/metrics` costs the same however many scrape: the store's gauges are read from the database
in the background at most once per ``metrics_refresh_interval``, only while someone scrapes,
and every scrape is served the last figures read, with their age; `relay serve` encodes the
exposition at most once a second, shared by every scraper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.metrics import Metrics
from receivers.store import create_engine, utc_now
from relay import outbox
from relay.destinations import parse_destination_config
from relay.observe.metrics import StoreFigures
from relay.outbox.router import Router
from relay.server.runtime import start
from relay.settings import Settings, SettingsError, load_settings
from relay.simulator import factories
from relay.store import migrate
from tests.conftest import TOKEN, create_postgres_database, drop_postgres_database
from tests.metrics_support import sample
from tests.relay_support import Clock, store_events
from tests.store_support import eventually

INTERVAL = timedelta(seconds=5)
MILLISECOND = timedelta(milliseconds=1)
SCRAPERS = 32
AGE = "relay_store_figures_age_seconds"
CRM = {"destination": "crm"}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@contextlib.contextmanager
def store_reads(engine: AsyncEngine) -> Iterator[list[str]]:
    """The reads of the deliveries' figures the engine sends meanwhile, as they are sent."""
    reads: list[str] = []

    def seen(*args: Any) -> None:
        statement = str(args[2])
        if "FROM deliveries" in statement and "count(" in statement:
            reads.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", seen)
    try:
        yield reads
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", seen)


def figures_on(
    engine: AsyncEngine, clock: Clock, *, timeout: float = 30.0
) -> tuple[Metrics, StoreFigures]:
    metrics = Metrics()
    figures = StoreFigures(
        metrics.registry, engine, ["crm"], clock, interval=INTERVAL, timeout=timeout
    )
    metrics.before_scrape(figures.refresh)
    return metrics, figures


async def scrape(metrics: Metrics) -> str:
    body, _ = await metrics.exposition()
    return body.decode()


async def route_two_deliveries(engine: AsyncEngine, clock: Clock) -> None:
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(2)], clock)
    router = Router({"crm": parse_destination_config({"type": "http", "url": "http://x.test/"})})
    events = await outbox.unrouted_events(engine, clock() + timedelta(days=1), 100)
    await outbox.route_events(engine, router, events, clock())


async def test_concurrent_scrapes_read_the_store_once_per_interval(
    engine: AsyncEngine, clock: Clock
) -> None:
    metrics, figures = figures_on(engine, clock)
    with store_reads(engine) as reads:
        first = await asyncio.gather(*(scrape(metrics) for _ in range(SCRAPERS)))
        assert len(reads) == 1
        # the first scrapes wait for the first figures, and all get them
        assert {sample(text, "relay_deliveries_pending", **CRM) for text in first} == {0}
        assert {sample(text, AGE) for text in first} == {0}

        clock.advance(INTERVAL - MILLISECOND)
        await asyncio.gather(*(scrape(metrics) for _ in range(SCRAPERS)))
        assert len(reads) == 1

        clock.advance(MILLISECOND)
        await asyncio.gather(*(scrape(metrics) for _ in range(SCRAPERS)))
        await eventually(lambda: figures.age() == 0)  # read again, once
        await asyncio.gather(*(scrape(metrics) for _ in range(SCRAPERS)))
        assert len(reads) == 2


async def test_a_scrape_after_the_interval_gets_the_last_figures_while_they_are_read_again(
    engine: AsyncEngine, clock: Clock
) -> None:
    metrics, _ = figures_on(engine, clock)
    assert sample(await scrape(metrics), "relay_deliveries_pending", **CRM) == 0
    await route_two_deliveries(engine, clock)
    clock.advance(3 * INTERVAL)

    stale = await scrape(metrics)  # starts a read, waits for nothing
    assert sample(stale, "relay_deliveries_pending", **CRM) == 0
    assert sample(stale, AGE) == 3 * INTERVAL.total_seconds()

    async def fresh() -> str | None:
        text = await scrape(metrics)
        return text if sample(text, "relay_deliveries_pending", **CRM) == 2 else None

    assert sample(await eventually(fresh), AGE) == 0


async def test_without_scrapes_the_store_is_not_read(engine: AsyncEngine, clock: Clock) -> None:
    tasks_before = asyncio.all_tasks()
    metrics, figures = figures_on(engine, clock)
    with store_reads(engine) as reads:
        await scrape(metrics)
        clock.advance(100 * INTERVAL)
        assert asyncio.all_tasks() == tasks_before  # nothing left running to poll the store
        assert len(reads) == 1
        assert figures.age() == 100 * INTERVAL.total_seconds()


async def test_a_clock_set_back_counts_as_due(engine: AsyncEngine, clock: Clock) -> None:
    metrics, figures = figures_on(engine, clock)
    with store_reads(engine) as reads:
        await scrape(metrics)
        clock.advance(-timedelta(hours=1))
        await scrape(metrics)
        await eventually(lambda: len(reads) == 2)
    await eventually(lambda: figures.age() == 0)


@pytest.fixture
async def unmigrated_engine(backend: str, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A store without tables (a fresh SQLite file, or a fresh PostgreSQL database)."""
    if backend == "sqlite":
        engine = create_engine(f"sqlite:///{tmp_path / 'empty.db'}")
        yield engine
        await engine.dispose()
        return
    name, url = await create_postgres_database("relay_metrics")
    engine = create_engine(url)
    try:
        yield engine
    finally:
        await engine.dispose()
        await drop_postgres_database(name)


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "relay.metrics"]


async def test_a_failing_store_is_one_line_when_reads_fail_and_one_when_they_succeed_again(
    unmigrated_engine: AsyncEngine, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = unmigrated_engine
    metrics, figures = figures_on(engine, clock)
    caplog.set_level(logging.INFO, logger="relay.metrics")
    for _ in range(3):  # no figures yet: each scrape waits for its read, which fails
        served = await scrape(metrics)
        clock.advance(INTERVAL)
    assert sample(served, "relay_deliveries_pending", **CRM) is None
    assert sample(served, AGE) is None
    [(level, failed)] = lines(caplog)
    assert level == logging.WARNING and "\n" not in failed
    assert failed.startswith("metrics: cannot read the store's figures: ")
    assert failed.endswith("; the last ones read are served")

    await migrate.upgrade(engine)
    assert sample(await scrape(metrics), "relay_deliveries_pending", **CRM) == 0
    assert lines(caplog)[1:] == [(logging.INFO, "metrics: the store's figures are read again")]

    async with engine.begin() as conn:
        await conn.execute(text("ALTER TABLE deliveries RENAME TO deliveries_away"))
    for _ in range(3):
        await figures.read()
    clock.advance(2 * INTERVAL)
    served = await scrape(metrics)
    assert sample(served, "relay_deliveries_pending", **CRM) == 0  # the last figures read
    assert sample(served, AGE) == 2 * INTERVAL.total_seconds()
    assert [level for level, _ in lines(caplog)] == [logging.WARNING, logging.INFO, logging.WARNING]


@pytest.fixture
async def postgres_engine(postgres_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(postgres_url)
    yield engine
    await engine.dispose()


@contextlib.asynccontextmanager
async def deliveries_locked(engine: AsyncEngine) -> AsyncIterator[None]:
    """Every read of the deliveries waits meanwhile (PostgreSQL: SQLite's WAL never blocks a
    reader)."""
    async with engine.connect() as conn:
        await conn.execute(text("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE"))
        try:
            yield
        finally:
            await conn.rollback()


async def test_a_read_that_does_not_answer_in_time_counts_as_failed(
    postgres_engine: AsyncEngine, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    metrics, _ = figures_on(postgres_engine, clock, timeout=0.2)
    async with deliveries_locked(postgres_engine):
        served = await scrape(metrics)  # the first scrape waits for the read, at most 0.2 s
    assert sample(served, "relay_deliveries_pending", **CRM) is None
    assert [message for _, message in lines(caplog)] == [
        "metrics: cannot read the store's figures: timeout; the last ones read are served"
    ]


async def test_closing_cancels_a_read_under_way_quietly(
    postgres_engine: AsyncEngine, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    tasks_before = asyncio.all_tasks()
    metrics, figures = figures_on(postgres_engine, clock)
    await scrape(metrics)
    with store_reads(postgres_engine) as reads:
        async with deliveries_locked(postgres_engine):
            clock.advance(INTERVAL)
            await scrape(metrics)
            await eventually(lambda: len(reads) == 1)  # the read waits for the lock
            await figures.aclose()
            assert asyncio.all_tasks() == tasks_before
    assert lines(caplog) == []


async def test_relay_serve_reads_the_store_once_for_many_concurrent_scrapes(
    database_url: str, engine: AsyncEngine
) -> None:
    runtime = await start(Settings(database_url=database_url))
    app = runtime.app(clock=Clock(utc_now()))
    collections = Collections()
    app.state.metrics.registry.register(collections)
    transport = httpx.ASGITransport(app=app)
    try:
        with store_reads(runtime.engine) as reads:
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client,
            ):
                answers = await asyncio.gather(*(client.get("/metrics") for _ in range(SCRAPERS)))
    finally:
        await runtime.engine.dispose()
    assert {answer.status_code for answer in answers} == {200}
    assert len(reads) == 1
    assert {sample(answer.text, AGE) for answer in answers} == {0}
    assert collections.count == 1  # encoded once for them all


@pytest.mark.parametrize(
    "value", ['""', '"0"', "0", '"500ms"', '"-1s"', '"2h"', "7200", '"soon"', "true", '"9e999"']
)
def test_the_refresh_interval_is_between_a_second_and_an_hour(tmp_path: Path, value: str) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(f'metrics_refresh_interval = {value}\n[sources.default]\ntoken = "{TOKEN}"\n')
    with pytest.raises(SettingsError, match="metrics_refresh_interval"):
        load_settings(config)


def test_the_refresh_interval_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_METRICS_REFRESH_INTERVAL", "30s")
    assert load_settings(None).metrics_refresh_interval == timedelta(seconds=30)
    monkeypatch.setenv("RELAY_METRICS_REFRESH_INTERVAL", "1" * 5000)
    with pytest.raises(SettingsError, match="RELAY_METRICS_REFRESH_INTERVAL") as refused:
        load_settings(None)
    assert "1" * 100 not in str(refused.value)
    monkeypatch.delenv("RELAY_METRICS_REFRESH_INTERVAL")
    assert load_settings(None).metrics_refresh_interval == timedelta(seconds=5)


class Collections(Collector):
    """Counts how often the registry it is in was collected (encoded)."""

    def __init__(self) -> None:
        self.count = 0

    def collect(self) -> Iterator[Metric]:
        self.count += 1
        yield GaugeMetricFamily("relay_example_collections", "Collections.", value=self.count)


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


async def test_scrapes_within_max_age_share_one_encoding_per_format() -> None:
    ticks = Ticks()
    metrics = Metrics(max_age=1.0, clock=ticks)
    collections = Collections()
    metrics.registry.register(collections)
    counter = Counter("relay_example_total", "An example.", registry=metrics.registry)

    texts = await asyncio.gather(*(metrics.exposition() for _ in range(SCRAPERS)))
    openmetrics = await asyncio.gather(*(metrics.exposition(OPENMETRICS) for _ in range(SCRAPERS)))
    assert collections.count == 2  # once per format
    assert len({body for body, _ in texts}) == 1 and len({body for body, _ in openmetrics}) == 1
    assert {kind.split(";")[0] for _, kind in texts} == {"text/plain"}
    assert {kind.split(";")[0] for _, kind in openmetrics} == {"application/openmetrics-text"}
    assert texts[0][0] != openmetrics[0][0]

    counter.inc()
    ticks.now += 0.999
    body, _ = await metrics.exposition()
    assert sample(body.decode(), "relay_example_total") == 0  # the exposition of 0.999 s ago
    ticks.now += 0.001
    body, _ = await metrics.exposition()
    assert sample(body.decode(), "relay_example_total") == 1
    assert collections.count == 3


async def test_without_max_age_each_scrape_encodes() -> None:
    metrics = Metrics()
    collections = Collections()
    metrics.registry.register(collections)
    for _ in range(3):
        await metrics.exposition()
    assert collections.count == 3


async def test_a_clock_set_back_encodes_again() -> None:
    ticks = Ticks()
    metrics = Metrics(max_age=1.0, clock=ticks)
    collections = Collections()
    metrics.registry.register(collections)
    await metrics.exposition()
    ticks.now -= 10
    await metrics.exposition()
    assert collections.count == 2
