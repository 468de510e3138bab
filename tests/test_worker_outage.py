"""A worker and its sweeper ride out a lost queue: no exit, one line when Redis is lost, one when
it is back, and then the work goes on at once. Redis here is fakeredis told to refuse every
command (``FakeServer.connected = False``), which keeps its data, as a Redis with an append-only
file does across a restart; the processes against a real ``redis-server`` restarted are in
``tests/test_redis_outage.py``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import fakeredis
import pytest
from arq import func
from arq.connections import ArqRedis
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.destinations import parse_destination_config
from relay.dispatch.jobs import QUEUE_NAME, JobQueue
from relay.dispatch.queue_connection import Backoff, QueueConnection
from relay.dispatch.worker import RelayWorker
from relay.outbox.router import Router
from relay.outbox.sweeper import Sweeper
from relay.server.runtime import close_worker
from relay.simulator import factories
from tests.relay_support import Clock, store_events
from tests.store_support import eventually, within

QUICK = Backoff(first=0.001, cap=0.01)
"""Probes a few milliseconds apart: the tests wait for the queue to be back, not for a probe."""
LONG_JOB_TIMEOUT = 300
"""arq keeps a started job's in-progress mark for its timeout + 10 s: far beyond the tests'
waits, so a job runs again within them only if its mark was released."""


class FakeRedis:
    """An arq pool on a fakeredis server the test takes down and brings back."""

    def __init__(self) -> None:
        self.server = fakeredis.FakeServer()
        self.pool = ArqRedis(
            connection_pool=fakeredis.FakeAsyncRedis(server=self.server).connection_pool
        )

    def down(self) -> None:
        self.server.connected = False

    def up(self) -> None:
        self.server.connected = True


@pytest.fixture
async def redis() -> AsyncIterator[FakeRedis]:
    redis = FakeRedis()
    yield redis
    await redis.pool.aclose()


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The queue's lines at INFO and above, each cut to its first words."""
    return [
        r.getMessage().split(":")[0].split(" after ")[0]
        for r in caplog.records
        if r.name == "relay.queue_connection" and r.levelno >= logging.INFO
    ]


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Records at INFO and above that carry a traceback."""
    return [r.getMessage() for r in caplog.records if r.exc_info and r.levelno >= logging.INFO]


@contextlib.asynccontextmanager
async def running(worker: RelayWorker) -> AsyncIterator[asyncio.Task[None]]:
    """The worker's loop as a task; stopped as `relay worker` stops it."""
    task = asyncio.create_task(worker.async_run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await close_worker(worker)


def new_worker(
    worker_class: type[RelayWorker],
    redis: FakeRedis,
    job: Callable[..., Any],
    **options: Any,
) -> RelayWorker:
    return worker_class(
        functions=[func(job, name="job")],
        queue_name=QUEUE_NAME,
        redis_pool=redis.pool,
        handle_signals=False,
        poll_delay=0.01,
        keep_result=0,
        job_timeout=LONG_JOB_TIMEOUT,
        connection=QueueConnection(redis.pool, backoff=QUICK),
        **options,
    )


async def enqueue(worker: RelayWorker, job_id: str) -> None:
    await worker.pool.enqueue_job("job", job_id, _job_id=job_id, _queue_name=QUEUE_NAME)


WORKERS = pytest.mark.parametrize("worker_class", [RelayWorker])


@WORKERS
async def test_a_worker_rides_out_a_lost_queue_and_runs_what_comes_after(
    worker_class: type[RelayWorker], redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ran: list[str] = []

    async def job(ctx: dict[str, Any], name: str) -> None:
        ran.append(name)

    worker = new_worker(worker_class, redis, job)
    async with running(worker) as task:
        await enqueue(worker, "before")
        await eventually(lambda: ran == ["before"])

        redis.down()
        await eventually(lambda: not worker.connection.connected)
        redis.up()
        await within(worker.connection.until_connected())
        assert not task.done()

        await enqueue(worker, "after")
        await eventually(lambda: ran == ["before", "after"])
        assert not task.done()
    assert outage_lines(caplog) == ["queue lost", "queue back"]
    assert tracebacks(caplog) == []


@WORKERS
async def test_a_job_whose_bookkeeping_the_outage_cut_short_runs_again_once_it_is_back(
    worker_class: type[RelayWorker], redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The job's end cannot be recorded in Redis: the job stays queued, marked in progress for
    its timeout + 10 s. Once the queue is back the mark is dropped and the job runs again at
    once (its deliveries, done, are no longer due: a no-op)."""
    caplog.set_level(logging.INFO)
    ran: list[str] = []

    async def job(ctx: dict[str, Any], name: str) -> None:
        ran.append(name)
        if len(ran) == 1:
            redis.down()  # Redis goes away while the job runs

    worker = new_worker(worker_class, redis, job)
    async with running(worker) as task:
        await enqueue(worker, "cut-short")
        await eventually(lambda: not worker.connection.connected)
        assert ran == ["cut-short"]
        redis.up()
        await eventually(lambda: ran == ["cut-short", "cut-short"])
        await eventually(lambda: _empty(worker))
        assert not task.done()
    assert outage_lines(caplog) == ["queue lost", "queue back"]
    assert tracebacks(caplog) == []


async def _empty(worker: RelayWorker) -> bool:
    return await worker.pool.zcard(QUEUE_NAME) == 0


@WORKERS
async def test_a_start_the_outage_interrupted_gives_its_slot_back(
    worker_class: type[RelayWorker], redis: FakeRedis
) -> None:
    """arq counts a job among the running ones before it asks Redis about it: a start that a
    lost queue interrupts must give its slot back, or a worker with one slot runs no job
    again after one outage."""
    ran: list[str] = []

    async def job(ctx: dict[str, Any], name: str) -> None:
        ran.append(name)

    class LosesRedisAtItsFirstStart(worker_class):  # type: ignore[misc, valid-type]
        starts = 0

        async def start_jobs(self, job_ids: list[bytes]) -> None:
            if job_ids:
                self.starts += 1
                if self.starts == 1:
                    redis.down()
            await super().start_jobs(job_ids)

    worker = new_worker(LosesRedisAtItsFirstStart, redis, job, max_jobs=1)
    async with running(worker):
        await enqueue(worker, "only")
        await eventually(lambda: not worker.connection.connected)
        assert ran == []
        redis.up()
        await eventually(lambda: ran == ["only"])


async def test_a_worker_stopped_while_the_queue_is_lost_runs_its_shutdown(
    redis: FakeRedis,
) -> None:
    """arq's close() deletes its health key in Redis before the shutdown hook; with the queue
    lost that raises: the hook (sweeper, destinations) must run all the same."""
    shut_down: list[bool] = []

    async def job(ctx: dict[str, Any], name: str) -> None:
        pass

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        shut_down.append(True)

    worker = new_worker(RelayWorker, redis, job, on_shutdown=on_shutdown)
    task = asyncio.create_task(worker.async_run())
    redis.down()
    await eventually(lambda: not worker.connection.connected)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await within(task)
    await within(close_worker(worker))
    assert shut_down == [True]
    await worker.connection.aclose()


HOOK_PATH = "/hooks/sms/inbound"


@pytest.mark.parametrize("stage", ["routing", "re-enqueueing"])
async def test_the_sweeper_waits_out_a_queue_lost_mid_sweep_then_sweeps_at_once(
    stage: str,
    engine: AsyncEngine,
    redis: FakeRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The queue is lost during a sweep, while it enqueues what it routed or what lost its job:
    the sweep stops (one line), and once the queue is back the next sweep runs at once, not an
    interval later (an hour here)."""
    caplog.set_level(logging.INFO)
    clock = Clock()
    posts = [(HOOK_PATH, factories.sms_inbound()) for _ in range(3)]
    await store_events(engine, posts, clock)
    router = Router({"crm": parse_destination_config({"type": "http", "url": "http://x/"})})
    clock.advance(timedelta(minutes=1))
    if stage == "re-enqueueing":  # routed, but their jobs are gone
        events = await outbox.unrouted_events(engine, clock(), 100)
        await outbox.route_events(engine, router, events, clock())
    connection = QueueConnection(redis.pool, backoff=QUICK)
    sweeper = Sweeper(
        engine,
        router,
        JobQueue(redis.pool, clock=clock, connection=connection),
        clock=clock,
        interval=timedelta(hours=1),
    )
    redis.down()
    task = asyncio.create_task(sweeper.run())
    try:
        await eventually(lambda: not connection.connected)
        assert len(await outbox.due_deliveries(engine, clock(), 100)) == 3
        redis.up()
        await eventually(lambda: _queued(redis, 3))
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await connection.aclose()
    assert outage_lines(caplog) == ["queue lost", "queue back"]
    assert tracebacks(caplog) == []


async def _queued(redis: FakeRedis, count: int) -> bool:
    return await redis.pool.zcard(QUEUE_NAME) == count


class LosesRedisWhileWatching(ArqRedis):
    """A pool whose transactions that watch a key (arq's enqueue, and its start of a job)
    lose Redis right after their WATCH once ``watches_left`` have gone by: redis-py then
    raises a WatchError, not a ConnectionError."""

    server: fakeredis.FakeServer
    watches_left: int | None = None

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        watch = pipe.watch

        async def watch_then_lose(*names: Any) -> Any:
            answer = await watch(*names)
            if self.watches_left == 0:
                self.watches_left = None
                self.server.connected = False
            elif self.watches_left is not None:
                self.watches_left -= 1
            return answer

        pipe.watch = watch_then_lose
        return pipe


@WORKERS
async def test_a_queue_lost_while_a_start_watches_its_job_is_an_outage_too(
    worker_class: type[RelayWorker], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    redis = FakeRedis()
    pool = LosesRedisWhileWatching(
        connection_pool=fakeredis.FakeAsyncRedis(server=redis.server).connection_pool
    )
    pool.server = redis.server
    redis.pool = pool
    ran: list[str] = []

    async def job(ctx: dict[str, Any], name: str) -> None:
        ran.append(name)

    worker = new_worker(worker_class, redis, job)
    try:
        async with running(worker) as task:
            pool.watches_left = 1  # the enqueue's; then the start's loses Redis
            await enqueue(worker, "watched")
            await eventually(lambda: not worker.connection.connected)
            redis.up()
            await eventually(lambda: ran == ["watched"])
            assert not task.done()
    finally:
        await pool.aclose()
    assert outage_lines(caplog) == ["queue lost", "queue back"]
    assert tracebacks(caplog) == []


@WORKERS
async def test_a_worker_stopped_while_a_job_ends_during_an_outage_logs_no_traceback(
    worker_class: type[RelayWorker], redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopping cancels the running jobs, but arq records a job's end in Redis shielded from
    that cancellation: an error there would be an exception nobody retrieves, which asyncio
    logs with its traceback when the task is collected."""
    caplog.set_level(logging.INFO)
    recording, stopped, recorded = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def job(ctx: dict[str, Any], name: str) -> None:
        redis.down()  # its end is recorded while Redis is lost

    class RecordsAfterTheStop(worker_class):  # type: ignore[misc, valid-type]
        async def finish_job(self, job_id: str, *args: Any, **kwargs: Any) -> None:
            recording.set()
            await stopped.wait()
            try:
                await super().finish_job(job_id, *args, **kwargs)
            finally:
                recorded.set()

    worker = new_worker(RecordsAfterTheStop, redis, job)
    task = asyncio.create_task(worker.async_run())
    await enqueue(worker, "last")
    await within(recording.wait())
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await within(task)
    await within(close_worker(worker))  # cancels the job, whose end is still being recorded
    stopped.set()
    await within(recorded.wait())
    await worker.connection.aclose()
    gc.collect()  # a task that ended with an error nobody retrieved is reported now
    assert tracebacks(caplog) == []
