"""Group commit for the worker's SQL: concurrent calls share one transaction.

A call is handed to its group runner at once when nothing is running; calls made meanwhile
wait and go together in the next group. Concurrent jobs of one worker so pay one transaction
(one commit, one round trip per statement) per group instead of one per call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_GROUP = 256

GroupRunner = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]
"""Runs a group: one result (or the exception of that item alone) per item, in order."""


class Coalescer(Generic[T, R]):
    """Runs submitted items in groups, one group at a time (see the module docstring)."""

    def __init__(self, run: GroupRunner[T, R], *, max_group: int = MAX_GROUP) -> None:
        self._run = run
        self._max_group = max_group
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._running: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """Run ``item`` in the next group; returns its result or raises its exception."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        self._pump()
        return await future

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

    def _pump(self) -> None:
        if self._running is not None or not self._queue:
            return
        count = min(len(self._queue), self._max_group)
        group = [self._queue.popleft() for _ in range(count)]
        self._running = asyncio.create_task(self._run_group(group))

    async def _run_group(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in group])
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
            self._running = None
            self._pump()
