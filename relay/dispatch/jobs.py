"""The relay's own arq queue: a job per delivery attempt, or per routing batch of first attempts,
with ids arq can dedupe. While its Redis is lost (:mod:`relay.dispatch.queue_connection`),
nothing is enqueued: the deliveries wait in the database for the sweepers.

A job due now also wakes a waiting worker (:data:`WAKE_KEY`): a worker polls the queue every
50 ms, and waits between polls on a blocking read of that key, so a first attempt starts about
when it is enqueued instead of at the next poll."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from arq.connections import ArqRedis, RedisSettings
from redis.exceptions import RedisError, ResponseError

from receivers.store import utc_now
from relay.destinations.errors import describe_error, without_credentials
from relay.dispatch.queue_connection import QueueConnection, QueueUnavailable, queue_lost
from relay.outbox import Due
from relay.settings import SettingsError

log = logging.getLogger(__name__)

QUEUE_NAME = "relay:queue"
DELIVER_FUNCTION = "deliver"
ENQUEUE_CONCURRENCY = 32
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CONNECT_TIMEOUT_SECONDS = 1.0
COMMAND_TIMEOUT_SECONDS = 5.0
"""The longest the relay waits for Redis to answer a command (none of its commands block)."""
WAKE_KEY = "relay:queue:wake"
"""A list of at most one item: pushed when a job due now is enqueued, popped by a waiting
worker (``BLPOP``), which then polls at once. One push wakes one worker; the others find the
job at their next poll."""
EXPIRY_MARGIN = timedelta(days=1)
"""How long a job may wait in the queue past its due time before arq drops it (arq's default)."""


def deliver_job_id(due: Due) -> str:
    """``relay:deliver:<delivery id>:<attempts made>:<due time in µs>``.

    arq refuses a job id that exists, so re-enqueueing a job that is still queued is a no-op.
    The attempt count and the due time make the id of every new schedule new: the next attempt,
    a wait for a paused destination (same attempt count, later time) and a replay never collide
    with the job that is still running when they are enqueued (deliver jobs keep no result).
    """
    micros = (due.at - EPOCH) // timedelta(microseconds=1)
    return f"relay:deliver:{due.id}:{due.attempts}:{micros}"


async def open_pool(redis_url: str) -> ArqRedis:
    """A connection pool to the relay queue's Redis, checked with one PING, without retries: a
    Redis that is down or refuses the login is a :class:`SettingsError` naming it, without its
    password.

    A Redis that hangs (stopped, or a partition that drops packets) would stall a poll or an
    enqueue for good, unnoticed: the relay's own calls give up after
    :data:`COMMAND_TIMEOUT_SECONDS` (:func:`answer_within`), which reports the queue lost.
    Not redis-py's ``socket_timeout``: with it, a task cancelled during a command may go on as
    if it had not been (``relay worker`` then ignored SIGTERM)."""
    try:
        RedisSettings.from_dsn(redis_url)  # the schemes and forms arq's workers take
        pool = ArqRedis.from_url(
            redis_url,
            socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        )
    except (RuntimeError, ValueError):
        raise SettingsError(
            f"redis_url {without_credentials(redis_url)} is not a redis://, rediss:// or "
            "unix:// URL"
        ) from None
    try:
        await pool.ping()
    except (RedisError, OSError, TimeoutError) as exc:
        await pool.aclose()
        raise SettingsError(
            f"cannot connect to Redis at {without_credentials(redis_url)}: {describe_error(exc)}"
        ) from None
    return pool


class WakeUps:
    """Whether :data:`WAKE_KEY` can be used: Redis refuses it when something else was stored
    under its name. The workers then find new jobs at their next poll; one line is logged when
    that starts and one when it ends, not one per job."""

    def __init__(self, who: str) -> None:
        self._who = who
        self._refused = False

    def refused(self, error: ResponseError) -> None:
        if not self._refused:
            self._refused = True
            log.warning(
                "wake-ups off (%s): Redis refused %s: %s; jobs start at the next poll",
                self._who,
                WAKE_KEY,
                describe_error(error),
            )

    def worked(self) -> None:
        if self._refused:
            self._refused = False
            log.info("wake-ups on again (%s)", self._who)


def answer_within(seconds: float = COMMAND_TIMEOUT_SECONDS) -> asyncio.Timeout:
    """A bound on a call to the queue's Redis: past it, :class:`TimeoutError` (an outage, see
    :func:`~relay.dispatch.queue_connection.queue_lost`); redis-py drops the connection of a
    command cut short."""
    return asyncio.timeout(seconds)


class JobQueue:
    """The scaled mode's dispatcher (:mod:`relay.dispatch`): deliver jobs on the relay queue's
    Redis, for `relay worker` to run; reports a lost Redis to ``connection`` (the process's;
    one of its own by default). ``wake_workers``: whether a job due now wakes a waiting
    worker (a worker's own queue does not: its next poll, within 50 ms, finds the job, and a
    job's last Redis call is one fewer)."""

    def __init__(
        self,
        pool: ArqRedis,
        clock: Callable[[], datetime] = utc_now,
        connection: QueueConnection | None = None,
        *,
        wake_workers: bool = True,
    ) -> None:
        self.pool = pool
        self._wake_workers = wake_workers
        self.connection = connection if connection is not None else QueueConnection(pool)
        self._clock = clock
        self._limit = asyncio.Semaphore(ENQUEUE_CONCURRENCY)
        self.wake_ups = WakeUps("enqueuer")

    async def enqueue(self, due: Sequence[Due]) -> int:
        """Enqueue the jobs of these deliveries, each at its time: one per batch job id (the
        first attempts of a routing pass), one per delivery otherwise; returns how many of
        those jobs were new.

        While the queue is lost, or when it is lost during the call, the jobs not enqueued are
        left out without an error: their deliveries are in the database, and the sweepers
        enqueue them once it is back."""
        if not self.connection.connected:
            return 0
        batches: dict[str, list[Due]] = {}
        singles: list[Due] = []
        for item in due:
            if item.job is None:
                singles.append(item)
            else:
                batches.setdefault(item.job, []).append(item)
        results = await asyncio.gather(
            *(self._enqueue_one(DELIVER_FUNCTION, d.id, deliver_job_id(d), d.at) for d in singles),
            *(
                self._enqueue_one(
                    DELIVER_FUNCTION, [d.id for d in items], job, min(d.at for d in items)
                )
                for job, items in batches.items()
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors:
            if not queue_lost(error):
                raise error
        if errors:
            self.connection.lost(errors[0])
            return sum(r is True for r in results)
        new = sum(r is True for r in results)
        if self._wake_workers and new and min(d.at for d in due) <= self._clock():
            await self._wake_worker()
        return new

    async def _wake_worker(self) -> None:
        """Wake a worker waiting between polls (:data:`WAKE_KEY`); a lost queue is noted, the
        jobs are enqueued already and the next poll finds them."""
        try:
            async with answer_within(), self.pool.pipeline(transaction=True) as pipe:
                pipe.lpush(WAKE_KEY, 1)
                pipe.ltrim(WAKE_KEY, 0, 0)
                await pipe.execute()
        except ResponseError as refused:  # the key holds something else
            self.wake_ups.refused(refused)
        except Exception as exc:
            if not queue_lost(exc):
                raise
            self.connection.lost(exc)
        else:
            self.wake_ups.worked()

    async def without_jobs(self, due: Sequence[Due]) -> list[Due]:
        """The deliveries whose job is neither queued nor running, as single jobs to enqueue (a
        batch job that is gone is not rebuilt: its members may be spread over several pages).

        arq keeps a job in its queue's sorted set until the job has finished, so a missing
        score means the job is gone: done, or lost with a flushed Redis. A delivery's job is,
        for a first attempt, its batch job (asked about once per batch), else its own
        (:func:`deliver_job_id`). Two round trips at most. :class:`QueueUnavailable` while the
        queue is lost."""
        batches = list({item.job for item in due if item.job is not None})
        scores = await self._scores(batches)
        queued = {job for job, score in zip(batches, scores, strict=True) if score is not None}
        candidates = [item for item in due if item.job not in queued]
        scores = await self._scores([deliver_job_id(item) for item in candidates])
        return [
            dataclasses.replace(item, job=None)
            for item, score in zip(candidates, scores, strict=True)
            if score is None
        ]

    async def _scores(self, job_ids: Sequence[str]) -> list[float | None]:
        if not self.connection.connected:
            raise QueueUnavailable(f"queue lost: {self.connection.reason}")
        if not job_ids:
            return []
        try:
            async with answer_within(), self.pool.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.zscore(QUEUE_NAME, job_id)
                return list(await pipe.execute())
        except Exception as exc:
            if not queue_lost(exc):
                raise
            self.connection.lost(exc)
            raise QueueUnavailable(f"queue lost: {self.connection.reason}") from None

    async def _enqueue_one(self, function: str, arg: object, job_id: str, at: datetime) -> bool:
        """Enqueue one job for ``at`` (its queue position: overdue jobs run oldest first). Its
        expiry is given, since arq's own (``at`` + 1 day, from now) is negative, and refused by
        Redis, for a job more than a day overdue: one the sweeper re-enqueues after an outage."""
        expires = max(at - self._clock(), timedelta(0)) + EXPIRY_MARGIN
        async with self._limit, answer_within():
            job = await self.pool.enqueue_job(
                function,
                arg,
                _job_id=job_id,
                _queue_name=QUEUE_NAME,
                _defer_until=at,
                _expires=expires,
            )
        return job is not None
