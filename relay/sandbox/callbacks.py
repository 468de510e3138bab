"""The callback scheduler: sends each callback at its time on the sandbox's clock, retries it
on the platform's documented schedule (the relay's own policies and breaker, not copies) and
records every attempt with the receiver's answer and duration.

Time: one timeline (a heap of due actions) is walked in time order. Sends run as tasks, so a
slow receiver holds up nobody else; under a :class:`~relay.simulator.clocks.VirtualClock` time
only jumps forward once nothing is in flight, so a virtual run is the same as a real one, only
instant. One subject's callbacks (a message's delivery reports) go one after the other: the next
is sent once the previous is accepted or given up, so they arrive in order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from urllib.parse import urlsplit

import httpx

from relay.delivery.breaker import DestinationHealth, after_failure, after_success, hold_until
from relay.delivery.policies import BUILTIN_POLICIES, Policy
from relay.destinations.errors import describe_error
from relay.sandbox.state import ANSWER_EXCERPT, Callback, CallbackAttempt, State
from relay.simulator.clocks import Clock, VirtualClock
from relay.simulator.wire import query_fields

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_IN_FLIGHT = 100
"""Callbacks sent at once per sandbox (the size of its HTTP client's connection pool): the
others wait in the scheduler's own queue, not in the client's pool, and their answer timeout
starts only once they are sent."""
USER_AGENT = "callback-relay-sandbox"
Action = Callable[[], Awaitable[None]]
log = logging.getLogger(__name__)


class Scheduler:
    """Sends one sandbox's callbacks; :meth:`run` is its loop (a task of the app's lifespan)."""

    def __init__(
        self,
        state: State,
        clock: Clock,
        client: httpx.AsyncClient,
        *,
        policies: Mapping[str, Policy] = BUILTIN_POLICIES,
        max_in_flight: int = MAX_IN_FLIGHT,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.state = state
        self.clock = clock
        self.client = client
        self.policies = policies
        self._heap: list[tuple[datetime, int, Action]] = []
        self._order = itertools.count()
        self._pushed = asyncio.Event()
        self._activity = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._waiting: dict[str, list[Callback]] = {}
        """Per subject: callbacks waiting for the one in progress to finish."""
        self._busy: set[str] = set()
        self._health: dict[str, DestinationHealth] = {}
        self._sending = asyncio.Semaphore(max_in_flight)
        """Bounds the sends in flight (:data:`MAX_IN_FLIGHT`); keep it <= the client's pool."""
        self.timeout = timeout
        """Seconds a receiver has to answer when its policy sets no budget."""

    # --- the timeline ------------------------------------------------------------------------

    def at(self, when: datetime, action: Action) -> None:
        """Run ``action`` (a coroutine function) once the clock reaches ``when``."""
        heapq.heappush(self._heap, (when, next(self._order), action))
        self._signal("_pushed")

    def _signal(self, name: str) -> None:
        event: asyncio.Event = getattr(self, name)
        event.set()
        setattr(self, name, asyncio.Event())

    async def run(self) -> None:
        """Walk the timeline for ever (cancel the task to stop)."""
        while True:
            pushed = self._pushed
            if not self._heap:
                await pushed.wait()
                continue
            when = self._heap[0][0]
            if when > self.clock.now():
                if isinstance(self.clock, VirtualClock) and self._inflight:
                    await self._activity.wait()  # a send may schedule something sooner
                    continue
                await _first(self.clock.sleep_until(when), pushed.wait())
                continue
            _, _, action = heapq.heappop(self._heap)
            task = asyncio.create_task(action())
            self._inflight.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a sandbox callback action failed", exc_info=task.exception())
        self._signal("_activity")

    async def idle(self) -> None:
        """Return once nothing is in flight and nothing is due now (under a virtual clock:
        nothing is left at all). For tests and the control API."""
        while True:
            activity, pushed = self._activity, self._pushed
            due = self._heap and (
                isinstance(self.clock, VirtualClock) or self._heap[0][0] <= self.clock.now()
            )
            if not self._inflight and not due:
                return
            await _first(activity.wait(), pushed.wait())

    def reset(self) -> None:
        """Drop every pending callback and attempt (the records go with ``State.clear``)."""
        self._heap.clear()
        for task in self._inflight:
            task.cancel()
        self._waiting.clear()
        self._busy.clear()
        self._health.clear()

    # --- callbacks ---------------------------------------------------------------------------

    def schedule(self, callback: Callback) -> Callback:
        """Record ``callback`` and send it at ``due_at``, after its subject's earlier ones."""
        if callback.policy not in self.policies:
            raise ValueError(f"unknown policy {callback.policy!r}")
        self.state.callbacks[callback.id] = callback
        if callback.subject in self._busy:
            self._waiting.setdefault(callback.subject, []).append(callback)
        else:
            self._busy.add(callback.subject)
            self._start(callback)
        self.state.changed()
        return callback

    def _start(self, callback: Callback) -> None:
        when = max(callback.due_at, self.clock.now())
        self.at(when, lambda: self._attempt(callback, when, None))

    def _finish(self, callback: Callback, state: str) -> None:
        callback.state = state
        callback.next_attempt_at = None
        queue = self._waiting.get(callback.subject)
        if queue:
            self._start(queue.pop(0))
        else:
            self._waiting.pop(callback.subject, None)
            self._busy.discard(callback.subject)
        self.state.changed()

    def resend(self, callback: Callback) -> None:
        """Send ``callback`` once more, now, outside its schedule (recorded as resent)."""

        async def once() -> None:
            attempt = await self._send(callback, self.clock.now(), resent=True)
            callback.attempts.append(attempt)
            self.state.changed()

        self.at(self.clock.now(), once)

    async def _attempt(
        self, callback: Callback, scheduled: datetime, first: datetime | None
    ) -> None:
        if self.state.callbacks.get(callback.id) is not callback:
            return  # reset meanwhile
        policy = self.policies[callback.policy]
        origin = _origin(callback.url)
        now = self.clock.now()
        held = hold_until(self._health.get(origin, DestinationHealth()), now)
        if held is not None:
            deadline = policy.deadline(first) if first else None
            if deadline is not None and held > deadline:
                self._finish(callback, "given-up")
                return
            callback.next_attempt_at = held  # the breaker: waiting, not failing
            self.at(held, lambda: self._attempt(callback, held, first))
            return
        callback.state = "sending"
        attempt = await self._send(callback, scheduled)
        callback.attempts.append(attempt)
        first = first or attempt.sent_at
        health = self._health.get(origin, DestinationHealth())
        if policy.accepts(attempt.status_code, attempt.duration_ms):
            self._health[origin] = after_success(health)
            if callback.duplicate:
                callback.attempts.append(
                    await self._send(callback, self.clock.now(), duplicate=True)
                )
            self._finish(callback, "delivered")
            return
        now = self.clock.now()
        self._health[origin] = after_failure(health, policy, now)
        number = sum(1 for a in callback.attempts if not (a.duplicate or a.resent))
        next_at = policy.next_attempt(number, first, now)
        if next_at is None:
            self._finish(callback, "given-up")
            return
        callback.state = "scheduled"
        callback.next_attempt_at = next_at
        self.state.changed()
        self.at(next_at, lambda: self._attempt(callback, next_at, first))

    async def _send(
        self,
        callback: Callback,
        scheduled: datetime,
        *,
        duplicate: bool = False,
        resent: bool = False,
    ) -> CallbackAttempt:
        policy = self.policies[callback.policy]
        seconds = (
            policy.answer_budget.total_seconds() if policy.answer_budget else None
        ) or self.timeout
        # the pool never makes a send wait: the semaphore keeps the sends under its size
        timeout = httpx.Timeout(seconds, pool=None)
        headers = {"user-agent": USER_AGENT}
        content: bytes | None = None
        status: int | None = None
        error: str | None = None
        answer = b""
        async with self._sending:
            sent = self.clock.now()
            started = time.perf_counter()
            try:
                url = httpx.URL(callback.url)
                if callback.method == "GET":
                    url = url.copy_merge_params(query_fields(callback.body))
                else:
                    content = json.dumps(
                        callback.body, ensure_ascii=False, separators=(",", ":")
                    ).encode()
                    headers["content-type"] = "application/json"
                async with self.client.stream(
                    callback.method, url, content=content, headers=headers, timeout=timeout
                ) as response:
                    status = response.status_code
                    async for chunk in response.aiter_bytes():
                        answer += chunk
                        if len(answer) >= ANSWER_EXCERPT * 4:
                            break
            except httpx.TimeoutException:
                error = f"no answer within {seconds:g} s"
            except httpx.HTTPError as exc:
                error = describe_error(exc)
            except Exception as exc:  # a bad URL or body: this attempt's error
                error = f"cannot send: {type(exc).__name__}: {exc}"[:ANSWER_EXCERPT]
            duration_ms = (time.perf_counter() - started) * 1000
        return CallbackAttempt(
            number=len(callback.attempts) + 1,
            scheduled_at=scheduled,
            sent_at=sent,
            status_code=status,
            error=error,
            duration_ms=duration_ms,
            answer=answer.decode("utf-8", "replace")[:ANSWER_EXCERPT],
            duplicate=duplicate,
            resent=resent,
        )


def _origin(url: str) -> str:
    """The destination the breaker counts failures for: scheme, host and port."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


async def _first(*awaitables: Awaitable[object]) -> None:
    """Wait until the first of ``awaitables`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
