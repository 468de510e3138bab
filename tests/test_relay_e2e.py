"""The relay end to end: embedded mode (one process, dispatched in process), and workers on real
Redis surviving FLUSHALL and SIGKILL with nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from arq.connections import ArqRedis, RedisSettings, create_pool
from redis.asyncio import Redis
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.app import utc_now
from relay.dispatch.worker import build_worker
from relay.outbox.tables import SUCCEEDED, Delivery
from relay.server.runtime import Runtime, close_worker, start
from relay.settings import Settings
from relay.simulator import factories
from relay.store import inspect
from tests.conftest import REDIS_URL, TOKEN, running_client
from tests.store_support import eventually
from tests.support import Answer, Sink

POSTS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    ("/hooks/sms/inbound", factories.sms_inbound),
    ("/hooks/sms/dlr", factories.sms_dlr),
    ("/hooks/numinfo/gnp", factories.numinfo_gnp),
    ("/hooks/conversations", factories.conversations_status),
    ("/hooks/tts/events", factories.tts_event),
]


def quick_settings(
    database_url: str,
    destinations: dict[str, dict[str, Any]],
    *,
    first_retry: str = "2s",
    then: str = "2s",
    **extra: Any,
) -> Settings:
    """Settings whose destinations retry soon: the policy ``quick`` (``first_retry``, then
    every ``then``), a 1 s timeout unless a table sets its own, a 200 ms sweep."""
    return Settings(
        database_url=database_url,
        sources={"default": {"token": TOKEN}},
        destinations={
            name: {"policy": "quick", "timeout": "1s", **table}
            for name, table in destinations.items()
        },
        policies={
            "quick": {
                "type": "delays",
                "delays": [first_retry],
                "then": then,
                "give_up_after": "10m",
            }
        },
        sweep_interval="200ms",
        lease_margin="1s",
        **extra,
    )


def settings_for(database_url: str, sink: Sink, first_retry: str = "2s", **extra: Any) -> Settings:
    """Quick settings with one HTTP destination, ``crm``, posting to ``sink``."""
    destinations = {"crm": {"type": "http", "url": sink.url()}}
    return quick_settings(database_url, destinations, first_retry=first_retry, **extra)


@contextlib.asynccontextmanager
async def serving(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    """The whole `relay serve` app in-process, lifespan running."""
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


async def post_events(client: httpx.AsyncClient, count: int) -> set[str]:
    ids = set()
    for index in range(count):
        path, factory = POSTS[index % len(POSTS)]
        answer = await client.post(f"{path}?token={TOKEN}", json=factory())
        assert answer.status_code == 200, answer.text
        ids.add(answer.json()["id"])
    return ids


def delivered_ids(sink: Sink) -> set[str]:
    return {r.headers["webhook-id"] for r in sink.requests}


async def test_embedded_mode_end_to_end(engine: AsyncEngine, database_url: str, sink: Sink) -> None:
    """One process, no Redis server: receivers, in-process dispatcher, worker and sweeper."""
    runtime = await start(settings_for(database_url, sink))
    async with serving(runtime) as client:
        ids = await post_events(client, 25)
        await eventually(lambda: all_succeeded(runtime.engine, 25))
        rows = await inspect.list_deliveries(runtime.engine, limit=100)
    assert {r["event_id"] for r in rows} == ids
    envelopes = [json.loads(r.body) for r in sink.requests]
    assert {e["id"] for e in envelopes} == ids


@pytest.mark.slow
async def test_sweeper_routes_events_whose_hook_never_ran(
    engine: AsyncEngine, database_url: str, sink: Sink
) -> None:
    async with running_client(engine) as receiver_only:  # stores, but routes nothing
        ids = await post_events(receiver_only, 10)
    assert await inspect.list_deliveries(engine) == []

    runtime = await start(settings_for(database_url, sink))
    async with serving(runtime):
        await eventually(lambda: delivered_ids(sink) >= ids)


@contextlib.asynccontextmanager
async def worker_on(settings: Settings, engine: AsyncEngine) -> AsyncIterator[None]:
    """A relay worker on the real Redis (``settings.redis_url``), in this event loop."""
    assert settings.redis_url
    pool = await create_pool(RedisSettings.from_dsn(settings.redis_url))
    worker = build_worker(settings, engine, pool, clock=utc_now, handle_signals=False)
    task = asyncio.create_task(worker.async_run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await close_worker(worker)  # a job may still be finishing: arq's close() would raise


@pytest.mark.slow
async def test_every_destination_type_through_a_worker_on_real_redis(
    engine: AsyncEngine, database_url: str, sink: Sink, redis: Redis
) -> None:
    settings = settings_for(database_url, sink, redis_url=REDIS_URL)
    settings.destinations.update(
        Settings(
            destinations={
                "stream": {"type": "redis-stream", "url": REDIS_URL, "stream": "cpaas-events"},
                "jobs": {
                    "type": "arq",
                    "url": REDIS_URL,
                    "function": "handle_platform_event",
                    "queue_name": "user:queue",
                },
            }
        ).destinations
    )
    runtime = await start(settings)
    async with serving(runtime) as client, worker_on(settings, engine):
        ids = await post_events(client, 10)
        await eventually(lambda: delivered_ids(sink) >= ids)
        await eventually(lambda: all_succeeded(engine, 30))
    stream = await redis.xrange("cpaas-events")
    assert {fields[b"id"].decode() for _, fields in stream} == ids
    user_pool = ArqRedis(connection_pool=redis.connection_pool)
    jobs = await user_pool.queued_jobs(queue_name="user:queue")
    assert {job.args[0]["id"] for job in jobs} == ids
    assert {job.function for job in jobs} == {"handle_platform_event"}


async def all_succeeded(engine: AsyncEngine, expected: int) -> bool:
    """Whether exactly ``expected`` deliveries exist, all succeeded."""
    rows = await inspect.list_deliveries(engine, limit=10_000)
    return len(rows) == expected and all(r["status"] == SUCCEEDED for r in rows)


async def _delivery_states(engine: AsyncEngine) -> str:
    """The deliveries that have not succeeded, one per line (for a failure's report)."""
    rows = await inspect.list_deliveries(engine, limit=10_000)
    pending = [r for r in rows if r["status"] != SUCCEEDED]
    return f"{len(rows)} deliveries, {len(pending)} not succeeded:\n" + "\n".join(
        json.dumps(r, default=str) for r in pending
    )


@pytest.mark.slow
async def test_flushall_mid_run_loses_nothing(
    engine: AsyncEngine, database_url: str, sink: Sink, private_redis_url: str
) -> None:
    """FLUSHALL empties the whole server: a Redis server of the test's own, not the shared one."""
    # the flush must come while every retry is queued and none has run: the first retries wait
    # far longer than any loaded machine takes to record 20 first attempts (8 s and 15 s were
    # not enough, once each, in full CI runs); after the flush the test makes them due at once
    # in SQL, the store being the truth the sweeper rebuilds the queue from
    settings = settings_for(database_url, sink, first_retry="5m", redis_url=private_redis_url)
    sink.answers["/hook"] = Answer(500)
    runtime = await start(settings)
    redis = Redis.from_url(private_redis_url, socket_connect_timeout=2)
    async with (
        contextlib.aclosing(redis),
        serving(runtime) as client,
        worker_on(settings, engine),
    ):
        ids = await post_events(client, 20)
        await eventually(lambda: len(delivered_ids(sink)) == 20)  # every first attempt failed

        async def all_waiting() -> bool:
            """Every attempt recorded and its retry queued: the first attempts' batch job has
            finished (a job still running could enqueue a retry after the flush)."""
            rows = await inspect.list_deliveries(engine, limit=100)
            queued = await redis.zrange("relay:queue", 0, -1)
            retries = [job for job in queued if job.startswith(b"relay:deliver:")]
            return (
                len(rows) == 20
                and all(r["attempts"] == 1 for r in rows)
                and len(queued) == len(retries) == 20
            )

        try:
            await eventually(all_waiting)
        except AssertionError:  # shown by pytest with the failure
            print(await _delivery_states(engine), await redis.zrange("relay:queue", 0, -1))
            raise
        await redis.flushall()  # the deferred retry jobs are gone
        assert await redis.zcard("relay:queue") == 0
        sink.answers["/hook"] = Answer(200)
        async with engine.begin() as conn:  # five minutes go by
            await conn.execute(update(Delivery).values(next_attempt_at=utc_now()))
        await eventually(lambda: all_succeeded(engine, 20), timeout=60)
    ok = {r.headers["webhook-id"] for r in sink.requests if r.path == "/hook"}
    assert ok == ids
    rows = await inspect.list_deliveries(engine, limit=100)
    assert all(r["attempts"] == 2 for r in rows)


@pytest.mark.slow
async def test_worker_killed_mid_run_loses_nothing(
    engine: AsyncEngine, database_url: str, sink: Sink, redis: Redis, tmp_path: Path
) -> None:
    sink.answers["/hook"] = Answer(200, delay=0.3)
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "{database_url}"\nredis_url = "{REDIS_URL}"\n'
        'sweep_interval = "200ms"\nlease_margin = "1s"\nworker_concurrency = 4\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        f'[destinations.crm]\ntype = "http"\nurl = "{sink.url()}"\ntimeout = "1s"\n'
    )
    settings = Settings(**_toml(config))
    runtime = await start(settings)
    logs: list[Path] = []

    async def worker() -> asyncio.subprocess.Process:
        logs.append(tmp_path / f"worker-{len(logs) + 1}.log")
        with logs[-1].open("wb") as log:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "relay",
                "worker",
                "--config",
                str(config),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "RELAY_CONFIG": ""},
            )

    async with serving(runtime) as client:
        first = await worker()
        ids = await post_events(client, 40)
        await eventually(lambda: len(delivered_ids(sink)) >= 8)
        first.send_signal(signal.SIGKILL)
        await first.wait()
        assert len(delivered_ids(sink)) < 40
        second = await worker()
        try:
            await eventually(lambda: delivered_ids(sink) >= ids, timeout=60)
            await eventually(lambda: all_succeeded(engine, 40), timeout=30)
        except AssertionError:
            print(await _delivery_states(engine))  # shown by pytest with the failure
            for log in logs:
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-4000:]}")
            raise
        finally:
            second.terminate()
            await second.wait()
    duplicates = len(sink.requests) - len(ids)
    assert duplicates <= 2 * 4  # at most its unrecorded attempts (2 x worker_concurrency)


def _toml(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


@pytest.fixture(autouse=True)
def _no_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RELAY_") and name != "RELAY_TEST_PG_DSN":
            monkeypatch.delenv(name)
