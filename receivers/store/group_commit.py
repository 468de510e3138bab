"""Group commit in this process: concurrent requests share one transaction of a batch store.

The lane of every database but a SQLite file (which has a process of its own:
:mod:`receivers.store.process_lane`). Items wait in a queue; a batch is handed to the store as soon
as the store has room for it (an item arriving while nothing is being written goes at once), but
it takes its items from the queue only when the store starts writing it, so that a batch waiting
behind another takes everything that arrived meanwhile. Every caller is woken once its batch is
committed."""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
from collections import deque
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from receivers.store.batch_stores import BatchStore
from receivers.store.records import (
    Arrival,
    Clock,
    Identity,
    OnStored,
    Receipt,
    StoredEvent,
    StoreUnavailable,
)
from receivers.store.rows import BatchRows, Item, batch_rows, receipts

log = logging.getLogger(__name__)

MAX_BATCH = 256


@dataclass(slots=True)
class _Pending:
    item: Item
    future: asyncio.Future[Any]


@dataclass
class _Batch:
    """A batch handed to the store: who waits for it and its rows, both filled in when the store
    starts writing it (:meth:`GroupCommit._fill`)."""

    items: list[_Pending] = field(default_factory=list)
    rows: BatchRows | None = None
    now: datetime | None = None
    taken: bool = False
    """Whether it has taken its items (set where it is built)."""


class GroupCommit:
    """Batches items into ``store``; see the module docstring. ``on_stored`` gets the newly
    stored events of each batch."""

    def __init__(
        self,
        store: BatchStore,
        *,
        clock: Clock,
        on_stored: OnStored,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_stored = on_stored
        self._max_batch = max_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[_Pending] = deque()
        self._writing = 0
        self._latest: _Batch | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    @property
    def available(self) -> bool:
        """Whether items are taken (the engine's own availability shows only when writing)."""
        return self._loop is not None and not self._closing

    def submit(self, item: Item) -> asyncio.Future[Any]:
        """Queue ``item``; the future gets its :class:`Receipt` (None for a rejected body)."""
        if self._loop is None or self._closing:
            raise StoreUnavailable("the event writer is not running")
        future = self._loop.create_future()  # asyncio.get_running_loop() costs a getpid()
        self._queue.append(_Pending(item, future))
        self._pump()
        return future

    async def close(self) -> None:
        """Write what is queued, then close the store."""
        self._closing = True
        self._pump()
        while self._tasks:
            await asyncio.wait(set(self._tasks))
            self._pump()
        await self._store.close()

    def _pump(self) -> None:
        """Hand the store a batch while it has room and items are queued, one batch at a time
        that has not yet taken its items (it will take every item queued by then)."""
        store = self._store
        while (
            self._queue
            and self._writing < store.slots
            and (self._latest is None or self._latest.taken)
        ):
            batch = self._latest = _Batch()
            self._writing += 1
            written = store.write(functools.partial(self._fill, batch, None))
            self._spawn(self._finish(batch, written))

    def _fill(self, batch: _Batch, items: list[_Pending] | None) -> BatchRows:
        """Give ``batch`` its items (see :meth:`_take`) and build its rows. Runs where the store
        starts the write."""
        self._take(batch, items)  # first: should building fail, the callers still get an answer
        batch.now = self._clock()
        batch.rows = batch_rows([pending.item for pending in batch.items], batch.now)
        return batch.rows

    def _take(self, batch: _Batch, items: list[_Pending] | None = None) -> None:
        """Give ``batch`` its items: the given ones, else the queue's first ``max_batch``."""
        if items is None:
            items = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
        batch.items = items
        batch.taken = True

    async def _finish(self, batch: _Batch, written: Awaitable[dict[Identity, str]]) -> None:
        """Wait for a batch, wake its callers, report its new events."""
        try:
            stored = await self._settle(batch, written)
        finally:
            self._writing -= 1
            self._pump()
        if stored:
            self._on_stored(stored)

    async def _settle(
        self, batch: _Batch, written: Awaitable[dict[Identity, str]]
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
                    written = self._store.write(functools.partial(self._fill, alone, [pending]))
                    stored += await self._settle(alone, written)
                return stored
            log.error("store unavailable: %s", type(exc).__name__, exc_info=exc)
            for pending in batch.items:
                if not pending.future.done():
                    pending.future.set_exception(StoreUnavailable(str(type(exc).__name__)))
            return []
        assert batch.rows is not None and batch.now is not None
        stored = []
        answers = receipts(batch.rows, ids, len(batch.items))
        for pending, answer in zip(batch.items, answers, strict=True):
            if answer is not None and not answer[1]:
                item = pending.item
                assert isinstance(item, Arrival)
                stored.append(
                    StoredEvent(answer[0], item.source, item.kind, batch.now, item.payload)
                )
            if not pending.future.done():
                pending.future.set_result(None if answer is None else Receipt(*answer))
        return stored

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


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
