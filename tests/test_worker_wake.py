"""A job due now wakes a worker waiting between polls: it starts when it is enqueued, not at the
worker's next poll; a job due later wakes no one. On the machine's Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from arq import func
from arq.connections import ArqRedis
from arq.constants import health_check_key_suffix
from redis.asyncio import Redis

from relay.dispatch.jobs import QUEUE_NAME, WAKE_KEY, JobQueue
from relay.dispatch.queue_connection import QueueConnection
from relay.dispatch.worker import RelayWorker
from relay.outbox import Due
from relay.server.runtime import close_worker
from tests.conftest import REDIS_URL
from tests.store_support import eventually

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
AN_HOUR = 3600.0
"""The workers' poll here: far longer than any test waits, so only a wake-up starts a job."""


@contextlib.asynccontextmanager
async def waiting_worker(ran: list[str], poll: float = AN_HOUR) -> AsyncIterator[ArqRedis]:
    """A relay worker on the machine's Redis that polls every ``poll`` seconds (once an hour
    by default); yields its pool."""

    async def job(ctx: dict[str, Any], delivery_ids: str | list[str]) -> None:
        ran.append(delivery_ids if isinstance(delivery_ids, str) else ",".join(delivery_ids))

    pool = ArqRedis.from_url(REDIS_URL)
    worker = RelayWorker(
        functions=[func(job, name="deliver", keep_result=0)],
        queue_name=QUEUE_NAME,
        redis_pool=pool,
        handle_signals=False,
        poll_delay=poll,
        keep_result=0,
        connection=QueueConnection(pool),
    )
    task = asyncio.create_task(worker.async_run())
    try:
        yield pool
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await close_worker(worker)


async def test_a_job_due_now_starts_before_the_next_poll(redis: Redis) -> None:
    ran: list[str] = []
    async with waiting_worker(ran) as pool:
        queue = JobQueue(pool, clock=lambda: datetime.now(UTC))
        # the worker's first poll (its heart beat) found the queue empty: it waits an hour
        await eventually(lambda: redis.exists(QUEUE_NAME + health_check_key_suffix))
        await queue.enqueue([Due("d1", 0, datetime.now(UTC))])
        await eventually(lambda: ran == ["d1"])
        await queue.enqueue([Due("d2", 0, datetime.now(UTC), job="batch-1")])
        await eventually(lambda: ran == ["d1", "d2"])
        await queue.connection.aclose()


async def test_only_jobs_due_now_wake_a_worker(redis: Redis) -> None:
    pool = ArqRedis.from_url(REDIS_URL)
    queue = JobQueue(pool, clock=lambda: NOW)
    assert await queue.enqueue([Due("later", 1, NOW + timedelta(seconds=10))]) == 1
    assert await redis.llen(WAKE_KEY) == 0
    assert await queue.enqueue([Due("now", 0, NOW), Due("again", 0, NOW)]) == 2
    assert await queue.enqueue([Due("overdue", 2, NOW - timedelta(minutes=5))]) == 1
    assert await redis.llen(WAKE_KEY) == 1  # one waiting item however many enqueues
    assert await queue.enqueue([Due("now", 0, NOW)]) == 0  # queued already: no wake-up
    await redis.delete(WAKE_KEY)
    workers_own = JobQueue(pool, clock=lambda: NOW, wake_workers=False)
    assert await workers_own.enqueue([Due("next", 1, NOW)]) == 1
    assert await redis.llen(WAKE_KEY) == 0  # a worker's next jobs wait for its next poll
    await workers_own.connection.aclose()
    await queue.connection.aclose()
    await pool.aclose()


async def test_a_wake_key_redis_refuses_leaves_the_poll_and_says_so_once(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Something else stored under the key's name (a string): jobs still start, at the
    worker's poll (here every 10 ms); one line when wake-ups stop, one when they work again."""
    caplog.set_level(logging.INFO, logger="relay.dispatch.jobs")
    await redis.set(WAKE_KEY, "not a list")
    ran: list[str] = []
    async with waiting_worker(ran, poll=0.01) as pool:
        queue = JobQueue(pool, clock=lambda: datetime.now(UTC))
        for n in range(3):
            await queue.enqueue([Due(f"d{n}", 0, datetime.now(UTC))])
            await eventually(lambda n=n: len(ran) == n + 1)
        await redis.delete(WAKE_KEY)
        await queue.enqueue([Due("d3", 0, datetime.now(UTC))])
        await eventually(lambda: len(ran) == 4)
        await eventually(lambda: len(wake_lines(caplog)) == 4)
        await queue.connection.aclose()
    assert sorted(wake_lines(caplog)) == [
        ("INFO", "wake-ups on again (enqueuer)"),
        ("INFO", "wake-ups on again (worker)"),
        ("WARNING", "wake-ups off (enqueuer)"),
        ("WARNING", "wake-ups off (worker)"),
    ]
    assert not any(r.exc_info for r in caplog.records)


def wake_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The wake-ups' lines (other loggers may log at INFO too, as arq's worker does)."""
    return [
        (r.levelname, r.getMessage().split(":")[0])
        for r in caplog.records
        if r.name == "relay.dispatch.jobs"
    ]
