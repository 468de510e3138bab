"""The relay queue's connection state: Redis only dispatches (the database is the truth), so
losing it delays deliveries and never stops a process.

Whatever finds Redis gone (a worker's poll, a job's bookkeeping, an enqueue, a sweep) reports it
to the process's :class:`QueueConnection`. The first report logs ``queue lost: <reason>`` and
starts probing Redis with PING, waiting between probes by capped exponential backoff with jitter
(:class:`Backoff`), until it answers: then ``queue back after <duration>``, and what waited for it
goes on (:meth:`QueueConnection.until_connected`; the listeners of
:meth:`QueueConnection.on_back`, such as the sweeper, which then sweeps at once). Meanwhile
nothing is enqueued: what was to be is in the database, where the sweepers find it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from relay.destinations.errors import describe_error
from relay.dispatch.outage import Outage
from relay.observe.metrics import queue_connected_gauge

log = logging.getLogger("relay.queue_connection")  # stable: users filter on it

QUEUE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    TimeoutError,
)
"""What a lost Redis raises: a refused, reset or closed connection (a restart, even of a
second), a time-out, a server still loading its data after a restart (``BusyLoadingError``) or
refusing the login (both are ``ConnectionError``). Other Redis errors (a command Redis refuses)
are not an outage, and are not waited out. See :func:`queue_lost`."""


def queue_lost(error: BaseException) -> bool:
    """Whether ``error`` says that Redis is lost: one of :data:`QUEUE_ERRORS`, or the
    ``WatchError`` redis-py raises while handling one when the connection of a transaction
    that watches keys (arq's start of a job) is lost."""
    if isinstance(error, QUEUE_ERRORS):
        return True
    return isinstance(error, WatchError) and isinstance(error.__context__, QUEUE_ERRORS)


FIRST_PROBE_SECONDS = 0.1
LONGEST_PROBE_WAIT_SECONDS = 2.0
"""Once Redis answers again, the queue is back within this long."""
PROBE_TIMEOUT_SECONDS = 5.0
"""A probe that gets no answer in this long (a server that accepts connections and never
answers) fails like a refused one."""


class QueueUnavailable(Exception):
    """The queue's Redis is lost: what would have been enqueued waits in the database."""


@dataclass(frozen=True)
class Backoff:
    """The waits between probes of a lost Redis: doubling from ``first`` up to ``cap`` seconds,
    each drawn at random in the upper half of its bound, so that the processes of a deployment
    do not all probe at the same moment."""

    first: float = FIRST_PROBE_SECONDS
    cap: float = LONGEST_PROBE_WAIT_SECONDS
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delays(self) -> Iterator[float]:
        """The wait before each probe, without end."""
        bound = self.first
        while True:
            yield self.rng.uniform(bound / 2, bound)
            bound = min(bound * 2, self.cap)


class QueueConnection:
    """Whether the relay queue's Redis (``pool``) answers; see the module docstring.
    ``relay_queue_connected`` in ``registry`` (a private one by default) follows it. ``backoff``,
    ``sleep`` and ``clock`` (monotonic seconds, for the outage's length) are the tests' to
    replace. :meth:`aclose` stops a probe under way."""

    def __init__(
        self,
        pool: Redis,
        *,
        registry: CollectorRegistry | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._outage = Outage("queue", clock=clock, logger=log)
        self._backoff = backoff if backoff is not None else Backoff()
        self._sleep = sleep
        self._gauge = queue_connected_gauge(
            registry if registry is not None else CollectorRegistry()
        )
        self._connected = asyncio.Event()
        self._connected.set()
        self._listeners: list[Callable[[], None]] = []
        self._probe: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        """Whether Redis answers (as far as this process knows)."""
        return self._connected.is_set()

    @property
    def reason(self) -> str | None:
        """Why the queue is lost (None while it is connected)."""
        return self._outage.reason

    def lost(self, error: BaseException) -> None:
        """A call to Redis failed with ``error``: the first report of an outage logs it and
        starts probing; later ones change nothing."""
        if not self._outage.lost(error):
            return
        self._connected.clear()
        self._gauge.set(0)
        self._probe = asyncio.get_running_loop().create_task(
            self._reconnect(), name="relay-queue-probe"
        )

    async def until_connected(self) -> None:
        """Return once Redis answers (at once while it does)."""
        await self._connected.wait()

    def on_back(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` each time the queue is back after an outage."""
        self._listeners.append(listener)

    async def aclose(self) -> None:
        """Stop probing (the process is stopping)."""
        probe, self._probe = self._probe, None
        if probe is not None and not probe.done():
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe

    async def _reconnect(self) -> None:
        for delay in self._backoff.delays():
            await self._sleep(delay)
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                    await self._pool.ping()
            except Exception as exc:  # whatever it says, Redis is not back: probe again
                log.debug("queue probe failed: %s", describe_error(exc))
                continue
            break
        self._outage.back()
        self._gauge.set(1)
        self._connected.set()
        for listener in self._listeners:
            listener()
