"""The relay worker: arq functions, start-up/shutdown, and the embedded (fakeredis) variant.

`relay worker` runs :func:`build_worker` on a real Redis. `relay serve` without ``redis_url``
runs the very same worker inside its own event loop on fakeredis (:class:`EmbeddedWorker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import sniffio
from arq import func
from arq.connections import ArqRedis
from arq.worker import Worker
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.delivery import AttemptsFailed
from relay.jobs import DELIVER_FUNCTION, QUEUE_NAME, deliver_job_id
from relay.outbox import Due
from relay.services import WorkerServices, lease_for, worker_services
from relay.settings import Settings

log = logging.getLogger(__name__)

SERVICES = "relay"
ONE_MICROSECOND = timedelta(microseconds=1)


async def deliver(ctx: dict[str, Any], delivery_ids: str | list[str]) -> None:
    """arq job: one attempt of one delivery (an id) or of each of a routing batch (a list),
    then the next jobs they need."""
    services: WorkerServices = ctx[SERVICES]
    ids = [delivery_ids] if isinstance(delivery_ids, str) else delivery_ids
    try:
        next_due = await services.deliverer.attempt_many(ids)
    except AttemptsFailed as failed:
        await services.queue.enqueue(not_this_job(failed.next_due, ctx.get("job_id")))
        raise
    await services.queue.enqueue(not_this_job(next_due, ctx.get("job_id")))


def not_this_job(due: list[Due], job_id: str | None) -> list[Due]:
    """A single job that hands its delivery back unattempted would get its own id again, which
    arq refuses while this job runs: that one is moved a microsecond later."""
    return [
        dataclasses.replace(d, at=d.at + ONE_MICROSECOND) if deliver_job_id(d) == job_id else d
        for d in due
    ]


def build_worker(
    settings: Settings,
    engine: AsyncEngine,
    pool: ArqRedis,
    *,
    clock: Callable[[], datetime],
    worker_class: type[Worker] | None = None,
    handle_signals: bool = True,
) -> Worker:
    """An arq worker for the relay queue; its sweeper runs from start-up to shutdown."""
    sweeper_task: asyncio.Task[None] | None = None

    async def startup(ctx: dict[str, Any]) -> None:
        nonlocal sweeper_task
        # The jobs and the sweeper are tasks of this one: tell sniffio (httpcore and anyio ask
        # it several times per request) the answer, instead of its looking for the running
        # task each time (a getpid system call apiece on Python 3.11).
        sniffio.current_async_library_cvar.set("asyncio")
        services = worker_services(settings, engine, pool, clock)
        ctx[SERVICES] = services
        sweeper_task = asyncio.create_task(services.sweeper.run(), name="relay-sweeper")

    async def shutdown(ctx: dict[str, Any]) -> None:
        if sweeper_task is not None:
            sweeper_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper_task
        services: WorkerServices | None = ctx.get(SERVICES)
        if services is not None:
            await services.aclose()

    return (worker_class or RelayWorker)(
        functions=[func(deliver, name=DELIVER_FUNCTION, keep_result=0, max_tries=3)],
        queue_name=QUEUE_NAME,
        redis_pool=pool,
        on_startup=startup,
        on_shutdown=shutdown,
        handle_signals=handle_signals,
        max_jobs=settings.worker_concurrency,
        job_timeout=lease_for(settings),  # arq re-runs a killed worker's job 10 s after this
        keep_result=0,
        poll_delay=0.05,
        log_results=False,
    )


class RelayWorker(Worker):
    """arq's worker, minus a cost that grows with the jobs it runs: arq keeps a running job in
    the queue's sorted set, so each poll reads the running jobs first and asks Redis about each
    of them again (three round trips apiece) before it reaches a new one. Jobs this worker is
    running are skipped without asking."""

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        running = self.tasks
        await super().start_jobs([j for j in job_ids if j.decode() not in running])


class EmbeddedWorker(RelayWorker):
    """The same worker on fakeredis, which has no INFO command: arq's ``log_redis_info`` at
    start-up is replaced by a plain log line, the rest of arq's loop is unchanged."""

    async def main(self) -> None:
        log.info("embedded relay worker started (fakeredis, in-process)")
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        while True:
            await self._poll_iteration()
            await asyncio.sleep(self.poll_delay_s)
