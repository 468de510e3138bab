"""The event writer: every accepted callback durably stored before it is answered, many per
commit, and the newly stored ones handed to the after-commit hook.

Requests hand their item to :class:`EventWriter` and wait. The writer's lane writes them in
groups, one transaction and one commit each (:mod:`receivers.store.coalescer`, written by
:func:`~receivers.store.batches.write_items`), and wakes every waiter once its group is
committed: durable commits stay cheap however many requests come at once. The lane
(:func:`open_lane`) is :class:`EngineLane`, in this process, or for a SQLite file the writer's
own process (:mod:`receivers.store.writer_process`, a speed trick that can be turned off).

The after-commit hook gets the new events after their callers were woken, in commit order, one
call at a time, beside the writer, as its :class:`HookTiming` says: with ``batch`` events, or
with fewer once the oldest has waited ``delay`` seconds, or, after a call that carried
``busy_events`` or more, once ``interval`` seconds have passed since that call began. Few calls
under load (each may cost its user a transaction, or a job), prompt ones otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.batches import Answer, Item, in_transaction, stored_events, write_items
from receivers.store.coalescer import Coalescer
from receivers.store.engine import sqlite_file
from receivers.store.in_commit import InCommit, InCommitWriter
from receivers.store.records import (
    AfterCommit,
    Arrival,
    Clock,
    OnStored,
    Receipt,
    Rejection,
    StoredEvent,
    StoreUnavailable,
)
from receivers.store.writable import StoreWritable
from receivers.store.writer_process import ProcessLane

log = logging.getLogger(__name__)

CALLBACKS = "callbacks"
"""What the writer's :class:`StoreWritable` calls its writes in the log."""
HOOK_BATCH = 4096
"""A hook call is made at once when this many events wait for it."""
HOOK_DELAY_SECONDS = 0.01
"""How long the oldest event waits for the hook while the writer is quiet. Measured with the
relay dispatching in process (SQLite, 100 callbacks/s, open loop): 50 ms gave a lag p50 of
49-55 ms; 10 ms, 20-35 ms; none, 66-80 ms and a p99 of 200-400 ms (a routing transaction per
commit group fights the writer for SQLite's write lock)."""
HOOK_BUSY_EVENTS = 256
HOOK_INTERVAL_SECONDS = 0.2
"""After a call of ``HOOK_BUSY_EVENTS`` or more, the next one begins no sooner than this after
it: each call is a transaction of its own, and on SQLite every one of them makes the writer wait
for the lock."""


@dataclass(frozen=True)
class HookTiming:
    """When the after-commit hook is called (see the module docstring). The defaults suit a hook
    that writes (a transaction per call)."""

    batch: int = HOOK_BATCH
    delay: float = HOOK_DELAY_SECONDS
    busy_events: int = HOOK_BUSY_EVENTS
    interval: float = HOOK_INTERVAL_SECONDS


WRITING_HOOK = HookTiming()
"""The default timing: for a hook that writes."""


class Lane(Protocol):
    """What writes the items: its futures answer a :class:`Receipt` for an event, None for a
    rejected body, or fail with :class:`StoreUnavailable`."""

    async def start(self) -> None: ...

    def submit(self, item: Item) -> asyncio.Future[Any]: ...

    @property
    def available(self) -> bool:
        """Whether items handed over now can be written."""
        ...

    async def close(self) -> None:
        """Write what was handed over, then release what the lane holds."""
        ...


