"""A deliver job enqueues its next jobs only while it has time left: a Redis being lost holds
each call up to its bound, and a job that outlives arq's time-out is logged with a traceback,
once per job. Past the deadline the next jobs are left to the sweeper."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from relay.dispatch.worker import ENQUEUE_MARGIN_SECONDS, JOB_SECONDS, SERVICES, deliver
from relay.outbox import Due
from tests.store_support import within

NEXT = [Due("d2", 1, datetime(2026, 11, 26, tzinfo=UTC))]


@dataclass
class Deliverer:
    async def attempt_many(self, ids: list[str]) -> list[Due]:
        return NEXT


@dataclass
class Queue:
    """Enqueues, or hangs as a Redis being lost does."""

    hangs: bool
    enqueued: list[list[Due]] = field(default_factory=list)

    async def enqueue(self, due: list[Due]) -> int:
        if self.hangs:
            await asyncio.Event().wait()
        self.enqueued.append(due)
        return len(due)


@dataclass
class Services:
    queue: Queue
    deliverer: Deliverer = field(default_factory=Deliverer)


def job(queue: Queue, seconds: float) -> dict[str, Any]:
    return {SERVICES: Services(queue), JOB_SECONDS: seconds, "job_id": "relay:deliver:d1:0:1"}


async def test_a_job_with_time_left_enqueues_its_next_jobs() -> None:
    queue = Queue(hangs=False)
    await deliver(job(queue, 60.0), "d1")
    assert queue.enqueued == [NEXT]


async def test_a_job_out_of_time_leaves_its_next_jobs_to_the_sweeper() -> None:
    queue = Queue(hangs=True)
    # no time left before the margin: the hanging enqueue is given up at once, no error
    await within(deliver(job(queue, ENQUEUE_MARGIN_SECONDS), "d1"))
    assert queue.enqueued == []
