"""The relay worker: its services (deliverer, sweeper, pruner) fed by a dispatcher.

`relay worker` runs :func:`build_worker`: arq jobs on a real Redis. `relay serve` without
``redis_url`` runs the same services inside its own event loop (:func:`embedded_relay`), fed
by an :class:`~relay.dispatch.in_process.InProcessDispatcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Any

from arq import func
from arq.connections import ArqRedis, log_redis_info
from arq.constants import in_progress_key_prefix
from arq.worker import Worker
from redis.exceptions import RedisError, ResponseError
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.event_loop import LoopName, loop_name
from receivers.store import StoreWritable
from relay.delivery.deliverer import AttemptsFailed, Deliverer
from relay.destinations.errors import database_address, describe_error, without_credentials
from relay.dispatch.in_process import Attempt, InProcessDispatcher
from relay.dispatch.jobs import (
    COMMAND_TIMEOUT_SECONDS,
    DELIVER_FUNCTION,
    QUEUE_NAME,
    WAKE_KEY,
    JobQueue,
    WakeUps,
    answer_within,
    deliver_job_id,
)
from relay.dispatch.queue_connection import QueueConnection, queue_lost
from relay.observe.metrics import WorkerMetrics
from relay.outbox import Due
from relay.server.services import WorkerServices, lease_for, worker_services
from relay.settings import Settings, SettingsError

log = logging.getLogger("relay.worker")  # stable: users filter on it

SERVICES = "relay"
JOB_SECONDS = "relay_job_seconds"
"""In a job's context: arq's time-out of the relay's jobs (the attempt lease), in seconds."""
ENQUEUE_MARGIN_SECONDS = 0.5
"""How long before its time-out a job stops enqueueing its next jobs."""
ONE_MICROSECOND = timedelta(microseconds=1)
SWITCH_INTERVAL_SECONDS = 0.0005
SHOWN_DESTINATIONS = 20
"""How many destinations the start line names (`relay destinations list` shows them all)."""


async def deliver(ctx: dict[str, Any], delivery_ids: str | list[str]) -> None:
    """arq job: one attempt of one delivery (an id) or of each of a routing batch (a list),
    then the next jobs they need."""
    services: WorkerServices = ctx[SERVICES]
    enqueue_by = asyncio.get_running_loop().time() + ctx[JOB_SECONDS] - ENQUEUE_MARGIN_SECONDS
    ids = [delivery_ids] if isinstance(delivery_ids, str) else delivery_ids
    try:
        next_due = await services.deliverer.attempt_many(ids)
    except AttemptsFailed as failed:
        await enqueue_before(services, not_this_job(failed.next_due, ctx.get("job_id")), enqueue_by)
        raise
    await enqueue_before(services, not_this_job(next_due, ctx.get("job_id")), enqueue_by)


async def enqueue_before(services: WorkerServices, due: list[Due], deadline: float) -> None:
    """Enqueue a job's next jobs, unless that would outlive the job (a Redis that is being lost
    holds every call up to its bound): arq would end the job with a time-out and log its
    traceback, once per job. Past ``deadline`` (event loop time), they are left to the sweeper,
    which enqueues due deliveries that have no job."""
    try:
        async with asyncio.timeout_at(deadline):
            await services.queue.enqueue(due)
    except TimeoutError:
        log.debug("left %d next jobs to the sweeper: the job's time was up", len(due))


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
    named = [f"{name} ({d.type})" for name, d in settings.destinations.items()]
    destinations = ", ".join(named[:SHOWN_DESTINATIONS]) + (
        f" and {len(named) - SHOWN_DESTINATIONS} more" if len(named) > SHOWN_DESTINATIONS else ""
    )
    queue = (
        f"Redis at {without_credentials(settings.redis_url)}"
        if settings.redis_url
        else "in this process (embedded)"
    )
    return (
        f"relay worker started: destinations {destinations or 'none'}; queue {queue}; "
        f"database {database_address(settings.database_url)}; "
        f"concurrency {settings.worker_concurrency}; event loop {loop}"
    )