class EngineLane:
    """Writes the items on the engine, in this process, in groups; tells ``writable`` how each
    group went."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock,
        on_stored: OnStored,
        writable: StoreWritable | None = None,
        in_commit: InCommitWriter | None = None,
    ) -> None:
        self._transaction = in_transaction(engine)
        self._clock = clock
        self._on_stored = on_stored
        self._writable = writable if writable is not None else StoreWritable()
        self._in_commit_writer = in_commit
        self._in_commit: InCommit | None = None
        self._group: Coalescer[Item, Receipt | None] = Coalescer(self._write)
        self._open = False

    async def start(self) -> None:
        if self._in_commit_writer is not None:
            self._in_commit = self._in_commit_writer.load()
        self._open = True

    @property
    def available(self) -> bool:
        return self._open

    def submit(self, item: Item) -> asyncio.Future[Any]:
        if not self._open:
            raise StoreUnavailable("the event writer is not running")
        return self._group.put(item)

    async def close(self) -> None:
        self._open = False
        await self._group.drain()

    async def _write(self, items: list[Item]) -> list[Answer]:
        now = self._clock()
        answers = await write_items(self._transaction, items, now, in_commit=self._in_commit)
        self._writable.wrote(answers)
        stored = stored_events(items, answers, now)
        if stored:
            self._on_stored(stored)
        return answers


def open_lane(
    engine: AsyncEngine,
    *,
    clock: Clock,
    on_stored: OnStored,
    writer_process: bool = True,
    writable: StoreWritable | None = None,
    in_commit: InCommitWriter | None = None,
) -> Lane:
    """The writer's own process for a SQLite file (on POSIX systems, where it can take a socket
    as its input) unless ``writer_process`` is off; the engine in this process otherwise."""
    database = sqlite_file(engine)
    if writer_process and database is not None and os.name == "posix":
        return ProcessLane(
            database, clock=clock, on_stored=on_stored, writable=writable, in_commit=in_commit
        )
    return EngineLane(
        engine, clock=clock, on_stored=on_stored, writable=writable, in_commit=in_commit
    )


class EventWriter:
    """The writer of one process; see the module docstring. ``writer_process``: whether a
    SQLite file gets the writer's own process (:func:`open_lane`). :attr:`writable` follows
    whether the store takes the callbacks (told how each group went). ``in_commit``: what
    else each transaction writes (:mod:`receivers.store.in_commit`)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock,
        after_commit: AfterCommit | None = None,
        hook_timing: HookTiming = WRITING_HOOK,
        writer_process: bool = True,
        in_commit: InCommitWriter | None = None,
    ) -> None:
        self._engine = engine
        self.writable = StoreWritable(CALLBACKS)
        self._writer_process = writer_process
        self._in_commit = in_commit
        self._clock = clock
        self._after_commit = after_commit
        self._timing = hook_timing
        self._lane: Lane | None = None
        self._stopping = False
        self._unhooked: list[StoredEvent] = []
        self._hooking = False
        self._hook_timer: asyncio.TimerHandle | None = None
        self._last_hook = (0.0, 0)
        """When the latest hook call began (event loop time) and how many events it carried."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open the lane (in the event loop that will use it)."""
        lane = open_lane(
            self._engine,
            clock=self._clock,
            on_stored=self._stored,
            writer_process=self._writer_process,
            writable=self.writable,
            in_commit=self._in_commit,
        )
        await lane.start()
        self._lane = lane

    async def stop(self) -> None:
        """Write what is queued, give the hook what it has not had, then close the lane."""
        lane, self._lane = self._lane, None
        if lane is None:
            return
        self._stopping = True
        await lane.close()
        self._schedule_hook()
        while self._tasks:
            await asyncio.wait(set(self._tasks))
            self._schedule_hook()

    @property
    def available(self) -> bool:
        """Whether callbacks can be stored right now (False while the writer's process of a
        SQLite store is being restarted, or before start and after stop)."""
        return self._lane is not None and self._lane.available

    def store(self, arrival: Arrival) -> Awaitable[Receipt]:
        """Store an event (or count a duplicate); the answer comes once it is committed."""
        return self._submit(arrival)

    async def quarantine(self, rejection: Rejection) -> None:
        """Keep a rejected body (deduplicated by body hash); returns once committed."""
        await self._submit(rejection)

    def _submit(self, item: Item) -> asyncio.Future[Any]:
        if self._lane is None:
            raise StoreUnavailable("the event writer is not running")
        return self._lane.submit(item)

    def _stored(self, events: list[StoredEvent]) -> None:
        """The lane committed new events: keep them for the hook."""
        if self._after_commit is not None:
            self._unhooked += events
            self._schedule_hook()

    def _schedule_hook(self) -> None:
        """Call the hook now when enough events wait for it (or the writer stops), else soon."""
        if self._hooking or not self._unhooked:
            return
        if len(self._unhooked) >= self._timing.batch or self._stopping:
            self._call_hook()
        elif self._hook_timer is None:
            loop = asyncio.get_running_loop()
            self._hook_timer = loop.call_later(self._hook_wait(loop.time()), self._call_hook)

    def _hook_wait(self, now: float) -> float:
        """Seconds until the next hook call: ``delay``, or what is left of ``interval`` since
        the latest call began if that one was a busy writer's (and longer)."""
        timing = self._timing
        began, carried = self._last_hook
        if carried < timing.busy_events:
            return timing.delay
        return max(timing.delay, began + timing.interval - now)

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
