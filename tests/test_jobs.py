"""Deliver job ids: a queued job is never duplicated, every new schedule gets a new job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from arq.constants import job_key_prefix

from relay.jobs import QUEUE_NAME, JobQueue, deliver_job_id
from relay.outbox import Due
from relay.runtime import embedded_pool

AT = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=UTC)


async def test_job_ids_dedupe_queued_jobs_but_not_new_schedules() -> None:
    queue = JobQueue(embedded_pool())
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
    queue = JobQueue(embedded_pool(), clock=lambda: now)
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
