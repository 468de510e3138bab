"""Group commit: concurrent requests share one transaction, so durable commits stay cheap.

Requests hand their event to :class:`EventWriter` and wait. Events are written in batches, one
transaction and one commit each, and every waiter is woken once its batch is committed. A batch
is handed to the store as soon as the store has room for it (an event arriving while nothing is
being written goes at once), but it takes its events from the queue only when the store starts
writing it: on SQLite the next batch waits behind the one being written and then takes everything
that arrived meanwhile. (Taken at hand-off, that next batch often held only the one or two
events that came first, and cost a commit of its own.) A duplicate (same source, kind and dedup
key) is never inserted twice, also when copies arrive in the same batch or in another process:
the unique constraint decides and the loser is counted on the stored row.

How a batch reaches the database depends on the backend (see
:func:`~receivers.store.batch_stores.batch_store`):

* a SQLite file: ``SqliteLane``, the writer's own connection in a thread of its own. A batch
  is one hand-off to that thread and one multi-row statement, and the next batch may queue
  behind it, so the event loop never waits for the disk;
* any other database: ``SqlAlchemyStore``, one transaction per batch on the engine, with
  statements built once (so SQLAlchemy compiles each of them once, not once per batch).

The after-commit hook gets the new events after their callers were woken, in commit order, one
call at a time, beside the writer: with ``hook_batch`` events, or with fewer once the oldest has
waited ``hook_delay`` seconds, or, after a call that carried ``hook_busy_events`` or more, once
``hook_interval`` seconds have passed since that call began. Few calls under load (on SQLite each
is a write transaction of its own, competing for the one write lock), prompt ones otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import new_ids
from receivers.store.batch_stores import BatchRows, BatchStore, batch_store
from receivers.store.records import (
    AfterCommit,
    Arrival,
    Identity,
    Receipt,
    Rejection,
    Row,
    StoredEvent,
    StoreUnavailable,
    body_hash,
)

log = logging.getLogger(__name__)

MAX_BATCH = 256
HOOK_BATCH = 4096
"""A hook call is made at once when this many events wait for it."""
HOOK_DELAY_SECONDS = 0.05
"""How long the oldest event waits for the hook while the writer is quiet."""
HOOK_BUSY_EVENTS = 256
HOOK_INTERVAL_SECONDS = 0.2
"""After a call of ``HOOK_BUSY_EVENTS`` or more, the next one begins no sooner than this after
it: each call is a transaction of its own, and on SQLite every one of them makes the writer wait
for the lock (calls every 0.2 s instead of every 0.05 s: 2-3 % more events/s, measured with
scripts/bench_ingest.py)."""
CONTENT_TYPE_LENGTH = 255
"""The longest Content-Type kept (the column's width; a longer header is cut)."""
REMOTE_ADDR_LENGTH = 64
"""The longest caller address kept (an IPv6 address with a long zone id is cut)."""
PATH_LENGTH = 255
"""The longest request path kept with a quarantined body."""
REASON_LENGTH = 1000
"""The longest refusal reason kept with a quarantined body (it may name many fields)."""

Clock = Callable[[], datetime]


@dataclass(slots=True)
class _Pending:
    item: Arrival | Rejection
    future: asyncio.Future[Any]


@dataclass
class _Batch:
    """A batch handed to the store: who waits for it and its event rows, both filled in when the
    store starts writing it (:meth:`EventWriter._fill`)."""

    items: list[_Pending] = field(default_factory=list)
    copies: dict[Identity, list[_Pending]] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    taken: bool = False
    """Whether it has taken its items (set where it is built)."""


class EventWriter:
    """The writer of one process; see the module docstring. ``open_store`` picks what writes
    the batches (:func:`~receivers.store.batch_stores.batch_store` by default)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock,
        after_commit: AfterCommit | None = None,
        max_batch: int = MAX_BATCH,
        hook_batch: int = HOOK_BATCH,
        hook_delay: float = HOOK_DELAY_SECONDS,
        hook_busy_events: int = HOOK_BUSY_EVENTS,
        hook_interval: float = HOOK_INTERVAL_SECONDS,
        open_store: Callable[[AsyncEngine], BatchStore] = batch_store,
    ) -> None:
        self._engine = engine
        self._open_store = open_store
        self._clock = clock
        self._after_commit = after_commit
        self._max_batch = max_batch
        self._hook_batch = hook_batch
        self._hook_delay = hook_delay
        self._hook_busy_events = hook_busy_events
        self._hook_interval = hook_interval
        self._store: BatchStore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[_Pending] = deque()
        self._writing = 0
        self._latest: _Batch | None = None
        self._unhooked: list[StoredEvent] = []
        self._hooking = False
        self._hook_timer: asyncio.TimerHandle | None = None
        self._last_hook = (0.0, 0)
        """When the latest hook call began (event loop time) and how many events it carried."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open the store (in the event loop that will use it)."""
        self._loop = asyncio.get_running_loop()
        self._store = self._open_store(self._engine)

    async def stop(self) -> None:
        """Write what is queued, give the hook what it has not had, then close the store."""
        store, self._store = self._store, None
        if store is None:
            return
        self._pump(store)
        self._schedule_hook()
        while self._tasks:
            await asyncio.wait(set(self._tasks))
            self._pump(store)
            self._schedule_hook()
        await store.close()

    def store(self, arrival: Arrival) -> Awaitable[Receipt]:
        """Store an event (or count a duplicate); the answer comes once it is committed."""
        return self._submit(arrival)

    async def quarantine(self, rejection: Rejection) -> None:
        """Keep a rejected body (deduplicated by body hash); returns once committed."""
        await self._submit(rejection)

    def _submit(self, item: Arrival | Rejection) -> asyncio.Future[Any]:
        if self._store is None or self._loop is None:
            raise StoreUnavailable("the event writer is not running")
        future = self._loop.create_future()  # asyncio.get_running_loop() costs a getpid()
        self._queue.append(_Pending(item, future))
        self._pump(self._store)
        return future

    def _pump(self, store: BatchStore) -> None:
        """Hand the store a batch while it has room and events are queued, one batch at a time
        that has not yet taken its events (it will take every event queued by then)."""
        while (
            self._queue
            and self._writing < store.slots
            and (self._latest is None or self._latest.taken)
        ):
            batch = self._latest = _Batch()
            self._writing += 1
            written = store.write(functools.partial(self._fill, batch, None))
            self._spawn(self._finish(store, batch, written))

    def _fill(self, batch: _Batch, items: list[_Pending] | None) -> BatchRows:
        """Give ``batch`` its items (see :meth:`_take`) and build its rows. Runs where the store
        starts the write (on SQLite, in the lane's thread)."""
        self._take(batch, items)  # first: should building fail, the callers still get an answer
        now = self._clock()
        rejected: dict[str, tuple[Rejection, int]] = {}
        for pending in batch.items:
            item = pending.item
            if isinstance(item, Arrival):
                batch.copies.setdefault(item.identity, []).append(pending)
            else:
                digest = body_hash(item.raw_body)
                seen = rejected.get(digest)
                rejected[digest] = (seen[0], seen[1] + 1) if seen else (item, 1)
        copies, ids = batch.copies, new_ids(now, len(batch.copies) + len(rejected))
        batch.rows = [
            _event_row(same, i, now) for same, i in zip(copies.values(), ids, strict=False)
        ]
        quarantine = [
            _rejection_row(item, d, n, i, now)
            for (d, (item, n)), i in zip(rejected.items(), ids[len(copies) :], strict=True)
        ]
        return batch.rows, quarantine

    def _take(self, batch: _Batch, items: list[_Pending] | None = None) -> None:
        """Give ``batch`` its items: the given ones, else the queue's first ``max_batch``."""
        if items is None:
            items = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
        batch.items = items
        batch.taken = True

    async def _finish(
        self, store: BatchStore, batch: _Batch, written: Awaitable[dict[Identity, str]]
    ) -> None:
        """Wait for a batch, wake its callers, keep its new events for the hook."""
        try:
            stored = await self._settle(store, batch, written)
        finally:
            self._writing -= 1
            self._pump(store)
        if stored and self._after_commit is not None:
            self._unhooked += stored
            self._schedule_hook()

    async def _settle(
        self, store: BatchStore, batch: _Batch, written: Awaitable[dict[Identity, str]]
    ) -> list[StoredEvent]:
        """Settle a batch's futures; returns its newly stored events."""
        try:
            ids = await written
        except Exception as exc:
            if not batch.taken:  # the store failed before building it: its callers fail too
                self._take(batch)
            if len(batch.items) > 1 and not _is_connection_error(exc):
                log.warning(
                    "batch write failed (%s); writing its items one by one", type(exc).__name__
                )
                stored: list[StoredEvent] = []
                for pending in batch.items:
                    alone = _Batch()
                    written = store.write(functools.partial(self._fill, alone, [pending]))
                    stored += await self._settle(store, alone, written)
                return stored
            log.error("store unavailable: %s", type(exc).__name__, exc_info=exc)
            for pending in batch.items:
                if not pending.future.done():
                    pending.future.set_exception(StoreUnavailable(str(type(exc).__name__)))
            return []
        stored = []
        for row, (identity, same) in zip(batch.rows, batch.copies.items(), strict=True):
            event_id = ids[identity]
            new = event_id == row["id"]
            if new:
                source, kind, _ = identity
                received_at = row["received_at"]
                stored.append(StoredEvent(event_id, source, kind, received_at, row["payload"]))
            for index, pending in enumerate(same):
                if not pending.future.done():
                    pending.future.set_result(Receipt(event_id, duplicate=index > 0 or not new))
        for pending in batch.items:
            if not pending.future.done():
                pending.future.set_result(None)  # quarantined
        return stored

    def _schedule_hook(self) -> None:
        """Call the hook now when enough events wait for it (or the writer stops), else soon."""
        if self._hooking or not self._unhooked:
            return
        if len(self._unhooked) >= self._hook_batch or self._store is None:
            self._call_hook()
        elif self._hook_timer is None:
            loop = asyncio.get_running_loop()
            self._hook_timer = loop.call_later(self._hook_wait(loop.time()), self._call_hook)

    def _hook_wait(self, now: float) -> float:
        """Seconds until the next hook call: ``hook_delay``, or what is left of ``hook_interval``
        since the latest call began if that one was a busy writer's (and longer)."""
        began, carried = self._last_hook
        if carried < self._hook_busy_events:
            return self._hook_delay
        return max(self._hook_delay, began + self._hook_interval - now)

    def _call_hook(self) -> None:
        if self._hook_timer is not None:
            self._hook_timer.cancel()
            self._hook_timer = None
        if self._hooking or not self._unhooked:
            return
        self._hooking = True
        events, self._unhooked = self._unhooked, []
        self._last_hook = (asyncio.get_running_loop().time(), len(events))
        self._spawn(self._run_hook(events))

    async def _run_hook(self, events: list[StoredEvent]) -> None:
        assert self._after_commit is not None
        try:
            await self._after_commit(events)
        except Exception:
            log.exception("after-commit hook failed; the events are stored and will be swept")
        finally:
            self._hooking = False
            self._schedule_hook()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _event_row(copies: list[_Pending], event_id: str, now: datetime) -> Row:
    """The row of an event that arrived ``len(copies)`` times in one batch."""
    first = copies[0].item
    assert isinstance(first, Arrival)
    return {
        "id": event_id,
        "source": first.source,
        "kind": first.kind,
        "dedup_key": first.dedup_key,
        "received_at": now,
        "payload": first.payload,
        "raw_body": first.raw_body,
        "content_type": _clip(first.content_type, CONTENT_TYPE_LENGTH),
        "method": first.method,
        "remote_addr": _clip(first.remote_addr, REMOTE_ADDR_LENGTH),
        "duplicates": len(copies) - 1,
    }


def _rejection_row(item: Rejection, digest: str, count: int, row_id: str, now: datetime) -> Row:
    """The quarantine row of a body that was rejected ``count`` times in one batch."""
    return {
        "id": row_id,
        "source": item.source,
        "path": item.path[:PATH_LENGTH],
        "kind": item.kind,
        "status": item.status,
        "reason": item.reason[:REASON_LENGTH],
        "errors": item.errors,
        "body_hash": digest,
        "raw_body": item.raw_body,
        "content_type": _clip(item.content_type, CONTENT_TYPE_LENGTH),
        "remote_addr": _clip(item.remote_addr, REMOTE_ADDR_LENGTH),
        "received_at": now,
        "last_seen_at": now,
        "count": count,
    }


def _clip(text: str | None, length: int) -> str | None:
    """``text`` cut to a column's width (PostgreSQL refuses longer text; SQLite would keep it)."""
    return text[:length] if text is not None else None


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(
        exc,
        OperationalError
        | InterfaceError
        | sqlite3.OperationalError
        | OSError
        | ConnectionError
        | TimeoutError,
    ):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated
