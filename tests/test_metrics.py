"""Prometheus metrics: the receivers' counters, a worker's attempts, lag and sweeps, the
store's gauges as read, `relay serve`'s one registry and `relay worker --metrics-port` (how
often the store is read while scraped: tests/test_metrics_refresh.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY, CollectorRegistry, Counter
from pydantic import TypeAdapter
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import create_engine, utc_now
from relay import outbox
from relay.cli import main
from relay.delivery.deliverer import Deliverer, Target
from relay.delivery.policies import PolicyConfigs, resolve_policies
from relay.destinations import build_destination, new_http_client, parse_destination_config
from relay.dispatch.in_process import InProcessDispatcher
from relay.observe.metrics import StoreFigures, WorkerMetrics, metrics_server
from relay.outbox import Due
from relay.outbox.router import Router
from relay.outbox.sweeper import Sweeper
from relay.server.runtime import start
from relay.settings import Settings, SettingsError
from relay.simulator import factories
from relay.store import migrate
from tests.conftest import TOKEN, running_client, service_missing
from tests.metrics_support import sample
from tests.relay_support import Clock, store_events
from tests.store_support import child_environment, eventually
from tests.support import Answer, Sink, free_port

SECOND = timedelta(seconds=1)
WORKER = [sys.executable, "-m", "relay", "worker"]
METRICS_REDIS_URL = os.environ.get("RELAY_TEST_METRICS_REDIS_URL", "redis://127.0.0.1:6379/9")
"""A Redis database of these tests' own (flushed with FLUSHDB, never FLUSHALL)."""
PAUSING = {
    "type": "delays",
    "delays": ["1s"],
    "then": "1s",
    "max_attempts": 10,
    "pause_after": 2,
    "pause_for": "10m",
}
ONCE = {"type": "delays", "delays": ["1s"], "max_attempts": 1}


@pytest.fixture
def clock() -> Clock:
    return Clock()