def queue_line(redis_url: str) -> str:
    """What a scaled `relay serve` says when it starts: its deliveries are jobs on this Redis
    (without credentials), delivered only by `relay worker` processes."""
    return (
        f"relay queue on Redis at {without_credentials(redis_url)}: deliveries wait there until "
        "a `relay worker` process (on the same redis_url and database) delivers them"
    )


def build_worker(
    settings: Settings,
    engine: AsyncEngine,
    pool: ArqRedis,
    *,
    clock: Callable[[], datetime],
    worker_class: type[RelayWorker] | None = None,
    handle_signals: bool = True,
    metrics: WorkerMetrics | None = None,
    started: asyncio.Future[None] | None = None,
    connection: QueueConnection | None = None,
    writable: StoreWritable | None = None,
) -> RelayWorker:
    """An arq worker for the relay queue; its sweeper (and, with ``retention``, its pruner)
    runs from start-up to shutdown. Its attempts and sweeps are recorded in ``metrics`` (a
    private registry by default), as is the state of its ``connection`` to the queue
    (``relay_queue_connected``; a new one by default, the worker's ``connection``, stopped at
    shutdown). ``writable``: the process's state of its writes to the store
    (:mod:`receivers.store.writable`). ``started`` is resolved once its destinations have
    started, or set to the error that stopped them (a destination that can never deliver)."""
    sweeper_task: asyncio.Task[None] | None = None
    pruner_task: asyncio.Task[None] | None = None
    figures = metrics if metrics is not None else WorkerMetrics()
    if connection is None:
        connection = QueueConnection(pool, registry=figures.registry)

    async def startup(ctx: dict[str, Any]) -> None:
        nonlocal sweeper_task, pruner_task
        services = worker_services(
            settings,
            engine,
            JobQueue(pool, clock=clock, connection=connection, wake_workers=False),
            clock,
            metrics=figures,
            writable=writable,
        )
        ctx[SERVICES] = services
        ctx[JOB_SECONDS] = lease_for(settings).total_seconds()
        try:
            await services.start()
        except SettingsError as refused:
            if started is not None:
                started.set_exception(refused)
            raise
        if started is not None:
            started.set_result(None)
        sweeper_task, pruner_task = background(services)
        log.info(started_line(settings, loop_name(asyncio.get_running_loop())))

    async def shutdown(ctx: dict[str, Any]) -> None:
        await stop_background(sweeper_task, pruner_task)
        services: WorkerServices | None = ctx.get(SERVICES)
        if services is not None:
            await services.aclose()
        await connection.aclose()
        log.info("relay worker stopped")  # arq's own shutdown line shows at debug only

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
        connection=connection,
    )


def background(services: WorkerServices) -> tuple[asyncio.Task[None], asyncio.Task[None] | None]:
    """Start the sweeper and, with ``retention``, the pruner (stop them with
    :func:`stop_background`)."""
    sweeper = asyncio.create_task(services.sweeper.run(), name="relay-sweeper")
    pruner = services.pruner
    return sweeper, (asyncio.create_task(pruner.run(), name="relay-pruner") if pruner else None)


