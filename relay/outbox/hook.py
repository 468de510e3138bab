"""The receivers' after-commit hook: the fast path from a committed event to its deliveries."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import StoredEvent
from receivers.store import StoreWritable
from relay import outbox
from relay.dispatch import Dispatcher
from relay.observe.trouble import Trouble
from relay.outbox import Due, EventRef
from relay.outbox.in_commit import first_jobs
from relay.outbox.router import Router

log = logging.getLogger(__name__)


class RoutingHook:
    """The receivers' after-commit hook: enqueue the first jobs of the deliveries the writer
    routed with the events (:mod:`relay.outbox.in_commit`); route those it stored without.

    If it fails (or the process dies first), the sweeper enqueues those deliveries, and routes
    the events left unrouted: the hook is the fast path, never the only one. So an outage is no
    error here:
    while the queue's Redis is lost the deliveries are only routed (the sweepers enqueue them
    once it is back), and while the store refuses writes (full, unreachable) the events stay
    unrouted; ``writable`` (the process's state of the relay's writes) and the queue's
    connection log each outage once, not per call."""

    def __init__(
        self,
        engine: AsyncEngine,
        router: Router,
        clock: Callable[[], datetime],
        writable: StoreWritable | None = None,
    ) -> None:
        self._engine = engine
        self._router = router
        self._clock = clock
        self._writable = writable if writable is not None else StoreWritable(outbox.RELAY_WRITES)
        self._trouble = Trouble(log, "routing events after their commit")
        self.queue: Dispatcher | None = None
        """Attached once the dispatcher runs (in the app's lifespan)."""

    async def __call__(self, events: Sequence[StoredEvent]) -> None:
        due = first_jobs(events)
        unrouted = [e for e in events if e.written_with is None]
        if unrouted:
            due += await self._route(unrouted)
        else:  # routed in their commit: routing works
            self._trouble.worked()
        if self.queue is not None and due:
            await self.queue.enqueue(due)

    async def _route(self, events: Sequence[StoredEvent]) -> list[Due]:
        refs = [EventRef(e.id, e.source, e.kind, e.payload, e.received_at) for e in events]
        try:
            due = await outbox.route_events(self._engine, self._router, refs, self._clock())
        except Exception as exc:
            if not self._writable.failed(exc):
                self._trouble.failed(exc)
            return []  # the sweeper routes them, once the store takes writes or routing works
        self._writable.succeeded()
        self._trouble.worked()
        return due