class Worker:
    """A deliverer over real destinations whose figures go to a registry of its own."""

    def __init__(
        self,
        engine: AsyncEngine,
        destinations: Mapping[str, dict[str, Any]],
        clock: Clock,
        policies: Mapping[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.metrics = WorkerMetrics()
        configs = {name: parse_destination_config(c) for name, c in destinations.items()}
        self.router = Router(configs)
        self.client = new_http_client()
        targets = {
            name: Target(build_destination(name, config, http_client=self.client), config.timeout)
            for name, config in configs.items()
        }
        self.deliverer = Deliverer(
            engine,
            targets,
            resolve_policies(TypeAdapter(PolicyConfigs).validate_python(policies or {})),
            clock=clock,
            lease=timedelta(minutes=1),
            metrics=self.metrics,
        )

    async def route_all(self) -> list[Due]:
        events = await outbox.unrouted_events(self.engine, self.clock() + timedelta(days=1), 1000)
        return await outbox.route_events(self.engine, self.router, events, self.clock())

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    made: list[Worker] = []
    yield made
    for worker in made:
        await worker.client.aclose()


async def test_deliveries_to_a_real_sink_count_attempts_durations_and_lag(
    engine: AsyncEngine, clock: Clock, sink: Sink, workers: list[Worker]
) -> None:
    worker = Worker(engine, {"crm": {"type": "http", "url": sink.url()}}, clock)
    workers.append(worker)
    await store_events(
        engine, [("/hooks/sms/inbound", factories.sms_inbound()) for _ in range(5)], clock
    )
    due = await worker.route_all()
    clock.advance(3 * SECOND)  # stored at START, delivered 3 s later

    for delivery in due:
        assert await worker.deliverer.attempt(delivery.id) is None

    assert len(sink.requests) == 5
    crm = {"destination": "crm"}
    assert worker.value("relay_delivery_attempts_total", **crm, outcome="succeeded") == 5
    assert worker.value("relay_delivery_attempts_total", **crm, outcome="failed") == 0
    assert worker.value("relay_delivery_attempt_duration_seconds_count", **crm) == 5
    assert worker.value("relay_delivery_lag_seconds_count", **crm) == 5
    assert worker.value("relay_delivery_lag_seconds_sum", **crm) == pytest.approx(15)
    assert worker.value("relay_delivery_lag_seconds_bucket", **crm, le="2.5") == 0
    assert worker.value("relay_delivery_lag_seconds_bucket", **crm, le="5.0") == 5


async def test_store_gauges_follow_failures_pauses_410_and_dead_deliveries(
    engine: AsyncEngine, clock: Clock, sink: Sink, workers: list[Worker]
) -> None:
    sink.answers = {"/crm": Answer(503), "/gone": Answer(410), "/once": Answer(500)}
    worker = Worker(
        engine,
        {
            "crm": {"type": "http", "url": sink.url("/crm"), "policy": "pausing"},
            "gone": {"type": "http", "url": sink.url("/gone"), "policy": "once"},
            "once": {"type": "http", "url": sink.url("/once"), "policy": "once"},
        },
        clock,
        {"pausing": PAUSING, "once": ONCE},
    )
    workers.append(worker)
    registry = CollectorRegistry()
    figures = StoreFigures(
        registry, engine, ["crm", "gone", "once", "idle"], clock, interval=timedelta(seconds=5)
    )

    def gauge(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    await figures.read()
    assert gauge("relay_deliveries_pending", destination="idle") == 0
    assert gauge("relay_destination_breaker_state", destination="crm") == 0
    assert gauge("relay_oldest_pending_age_seconds") == 0

    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(2)], clock)
    due = await worker.route_all()
    clock.advance(30 * SECOND)
    await figures.read()
    for name in ("crm", "gone", "once"):
        assert gauge("relay_deliveries_pending", destination=name) == 2
    assert gauge("relay_oldest_pending_age_seconds") == 30

    for delivery in due:
        await worker.deliverer.attempt(delivery.id)
    await figures.read()

    assert worker.value("relay_delivery_attempts_total", destination="crm", outcome="failed") == 2
    # the first 410 disables the destination: the second delivery is held, not attempted
    assert worker.value("relay_delivery_attempts_total", destination="gone", outcome="gone") == 1
    assert worker.value("relay_delivery_lag_seconds_count", destination="crm") == 0
    assert gauge("relay_destination_breaker_state", destination="crm") == 1  # paused after 2
    assert gauge("relay_destination_breaker_state", destination="gone") == 2  # 410: disabled
    assert gauge("relay_destination_breaker_state", destination="once") == 0  # no pause rule
    assert gauge("relay_deliveries_pending", destination="crm") == 2  # retries scheduled
    assert gauge("relay_deliveries_pending", destination="gone") == 0  # held
    assert gauge("relay_deliveries_dead", destination="once") == 2
    assert gauge("relay_deliveries_dead", destination="crm") == 0
    assert gauge("relay_oldest_pending_age_seconds") == 30

    clock.advance(timedelta(minutes=11))  # the pause is over
    await figures.read()
    assert gauge("relay_destination_breaker_state", destination="crm") == 0
    assert gauge("relay_oldest_pending_age_seconds") == 30 + 11 * 60


async def test_a_store_that_does_not_answer_leaves_its_gauges_out(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'never-migrated.db'}")  # no tables
    registry = CollectorRegistry()
    figures = StoreFigures(registry, engine, ["crm"], utc_now, interval=timedelta(seconds=5))
    try:
        await figures.read()
    finally:
        await engine.dispose()
    assert registry.get_sample_value("relay_deliveries_pending", {"destination": "crm"}) is None


class BrokenQueue(InProcessDispatcher):
    """A dispatcher that fails the sweeper's question."""

    async def without_jobs(self, due: list[Due]) -> list[Due]:
        raise ConnectionError("redis went away")


async def test_sweeper_runs_are_counted(engine: AsyncEngine, clock: Clock) -> None:
    metrics = WorkerMetrics()
    router = Router({})
    queue = InProcessDispatcher(concurrency=1)
    sweeper = Sweeper(engine, router, queue, clock=clock, interval=SECOND, metrics=metrics)
    await sweeper.sweep()
    await sweeper.sweep()
    broken = Sweeper(
        engine,
        router,
        BrokenQueue(concurrency=1),
        clock=clock,
        interval=SECOND,
        metrics=metrics,
    )
    with pytest.raises(ConnectionError):
        await broken.sweep()
    assert metrics.registry.get_sample_value("relay_sweeps_total", {"outcome": "ok"}) == 2
    assert metrics.registry.get_sample_value("relay_sweeps_total", {"outcome": "failed"}) == 1


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The whole `relay serve` app in-process, lifespan running."""
    runtime = await start(settings)
    app = runtime.app()
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client,
        ):
            yield client
    finally:
        await runtime.engine.dispose()


async def test_relay_serve_records_receivers_and_embedded_worker_in_one_registry(
    engine: AsyncEngine, database_url: str, sink: Sink
) -> None:
    settings = Settings(
        database_url=database_url,
        sources={"default": {"token": TOKEN}},
        destinations={"crm": {"type": "http", "url": sink.url(), "timeout": "1s"}},
        sweep_interval="200ms",
        metrics_refresh_interval="1s",
    )
    async with serving(settings) as client:
        for _ in range(4):
            answer = await client.post(f"/hooks/sms/inbound?token={TOKEN}", json={"x": 1})
            assert answer.status_code == 422
        for _ in range(3):
            answer = await client.post(
                f"/hooks/sms/inbound?token={TOKEN}", json=factories.sms_inbound()
            )
            assert answer.status_code == 200, answer.text
        await client.post("/hooks/sms/inbound?token=wrong-token-value", json={})

        async def scraped() -> str | None:
            text = (await client.get("/metrics")).text
            delivered = sample(text, "relay_delivery_lag_seconds_count", destination="crm")
            pending = sample(text, "relay_deliveries_pending", destination="crm")
            # the lag is observed once the success is recorded; the gauges are read from the
            # database in the background, at most once a second, so they may lag behind
            return text if delivered == 3 and pending == 0 else None

        text = await eventually(scraped)
        openmetrics = await client.get(
            "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
        )

    stored = {"source": "default", "kind": "sms.inbound", "outcome": "stored"}
    assert sample(text, "relay_callbacks_total", **stored) == 3
    assert sample(text, "relay_rejected_total", source="default", status="422") == 4
    assert sample(text, "relay_auth_failures_total", source="default", reason="bad-token") == 1
    crm = {"destination": "crm"}
    assert sample(text, "relay_delivery_attempts_total", **crm, outcome="succeeded") == 3
    assert sample(text, "relay_deliveries_pending", **crm) == 0
    assert sample(text, "relay_destination_breaker_state", **crm) == 0
    assert (sample(text, "relay_sweeps_total", outcome="ok") or 0) >= 1
    assert sample(text, "relay_queue_connected") == 1  # the embedded queue: never lost
    assert TOKEN not in text and "wrong-token-value" not in text
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.endswith("# EOF\n")
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith("relay_")]


async def test_two_apps_count_apart(engine: AsyncEngine) -> None:
    async with running_client(engine) as first, running_client(engine) as second:
        answer = await first.post(f"/hooks/sms/dlr?token={TOKEN}", json=factories.sms_dlr())
        assert answer.status_code == 200
        labels = {"source": "default", "kind": "sms.dlr", "outcome": "stored"}
        assert sample((await first.get("/metrics")).text, "relay_callbacks_total", **labels) == 1
        assert sample((await second.get("/metrics")).text, "relay_callbacks_total", **labels) == 0


async def test_metrics_server_serves_a_registry_over_http() -> None:
    registry = CollectorRegistry()
    Counter("relay_example_total", "An example.", registry=registry).inc(2)
    async with metrics_server(registry, "127.0.0.1", 0) as address:
        assert address is not None
        host, port = address
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://{host}:{port}/metrics")
        with pytest.raises(SettingsError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            async with metrics_server(registry, "127.0.0.1", port):
                pass
    assert answer.status_code == 200
    assert sample(answer.text, "relay_example_total") == 2
    async with metrics_server(registry, "127.0.0.1", None) as nothing:
        assert nothing is None


def test_worker_takes_its_metrics_port_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[dict[str, Any]] = []

    async def run_worker(settings: Settings, **options: Any) -> None:
        calls.append(options)

    monkeypatch.setattr("relay.server.runtime.run_worker", run_worker)
    monkeypatch.setattr("relay.dispatch.worker.shorten_switch_interval", lambda: None)
    monkeypatch.setattr("relay.commands.process.configure_logging", lambda *args: None)
    for name in ("RELAY_METRICS_PORT", "RELAY_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "relay.toml"
    config.write_text("")
    runner = CliRunner()
    worker = ["worker", "--config", str(config)]
    assert runner.invoke(main, worker, env={"RELAY_METRICS_PORT": "9187"}).exit_code == 0
    assert runner.invoke(main, [*worker, "--metrics-host", "0.0.0.0"]).exit_code == 0
    assert calls == [
        {"metrics_host": "127.0.0.1", "metrics_port": 9187},
        {"metrics_host": "0.0.0.0", "metrics_port": None},
    ]


@pytest.fixture
async def metrics_redis_url() -> AsyncIterator[str]:
    """The machine's Redis, database 9 (by default), emptied with FLUSHDB before and after."""
    client = Redis.from_url(METRICS_REDIS_URL, socket_connect_timeout=2)
    try:
        await client.flushdb()
    except (RedisError, OSError) as exc:
        await client.aclose()
        service_missing("Redis", exc)
    yield METRICS_REDIS_URL
    await client.flushdb()
    await client.aclose()


@pytest.mark.slow
async def test_relay_worker_serves_its_figures_on_its_metrics_port(
    tmp_path: Path, sink: Sink, metrics_redis_url: str
) -> None:
    database_url = f"sqlite:///{tmp_path / 'relay.db'}"
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "{database_url}"\nredis_url = "{metrics_redis_url}"\n'
        'sweep_interval = "200ms"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        f'[destinations.crm]\ntype = "http"\nurl = "{sink.url()}"\ntimeout = "1s"\n'
    )
    engine = create_engine(database_url)
    try:
        await migrate.upgrade(engine)
        clock = Clock(utc_now())
        await store_events(
            engine, [("/hooks/sms/inbound", factories.sms_inbound()) for _ in range(3)], clock
        )
        destinations = {"crm": {"type": "http", "url": sink.url()}}
        router = Router(Settings(destinations=destinations).destinations)
        events = await outbox.unrouted_events(engine, clock() + SECOND, 100)
        await outbox.route_events(engine, router, events, clock())  # the sweeper enqueues them
    finally:
        await engine.dispose()
    port = free_port()
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*WORKER, "--config", str(config), "--metrics-port", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=child_environment() | {"RELAY_CONFIG": ""},
        )
    try:

        async def scraped() -> str | None:
            try:
                async with httpx.AsyncClient() as client:
                    text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.TransportError:
                return None
            delivered = sample(text, "relay_delivery_lag_seconds_count", destination="crm")
            return text if delivered == 3 else None  # observed once the success is recorded

        try:
            text = await eventually(scraped, timeout=30)
        except AssertionError:
            print(log.read_text(errors="replace")[-4000:])
            raise
    finally:
        process.terminate()
        process.wait(timeout=30)
    crm = {"destination": "crm"}
    assert sample(text, "relay_delivery_attempts_total", **crm, outcome="succeeded") == 3
    assert (sample(text, "relay_sweeps_total", outcome="ok") or 0) >= 1
    assert "relay_callbacks_total" not in text  # a worker receives nothing
    assert process.returncode == 0, log.read_text(errors="replace")[-4000:]
    assert f"metrics at http://127.0.0.1:{port}/metrics" in log.read_text()
