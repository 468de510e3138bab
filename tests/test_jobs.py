"""Deliver job ids: a queued job is never duplicated, every new schedule gets a new job; while
the queue's Redis is lost, nothing is enqueued and no error is raised (the sweepers enqueue)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import fakeredis
import pytest
from arq.connections import ArqRedis
from arq.constants import job_key_prefix
from redis.exceptions import ResponseError

from relay.dispatch.jobs import QUEUE_NAME, JobQueue, deliver_job_id
from relay.dispatch.queue_connection import QueueConnection, QueueUnavailable
from relay.outbox import Due
from tests.relay_support import fake_arq_pool
from tests.store_support import within

AT = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=UTC)


async def test_job_ids_dedupe_queued_jobs_but_not_new_schedules() -> None:
    queue = JobQueue(fake_arq_pool())
    first = Due("d1", 3, AT)
    assert await queue.enqueue([first, first]) == 1  # the same schedule: one job
    held = Due("d1", 3, AT + timedelta(minutes=10))  # paused destination: same attempt, later
    assert await queue.enqueue([held]) == 1
    assert await queue.enqueue([Due("d1", 4, AT)]) == 1  # the next attempt
    assert deliver_job_id(first) == "relay:deliver:d1:3:" + str(
        (AT - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    )
    assert await queue.pool.zcard(QUEUE_NAME) == 3
    assert await queue.without_jobs([first, Due("d2", 0, AT)]) == [Due("d2", 0, AT)]
    await queue.pool.aclose()


async def test_a_job_days_overdue_is_queued_first_and_kept_a_day() -> None:
    """The sweeper re-enqueues deliveries that fell due during an outage: arq's own expiry
    (due time + 1 day, counted from now) would be negative, which Redis refuses."""
    now = AT + timedelta(days=3)
    queue = JobQueue(fake_arq_pool(), clock=lambda: now)
    overdue = Due("d1", 2, AT)
    current = Due("d2", 0, now)
    later = Due("d3", 1, now + timedelta(hours=10))
    assert await queue.enqueue([later, current, overdue]) == 3

    queued = await queue.pool.zrange(QUEUE_NAME, 0, -1)
    assert queued == [deliver_job_id(d).encode() for d in (overdue, current, later)]
    for due, kept in ((overdue, timedelta(days=1)), (later, timedelta(hours=34))):
        ttl = timedelta(milliseconds=await queue.pool.pttl(job_key_prefix + deliver_job_id(due)))
        assert kept - timedelta(minutes=1) < ttl <= kept
    await queue.pool.aclose()


class Stalled:
    """An injected sleep for the queue connection's probe that waits until released: the queue
    stays lost, whatever Redis does, until the test says so."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        await self.released.wait()


async def test_while_the_queue_is_lost_enqueue_leaves_the_jobs_to_the_sweepers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    server = fakeredis.FakeServer()
    pool = ArqRedis(connection_pool=fakeredis.FakeAsyncRedis(server=server).connection_pool)
    probe = Stalled()
    queue = JobQueue(
        pool, clock=lambda: AT, connection=QueueConnection(pool, sleep=probe, clock=lambda: 0.0)
    )
    server.connected = False

    assert await queue.enqueue([Due("d1", 0, AT), Due("d2", 0, AT, job="batch")]) == 0
    assert not queue.connection.connected
    with pytest.raises(QueueUnavailable):
        await queue.without_jobs([Due("d1", 0, AT)])

    server.connected = True  # Redis answers again, but no probe has said so yet
    assert await queue.enqueue([Due("d3", 0, AT)]) == 0  # not even tried while lost
    with pytest.raises(QueueUnavailable):
        await queue.without_jobs([Due("d3", 0, AT)])
    assert await pool.zcard(QUEUE_NAME) == 0

    probe.released.set()
    await within(queue.connection.until_connected())
    assert await queue.enqueue([Due("d3", 0, AT)]) == 1
    assert await queue.without_jobs([Due("d1", 0, AT), Due("d3", 0, AT)]) == [Due("d1", 0, AT)]
    assert [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records] == [
        ("WARNING", "queue lost"),
        ("INFO", "queue back after 0.0 s"),
    ]
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.INFO)
    await queue.connection.aclose()
    await pool.aclose()


async def test_an_error_redis_answers_is_raised_not_taken_for_an_outage() -> None:
    """A command Redis refuses (here: the queue's key holds a string, not a sorted set) is a
    fault to see, not an outage to wait out."""
    pool = fake_arq_pool()
    queue = JobQueue(pool, clock=lambda: AT)
    await pool.set(QUEUE_NAME, "not a sorted set")
    with pytest.raises(ResponseError):
        await queue.enqueue([Due("d1", 0, AT)])
    assert queue.connection.connected
    await pool.aclose()
