"""The sweeper: reconciles the SQL store (the truth) with the dispatcher (:mod:`relay.dispatch`).

It routes events whose after-commit hook never ran (a killed process) and re-enqueues due
deliveries whose job is gone (Redis flushed, a restarted process); a delivery whose job is
still queued or running is left alone, so a backlog costs one Redis round trip per page (none
in process), not one enqueue per delivery.
Both steps are idempotent, so several sweepers (one per worker) may run at once.

It waits while the queue's Redis is lost and sweeps as soon as it is back: what Redis lost (a
restart without persistence, jobs whose enqueue failed meanwhile) is re-enqueued then. A sweep
that the store refuses is logged once per outage (:class:`~receivers.store.StoreWritable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import StoreWritable, WriteProbe
from relay import outbox
from relay.dispatch import Dispatcher
from relay.dispatch.queue_connection import QueueUnavailable
from relay.observe.metrics import WorkerMetrics
from relay.observe.trouble import Trouble
from relay.outbox import Due
from relay.outbox.router import Router

log = logging.getLogger("relay.sweeper")  # stable: users filter on it

ROUTE_GRACE = timedelta(seconds=2)
SCAN_OVERLAP = timedelta(minutes=10)  # far more than any commit takes after its received_at
BATCH = 1000


@dataclass(frozen=True)
class SweepReport:
    """What one sweep did."""

    routed_events: int
    enqueued_jobs: int


class Sweeper:
    """Runs :meth:`sweep` at start-up, then every ``interval`` and whenever the queue is back
    after an outage; each run is counted in ``metrics`` (a private registry by default). A sweep
    that fails because the store refuses writes is noted in ``writable`` (logged once, not per
    sweep) and done again next time; while the store refuses the relay's writes, each sweep
    tries the probe first (an idle relay has nothing else to find out with that the store takes
    them again)."""

    def __init__(
        self,
        engine: AsyncEngine,
        router: Router,
        queue: Dispatcher,
        *,
        clock: Callable[[], datetime],
        interval: timedelta,
        metrics: WorkerMetrics | None = None,
        writable: StoreWritable | None = None,
    ) -> None:
        self._engine = engine
        self._writable = writable if writable is not None else StoreWritable(outbox.RELAY_WRITES)
        self._probe = WriteProbe(engine, self._writable, clock)
        self._router = router
        self._queue = queue
        self._clock = clock
        self._interval = interval
        self._scan_from: datetime | None = None  # None: scan every stored event (first sweep)
        self._metrics = metrics if metrics is not None else WorkerMetrics()
        self._queue_back = asyncio.Event()
        self._trouble = Trouble(log, "sweep")

    async def sweep(self) -> SweepReport:
        """One pass: route what was not routed, then enqueue what is due and has no job.

        The first pass looks at every stored event; later ones only at events received since the
        previous pass (less a generous overlap), so a sweep does not grow with the history."""
        try:
            report = await self._sweep()
        except Exception:
            self._metrics.sweeps_failed.inc()
            raise
        self._metrics.sweeps_ok.inc()
        return report

    async def _sweep(self) -> SweepReport:
        routed = enqueued = 0
        while True:
            now = self._clock()
            before = now - ROUTE_GRACE
            events = await outbox.unrouted_events(self._engine, before, BATCH, self._scan_from)
            if not events:
                self._scan_from = before - SCAN_OVERLAP  # everything older is routed
                break
            due = await outbox.route_events(self._engine, self._router, events, now)
            self._writable.succeeded()
            enqueued += await self._enqueue(due)
            routed += len(events)
        now, last = self._clock(), None
        while True:
            due = await outbox.due_deliveries(self._engine, now, BATCH, after=last)
            enqueued += await self._enqueue(await self._queue.without_jobs(due))
            if len(due) < BATCH:
                break
            last = due[-1]
        if routed or enqueued:
            log.info("sweeper routed %d events and enqueued %d jobs", routed, enqueued)
        return SweepReport(routed, enqueued)

    async def _enqueue(self, due: list[Due]) -> int:
        """Enqueue; a queue lost meanwhile ends the sweep (the next one runs once it is back)."""
        enqueued = await self._queue.enqueue(due)
        if not self._queue.connection.connected:
            raise QueueUnavailable(f"queue lost: {self._queue.connection.reason}")
        return enqueued

    async def run(self) -> None:
        """Sweep forever (cancel to stop): at once, then every ``interval``, and at once when
        the queue is back after an outage (it waits meanwhile). A sweep that fails is tried
        again at the next of those: the store's refusals are logged once each (``writable``),
        another error once with its traceback, until a sweep works again."""
        connection = self._queue.connection
        connection.on_back(self._queue_back.set)
        while True:
            await connection.until_connected()
            self._queue_back.clear()
            if self._writable.refusal is not None:
                with contextlib.suppress(Exception):  # the probe notes its outcome
                    await self._probe()
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except QueueUnavailable:
                pass  # the queue's connection said so: the sweep is run again once it is back
            except Exception as exc:
                if not self._writable.failed(exc):
                    self._trouble.failed(exc)
            else:
                self._trouble.worked()
            if not connection.connected:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue_back.wait(), self._interval.total_seconds())
