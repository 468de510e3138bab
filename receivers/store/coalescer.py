"""Group commit: concurrent calls share one transaction.

The one batching abstraction of the project. The receivers' event writer (in this process or in
its own: :mod:`receivers.store.writer_process`) and the relay's deliverer both hand their writes
to a :class:`Coalescer`: a call is run at once when nothing is running, and calls made meanwhile
wait and go together in the next group. So concurrent callers pay one transaction (one commit,
one round trip per statement) per group instead of one each.

How many waiting calls the next group takes is a :class:`GroupSize`: a fixed cap, or
:class:`AdaptiveGroupSize` for a writer whose commit cost varies (see there)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_GROUP = 256
"""The default cap of a group: what one multi-row statement comfortably takes."""

GroupRunner = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]
"""Runs a group: one result (or the exception of that item alone) per item, in order."""


class GroupSize(Protocol):
    """Decides the size of each group."""

    def take(self, waiting: int, *, idle: bool) -> int:
        """How many of the ``waiting`` calls the next group takes; ``idle``: the runner found
        nothing waiting when its last group ended (it keeps up)."""
        ...

    def ran(self, count: int, seconds: float) -> None:
        """A group of ``count`` calls took ``seconds``."""
        ...


class FixedGroupSize:
    """At most ``cap`` calls per group."""

    def __init__(self, cap: int = MAX_GROUP) -> None:
        self.cap = cap

    def take(self, waiting: int, *, idle: bool) -> int:
        return min(waiting, self.cap)

    def ran(self, count: int, seconds: float) -> None:
        return None


class AdaptiveGroupSize:
    """A cap that follows what a call costs in its group.

    While one long group is written, every caller in it waits, and a server whose callers all
    wait has nothing to do: smaller groups let it answer the first callers while the next group
    is written (``scripts/bench_ingest.py``, SQLite, 64 connections: at most 16 gave 6-10 % more
    events/s than taking everything). A slow disk wants the opposite: when each commit waits
    milliseconds, only large groups keep up. So the cap starts at ``smallest``; a full group
    whose calls took more than ``slow_call_seconds`` each doubles it, up to ``largest``; a full
    group under half that, or a runner that finds nothing waiting, halves it again.

    To turn it off, give the coalescer a :class:`FixedGroupSize`."""

    def __init__(
        self, smallest: int = 16, largest: int = MAX_GROUP, slow_call_seconds: float = 100e-6
    ) -> None:
        if not 1 <= smallest <= largest:
            raise ValueError("need 1 <= smallest <= largest")
        self.smallest = smallest
        self.largest = largest
        self.slow_call_seconds = slow_call_seconds
        self.cap = smallest

    def take(self, waiting: int, *, idle: bool) -> int:
        if idle:
            self._shrink()
        return min(waiting, self.cap)

    def ran(self, count: int, seconds: float) -> None:
        if count < self.cap:
            return  # not full: the cap did not decide its size
        per_call = seconds / count
        if per_call > self.slow_call_seconds:
            self.cap = min(self.cap * 2, self.largest)
        elif per_call < self.slow_call_seconds / 2:
            self._shrink()

    def _shrink(self) -> None:
        self.cap = max(self.cap // 2, self.smallest)


class Coalescer(Generic[T, R]):
    """Runs submitted items in groups, one group at a time (see the module docstring)."""

    def __init__(
        self,
        run: GroupRunner[T, R],
        *,
        size: GroupSize | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._run = run
        self._size = size or FixedGroupSize()
        self._clock = clock
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._running: asyncio.Task[None] | None = None
        self._idle = True

    def put(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` for the next group; the future gets its result or exception."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        self._pump()
        return future

    async def submit(self, item: T) -> R:
        """Run ``item`` in the next group; returns its result or raises its exception."""
        return await self.put(item)

    async def submit_many(self, items: Sequence[T]) -> list[R | BaseException]:
        """Run ``items`` together (in the next group, or the next few when they are many);
        returns each one's result or exception, in order."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = []
        for item in items:
            futures.append(loop.create_future())
            self._queue.append((item, futures[-1]))
        self._pump()
        return list(await asyncio.gather(*futures, return_exceptions=True))

    @property
    def busy(self) -> bool:
        """Whether a group runs or calls wait."""
        return self._running is not None or bool(self._queue)

    async def drain(self) -> None:
        """Return once every call queued so far has run."""
        while self._running is not None and not self._running.done():
            await asyncio.wait([self._running])

    def _pump(self) -> None:
        if self._queue and (self._running is None or self._running.done()):
            self._running = asyncio.create_task(self._run_group())

    async def _run_group(self) -> None:
        """Run the next group: the calls queued by the time it starts (those made in the same
        pass of the event loop as the first go with it), as many as the group size allows.
        Every caller of the group gets an answer, whatever happens."""
        group: list[tuple[T, asyncio.Future[R]]] = []
        started = self._clock()
        try:
            count = self._size.take(len(self._queue), idle=self._idle)
            group = [self._queue.popleft() for _ in range(min(max(count, 1), len(self._queue)))]
            results = await self._run([item for item, _ in group])
            if len(results) != len(group):
                raise RuntimeError(f"{len(results)} results for a group of {len(group)}")
        except BaseException as exc:  # the whole group failed: every caller sees why
            for _, future in group:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), result in zip(group, results, strict=True):
                if future.done():
                    continue  # its caller was cancelled
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        finally:
            self._size.ran(len(group), self._clock() - started)
            self._running = None
            self._idle = not self._queue
            self._pump()
