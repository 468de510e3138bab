"""The relay worker: arq functions, start-up/shutdown, and the embedded (fakeredis) variant.

`relay worker` runs :func:`build_worker` on a real Redis. `relay serve` without ``redis_url``
runs the very same worker inside its own event loop on fakeredis (:class:`EmbeddedWorker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from arq import func
from arq.connections import ArqRedis
from arq.worker import Worker
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.event_loop import LoopName, loop_name
from receivers.store import StoreWritable
from relay.delivery import AttemptsFailed
from relay.destinations.errors import without_credentials
from relay.jobs import DELIVER_FUNCTION, QUEUE_NAME, deliver_job_id
from relay.metrics import WorkerMetrics
from relay.outbox import Due
from relay.services import WorkerServices, lease_for, worker_services
from relay.settings import Settings, SettingsError

log = logging.getLogger(__name__)

SERVICES = "relay"
ONE_MICROSECOND = timedelta(microseconds=1)
SWITCH_INTERVAL_SECONDS = 0.0005
IDLE_POLL_SECONDS = 1.0
"""The embedded worker's longest wait between polls (what it is not told of waits that long)."""


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


def started_line(settings: Settings, loop: LoopName) -> str:
    """What a worker says when it starts: its destinations, queue, database, concurrency and
    event loop (addresses without credentials)."""
    destinations = ", ".join(
        f"{name} ({destination.type})" for name, destination in settings.destinations.items()
    )
    queue = (
        f"Redis at {without_credentials(settings.redis_url)}"
        if settings.redis_url
        else "in this process (embedded)"
    )
    return (
        f"relay worker started: destinations {destinations or 'none'}; queue {queue}; "
        f"database {without_credentials(settings.database_url)}; "
        f"concurrency {settings.worker_concurrency}; event loop {loop}"
    )


def build_worker(
    settings: Settings,
    engine: AsyncEngine,
    pool: ArqRedis,
    *,
    clock: Callable[[], datetime],
    worker_class: type[Worker] | None = None,
    handle_signals: bool = True,
    metrics: WorkerMetrics | None = None,
    started: asyncio.Future[None] | None = None,
    writable: StoreWritable | None = None,
) -> Worker:
    """An arq worker for the relay queue; its sweeper (and, with ``retention``, its pruner)
    runs from start-up to shutdown. Its attempts and sweeps are recorded in ``metrics`` (a
    private registry by default).
    ``started`` is resolved once its destinations have started, or set to the error that
    stopped them (a destination that can never deliver). ``writable``: the process's state of
    its writes to the store (:mod:`receivers.store.writable`)."""
    sweeper_task: asyncio.Task[None] | None = None
    pruner_task: asyncio.Task[None] | None = None
    figures = metrics if metrics is not None else WorkerMetrics()

    async def startup(ctx: dict[str, Any]) -> None:
        nonlocal sweeper_task, pruner_task
        services = worker_services(
            settings, engine, pool, clock, metrics=figures, writable=writable
        )
        ctx[SERVICES] = services
        try:
            await services.start()
        except SettingsError as refused:
            if started is not None:
                started.set_exception(refused)
            raise
        if started is not None:
            started.set_result(None)
        sweeper_task = asyncio.create_task(services.sweeper.run(), name="relay-sweeper")
        if services.pruner is not None:
            pruner_task = asyncio.create_task(services.pruner.run(), name="relay-pruner")
        log.info(started_line(settings, loop_name(asyncio.get_running_loop())))

    async def shutdown(ctx: dict[str, Any]) -> None:
        for task in (sweeper_task, pruner_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
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
    """The same worker on fakeredis, in the server's own event loop.

    Its loop (:meth:`main`) is built from arq's public pieces (``start_jobs``, ``tasks``): it
    does not log Redis's INFO at start-up (fakeredis has no INFO command), and since every job
    is enqueued in this process, it does not poll while nothing is in sight (a fakeredis poll
    costs the event loop ~1 ms, which the receivers would pay for): :meth:`wake` (the process's
    queues call it on every enqueue) polls at once; else it polls when the earliest queued job
    is due, at ``poll_delay`` while jobs run, and at least every ``idle_poll_seconds``."""

    idle_poll_seconds = IDLE_POLL_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._work_in_sight = asyncio.Event()

    def wake(self) -> None:
        """Poll now: a job was enqueued."""
        self._work_in_sight.set()

    async def main(self) -> None:
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        services: WorkerServices | None = self.ctx.get(SERVICES)
        if services is not None:
            services.queue.on_enqueue = self.wake  # retries, replays and the sweeper's jobs
        while True:
            self._work_in_sight.clear()
            if self.job_counter < self.max_jobs:
                now_ms = time.time() * 1000
                due = await self.pool.zrangebyscore(
                    self.queue_name, "-inf", now_ms, start=0, num=self.queue_read_limit
                )
                await self.start_jobs(due)
            self._forget_finished()
            timeout = await self.until_next_poll()  # first: a cancellation here leaves no
            with contextlib.suppress(TimeoutError):  # un-awaited wait() coroutine behind
                await asyncio.wait_for(self._work_in_sight.wait(), timeout)

    async def until_next_poll(self) -> float:
        """Seconds until the next poll (see the class docstring)."""
        if self.tasks:  # jobs run: the next poll may start queued ones (no need to ask Redis)
            return self.poll_delay_s
        earliest = await self.pool.zrange(self.queue_name, 0, 0, withscores=True)
        due_ms = earliest[0][1] if earliest else None
        return idle_wait(due_ms, time.time() * 1000, self.poll_delay_s, self.idle_poll_seconds)

    def _forget_finished(self) -> None:
        """Drop the jobs that ended from ``tasks``; an error of arq's own surfaces here (a
        job's errors are arq's to log)."""
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()


def shorten_switch_interval(seconds: float = SWITCH_INTERVAL_SECONDS) -> None:
    """A shorter GIL switch interval for `relay worker` (a speed trick, process-wide).

    The database driver's threads (aiosqlite's, asyncpg needs none) hand every result back
    through the GIL; at Python's default 5 ms a busy event loop makes each hand-back wait up to
    that long. At 0.5 ms, ``scripts/bench_relay.py`` went from below to above 0.5 of the bare
    client (see docs/performance.md). Off: do not call it (``relay worker`` is its only
    caller)."""
    sys.setswitchinterval(seconds)


def idle_wait(due_ms: float | None, now_ms: float, poll_delay: float, idle_poll: float) -> float:
    """Seconds until the next poll: until the earliest queued job is due (a running job is
    past due: its end frees a slot), within ``poll_delay`` and ``idle_poll``."""
    if due_ms is None:
        return idle_poll
    return min(max((due_ms - now_ms) / 1000, poll_delay), idle_poll)
