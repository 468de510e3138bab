"""The embedded worker polls fakeredis only while work is in sight: woken by every enqueue of
its process, else when the earliest queued job is due, and at least every idle_poll_seconds."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

import pytest
from arq import func

from relay.jobs import QUEUE_NAME, JobQueue
from relay.outbox import Due
from relay.runtime import embedded_pool
from relay.worker import EmbeddedWorker, idle_wait

GUARD_SECONDS = 30  # a guard against hanging, far beyond any wait the test relies on


@pytest.mark.parametrize(
    ("due_ms", "now_ms", "expected"),
    [
        (None, 1_000, 1.0),  # nothing queued: the idle poll
        (1_300, 1_000, 0.3),  # a job due in 300 ms
        (990, 1_000, 0.05),  # due or running: the poll delay
        (1_000_000, 1_000, 1.0),  # due much later: the idle poll
    ],
)
def test_idle_wait(due_ms: float | None, now_ms: float, expected: float) -> None:
    assert idle_wait(due_ms, now_ms, 0.05, 1.0) == pytest.approx(expected)


async def test_queue_calls_on_enqueue_only_for_new_jobs() -> None:
    calls: list[None] = []
    queue = JobQueue(embedded_pool(), on_enqueue=lambda: calls.append(None))
    due = Due("d1", 0, datetime.now(UTC))
    assert await queue.enqueue([due]) == 1
    assert await queue.enqueue([due]) == 0  # already queued: no new job, no wake-up
    assert await queue.enqueue([]) == 0
    assert len(calls) == 1
    await queue.pool.aclose()


class WatchedWorker(EmbeddedWorker):
    """Tells when it has settled into waiting for work."""

    idle_poll_seconds = 3600.0  # without a wake-up it would not poll again during the test

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = asyncio.Event()

    async def until_next_poll(self) -> float:
        seconds = await super().until_next_poll()
        self.waiting.set()
        return seconds


async def test_an_enqueue_wakes_the_idle_worker() -> None:
    pool = embedded_pool()
    ran: list[str] = []
    done = asyncio.Event()

    async def deliver(ctx: dict[str, Any], delivery_id: str) -> None:
        ran.append(delivery_id)
        done.set()

    worker = WatchedWorker(
        functions=[func(deliver, name="deliver")],
        queue_name=QUEUE_NAME,
        redis_pool=pool,
        handle_signals=False,
        poll_delay=0.05,
        keep_result=0,
    )
    task = asyncio.create_task(worker.async_run())
    try:
        await asyncio.wait_for(worker.waiting.wait(), GUARD_SECONDS)  # polled, found nothing
        assert await worker.until_next_poll() == 3600.0

        await JobQueue(pool, on_enqueue=worker.wake).enqueue([Due("d1", 0, datetime.now(UTC))])
        await asyncio.wait_for(done.wait(), GUARD_SECONDS)
        assert ran == ["d1"]

        worker.tasks["running"] = asyncio.create_task(asyncio.Event().wait())
        try:
            assert await worker.until_next_poll() == 0.05  # a job runs: poll at poll_delay
        finally:
            worker.tasks.pop("running").cancel()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await worker.close()
        await pool.aclose()
