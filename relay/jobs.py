"""The relay's own arq queue: one job per delivery attempt, with an id arq can dedupe."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from arq.connections import ArqRedis

from relay.outbox import Due

QUEUE_NAME = "relay:queue"
DELIVER_FUNCTION = "deliver"
ENQUEUE_CONCURRENCY = 32
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def deliver_job_id(due: Due) -> str:
    """``relay:deliver:<delivery id>:<attempts made>:<due time in µs>``.

    arq refuses a job id that exists, so re-enqueueing a job that is still queued is a no-op.
    The attempt count and the due time make the id of every new schedule new: the next attempt,
    a wait for a paused destination (same attempt count, later time) and a replay never collide
    with the job that is still running when they are enqueued (deliver jobs keep no result).
    """
    micros = (due.at - EPOCH) // timedelta(microseconds=1)
    return f"relay:deliver:{due.id}:{due.attempts}:{micros}"


class JobQueue:
    """Enqueues deliver jobs on the relay queue (real Redis, or fakeredis when embedded)."""

    def __init__(self, pool: ArqRedis) -> None:
        self.pool = pool
        self._limit = asyncio.Semaphore(ENQUEUE_CONCURRENCY)

    async def enqueue(self, due: Sequence[Due]) -> int:
        """Enqueue a deliver job per delivery, at its time; returns how many were new."""
        results = await asyncio.gather(*(self._enqueue_one(d) for d in due))
        return sum(results)

    async def without_jobs(self, due: Sequence[Due]) -> list[Due]:
        """The deliveries whose job is neither queued nor running (one round trip).

        arq keeps a job in its queue's sorted set until the job has finished, so a missing
        score means the job is gone: done, or lost with a flushed Redis."""
        if not due:
            return []
        async with self.pool.pipeline(transaction=False) as pipe:
            for item in due:
                pipe.zscore(QUEUE_NAME, deliver_job_id(item))
            scores = await pipe.execute()
        return [item for item, score in zip(due, scores, strict=True) if score is None]

    async def _enqueue_one(self, due: Due) -> bool:
        async with self._limit:
            job = await self.pool.enqueue_job(
                DELIVER_FUNCTION,
                due.id,
                _job_id=deliver_job_id(due),
                _queue_name=QUEUE_NAME,
                _defer_until=due.at,
            )
        return job is not None
