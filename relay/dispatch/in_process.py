"""The embedded mode's dispatcher: due deliveries in a heap by time, handed to the deliverer
in this event loop, without a queue server and without a poll.

What it holds is also in SQL (a delivery is stored before it is dispatched), so a crash loses
nothing: the sweeper of the next start finds what was due and dispatches it again. Its
:meth:`~InProcessDispatcher.without_jobs` answers from what it holds and runs, so a sweep
leaves that alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry

from receivers.store import utc_now
from relay.dispatch.jobs import deliver_job_id
from relay.observe.metrics import queue_connected_gauge
from relay.outbox import Due

log = logging.getLogger(__name__)

Attempt = Callable[[list[str]], Awaitable[list[Due]]]
"""Attempts the deliveries of one job (their ids); returns the next jobs they need."""

SHUTDOWN_GRACE_SECONDS = 5.0
"""How long :meth:`InProcessDispatcher.aclose` lets running attempts finish; those still
running then are cancelled, and their deliveries wait for their lease to end."""


class InProcess:
    """The connection of a dispatcher in this process: never lost. ``relay_queue_connected``
    in ``registry`` (a private one by default) is 1."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        queue_connected_gauge(registry if registry is not None else CollectorRegistry())

    @property
    def connected(self) -> bool:
        return True

    @property
    def reason(self) -> str | None:
        return None

    async def until_connected(self) -> None:
        return None

    def on_back(self, listener: Callable[[], None]) -> None:
        """Never called: it is never lost."""


@dataclasses.dataclass(order=True)
class _Job:
    at: datetime
    seq: int
    job_id: str = dataclasses.field(compare=False)
    ids: list[str] = dataclasses.field(compare=False)


class InProcessDispatcher:
    """Hands each job to ``attempt`` (given to :meth:`start`) at its time, oldest first, at most
    ``concurrency`` jobs at once, each cut at ``timeout`` (the attempt lease: an attempt that
    outlives it may be made again elsewhere). A job is one delivery, or the first attempts of a
    routing batch (``Due.job``); the next jobs ``attempt`` returns (retries, the next of a
    per-key line) come back here. A job whose id is held (queued or running) is not made again.
    Times are read from ``clock``."""

    def __init__(
        self,
        *,
        concurrency: int,
        clock: Callable[[], datetime] = utc_now,
        timeout: timedelta | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.connection = InProcess(registry)
        self._concurrency = concurrency
        self._clock = clock
        self._timeout = timeout.total_seconds() if timeout is not None else None
        self._heap: list[_Job] = []
        self._held: set[str] = set()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._seq = itertools.count()
        self._changed = asyncio.Event()
        self._attempt: Attempt | None = None
        self._loop: asyncio.Task[None] | None = None
        self._closed = False

    def start(self, attempt: Attempt) -> None:
        """Begin handing jobs to ``attempt`` (those enqueued before wait until then)."""
        self._attempt = attempt
        self._loop = asyncio.get_running_loop().create_task(self._run(), name="relay-dispatcher")

    @property
    def held(self) -> int:
        """How many jobs are queued or running."""
        return len(self._held)

    async def enqueue(self, due: Sequence[Due]) -> int:
        return self._put(due)

    async def without_jobs(self, due: Sequence[Due]) -> list[Due]:
        return [
            dataclasses.replace(item, job=None)
            for item in due
            if item.job not in self._held and deliver_job_id(item) not in self._held
        ]

    async def aclose(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        """Stop: take no more jobs, drop the queued ones (they are due in SQL), let the running
        ones finish for up to ``grace`` seconds, then cancel those left (their deliveries keep
        their lease and are attempted again once it ends)."""
        self._closed = True
        self._held.difference_update(job.job_id for job in self._heap)
        self._heap.clear()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        running = list(self._running.values())
        if running:
            await asyncio.wait(running, timeout=grace)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self._held.clear()

    def _put(self, due: Sequence[Due]) -> int:
        if self._closed:
            return 0
        jobs: dict[str, tuple[datetime, list[str]]] = {}
        for item in due:
            job_id = item.job if item.job is not None else deliver_job_id(item)
            at, ids = jobs.setdefault(job_id, (item.at, []))
            ids.append(item.id)
            jobs[job_id] = (min(at, item.at), ids)
        new = 0
        for job_id, (at, ids) in jobs.items():
            if job_id in self._held:
                continue
            self._held.add(job_id)
            heapq.heappush(self._heap, _Job(at, next(self._seq), job_id, ids))
            new += 1
        if new:
            self._changed.set()
        return new

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            wait = self._start_due()
            timer = loop.call_later(wait, self._changed.set) if wait is not None else None
            try:
                await self._changed.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    def _start_due(self) -> float | None:
        """Start the jobs that are due, within ``concurrency``; returns the seconds until the
        next one is due (None: none is queued, or every slot is taken)."""
        now = self._clock()
        while self._heap and len(self._running) < self._concurrency:
            job = self._heap[0]
            if job.at > now:
                return (job.at - now).total_seconds()
            heapq.heappop(self._heap)
            self._running[job.job_id] = asyncio.create_task(
                self._job(job), name=f"relay-job {job.job_id}"
            )
        return None

    async def _job(self, job: _Job) -> None:
        assert self._attempt is not None
        next_due: list[Due] = []
        cut = asyncio.timeout(self._timeout)
        try:
            async with cut:
                next_due = await self._attempt(job.ids)
        except TimeoutError:
            if not cut.expired():
                log.exception("job %s failed", job.job_id)
            else:
                log.warning("job %s ran past its lease of %g s: cut", job.job_id, self._timeout)
        except Exception:
            log.exception("job %s failed", job.job_id)
        finally:
            del self._running[job.job_id]
            self._held.discard(job.job_id)
            self._changed.set()
        self._put(next_due)