async def stop_background(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel these tasks and wait for them."""
    for task in tasks:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def attempt_with(deliverer: Deliverer) -> Attempt:
    """The in-process dispatcher's job: one attempt of each of these deliveries; a failed
    attempt is logged with its traceback (as arq logs a failed job), the others' next jobs are
    still returned."""

    async def attempt(delivery_ids: list[str]) -> list[Due]:
        try:
            return await deliverer.attempt_many(delivery_ids)
        except AttemptsFailed as failed:
            log.error("attempt of %s failed: %s", ", ".join(delivery_ids), failed, exc_info=True)
            return failed.next_due

    return attempt


@contextlib.asynccontextmanager
async def embedded_relay(
    settings: Settings,
    engine: AsyncEngine,
    clock: Callable[[], datetime],
    *,
    metrics: WorkerMetrics,
    writable: StoreWritable | None = None,
) -> AsyncIterator[InProcessDispatcher]:
    """The relay worker in this event loop (`relay serve` without ``redis_url``): its
    destinations started (a :class:`SettingsError` names one that can never deliver), its
    sweeper and pruner running, its jobs dispatched in process; yields the dispatcher, for the
    routing hook and the console. On exit, running attempts get
    :data:`~relay.dispatch.in_process.SHUTDOWN_GRACE_SECONDS` to finish."""
    dispatcher = InProcessDispatcher(
        concurrency=settings.worker_concurrency,
        clock=clock,
        timeout=lease_for(settings),
        registry=metrics.registry,
    )
    services = worker_services(
        settings, engine, dispatcher, clock, metrics=metrics, writable=writable
    )
    try:
        await services.start()
        dispatcher.start(attempt_with(services.deliverer))
        tasks = background(services)
        log.info(started_line(settings, loop_name(asyncio.get_running_loop())))
        try:
            yield dispatcher
        finally:
            await stop_background(*tasks)
            await dispatcher.aclose()
    finally:
        await services.aclose()


class RelayWorker(Worker):
    """arq's worker, with a loop of its own (:meth:`main`) that waits a lost queue out.

    arq's loop ends the worker at the first Redis error of a poll, and its job bookkeeping's
    errors end it at the next poll: one Redis restart, even of a second, stopped every worker
    while the deliveries waited in the database. Here a Redis error is reported to
    ``connection`` (:class:`~relay.dispatch.queue_connection.QueueConnection`: one line when the
    queue is lost, one when it is back) and the loop waits until Redis answers again. The loop and
    the overrides below use arq's public pieces only (``on_startup``, ``start_jobs``,
    ``run_job``, ``finish_job``, ``finish_failed_job``, ``heart_beat``, ``tasks``,
    ``job_counter``, ``sem``); arq's burst mode, job aborts and ``allow_pick_jobs`` are not used
    by the relay and not run.

    It also skips a cost that grows with the jobs it runs: arq keeps a running job in the
    queue's sorted set, so each poll reads the running jobs first and asks Redis about each of
    them again (three round trips apiece) before it reaches a new one. Jobs this worker is
    running are skipped without asking."""

    def __init__(self, *args: Any, connection: QueueConnection | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.connection = connection if connection is not None else QueueConnection(self.pool)
        self._stranded: set[str] = set()
        """Jobs whose bookkeeping in Redis a lost queue cut short (see :meth:`run_job`)."""
        self.wake_ups = WakeUps("worker")

    async def main(self) -> None:
        """Start up, then poll until cancelled, waiting while the queue is lost."""
        await self.start_up()
        while True:
            if not self.connection.connected:
                await self.connection.until_connected()
            try:
                async with answer_within():  # a Redis that hangs is lost too
                    await self.poll()
                # asked before the wait begins: a cancellation during the wait then leaves no
                # un-awaited coroutine behind
                wait = await self.until_next_poll()
                await self.pause(wait)
            except Exception as exc:
                if not queue_lost(exc):
                    raise
                self.connection.lost(exc)

    async def start_up(self) -> None:
        """Say which Redis this is, then run the start-up hook."""
        try:
            await self.announce()
        except Exception as exc:
            if queue_lost(exc):
                self.connection.lost(exc)
            elif isinstance(exc, RedisError):  # INFO refused (a user's ACL, fakeredis)
                log.debug("Redis refused INFO: %s", describe_error(exc))
            else:
                raise
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)

    async def announce(self) -> None:
        """arq's line about the Redis server (version, memory, clients, keys), told by the
        relay's logger: arq's own logger shows at debug only."""
        await log_redis_info(self.pool, log.info)

    async def poll(self) -> None:
        """Start the queued jobs that are due (within ``max_jobs``), forget the jobs that
        ended, beat arq's heart (its health key, which `arq --check` and the scripts read)."""
        if self._stranded:
            await self.release_stranded()
        if self.job_counter < self.max_jobs:
            now_ms = time.time() * 1000
            due = await self.pool.zrangebyscore(
                self.queue_name, "-inf", now_ms, start=0, num=self.queue_read_limit
            )
            await self.start_jobs(due)
        self._forget_finished()
        await self.heart_beat()

    async def until_next_poll(self) -> float:
        """Seconds until the next poll: ``poll_delay``."""
        return self.poll_delay_s

    async def pause(self, seconds: float) -> None:
        """Wait until the next poll, or less when an enqueuer wakes this worker (a blocking
        read of :data:`~relay.dispatch.jobs.WAKE_KEY`)."""
        try:
            async with answer_within(seconds + COMMAND_TIMEOUT_SECONDS):
                await self.pool.blpop([WAKE_KEY], timeout=seconds)
        except ResponseError as refused:  # the key holds something else: poll only
            self.wake_ups.refused(refused)
            await asyncio.sleep(seconds)
        else:
            self.wake_ups.worked()

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """arq's, one job at a time, skipping the jobs this worker runs (see the class
        docstring). A lost queue interrupts the start of a job after arq has counted it among
        the running ones: its slot is given back here (arq's own keeps it, and a worker that
        lived through ``max_jobs`` such outages would start no job again), and the job is
        stranded (see :meth:`run_job`): Redis may have marked it in progress."""
        for job_id in job_ids:
            if self.job_counter >= self.max_jobs:
                return
            if job_id.decode() in self.tasks:
                continue
            try:
                await super().start_jobs([job_id])
            except Exception as exc:
                if queue_lost(exc):
                    self.job_counter -= 1
                    self.sem.release()
                    self._stranded.add(job_id.decode())
                raise

    async def run_job(self, job_id: str, score: int) -> None:
        """arq's, except that a lost queue ends the job's bookkeeping in Redis quietly (arq's
        own raises, which ended the worker at its next poll). What the job did is in the
        database whatever Redis does; the job is stranded: its in-progress mark may be left in
        Redis, so :meth:`release_stranded` deletes it once the queue is back."""
        try:
            await super().run_job(job_id, score)
        except Exception as exc:
            if not queue_lost(exc):
                raise
            self._strand(job_id, exc)

    async def finish_job(self, job_id: str, *args: Any, **kwargs: Any) -> None:
        """arq's, made as quiet as :meth:`run_job` about a lost queue: arq runs it shielded
        from the job's cancellation (a worker stopping), so an error it raised after that
        would be logged by asyncio as never retrieved, with its traceback."""
        try:
            await super().finish_job(job_id, *args, **kwargs)
        except Exception as exc:
            if not queue_lost(exc):
                raise
            self._strand(job_id, exc)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        """arq's, as quiet as :meth:`finish_job` (shielded alike)."""
        try:
            await super().finish_failed_job(job_id, result_data)
        except Exception as exc:
            if not queue_lost(exc):
                raise
            self._strand(job_id, exc)

    def _strand(self, job_id: str, error: BaseException) -> None:
        self.connection.lost(error)
        self._stranded.add(job_id)

    async def release_stranded(self) -> None:
        """Let the stranded jobs that are still queued run again at once: arq keeps a started
        job's in-progress mark for its timeout + 10 s, and the sweeper leaves a queued job
        alone, so their deliveries would wait that long. A job that had done its work runs
        again as a no-op (its deliveries are no longer due in the database), as does a job run
        twice at once (a delivery is attempted only under its lease)."""
        stranded = sorted(self._stranded)
        await self.pool.delete(*(in_progress_key_prefix + job_id for job_id in stranded))
        self._stranded.difference_update(stranded)

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
