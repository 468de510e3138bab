"""Dispatch: hands due deliveries to a worker's deliverer at their time.

The database is the truth: every delivery a dispatcher holds is also in SQL, due, so a
dispatcher that loses what it holds (a crash, a flushed Redis) only delays it until a sweeper
(:mod:`relay.outbox.sweeper`) finds it and dispatches it again. Two implementations share this
interface: :class:`relay.dispatch.jobs.JobQueue` (arq jobs on Redis, scaled mode: workers run
elsewhere) and :class:`relay.dispatch.in_process.InProcessDispatcher` (embedded mode: a heap
in the server's own event loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from relay.outbox import Due


class DispatchConnection(Protocol):
    """Whether a dispatcher can take work: Redis answers (scaled), always (in process)."""

    @property
    def connected(self) -> bool: ...

    @property
    def reason(self) -> str | None:
        """Why it is lost (None while it is connected)."""
        ...

    async def until_connected(self) -> None: ...

    def on_back(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` each time it is back after an outage."""
        ...


class Dispatcher(Protocol):
    """What the routing hook, the deliverer's retries, the console and the sweeper hand due
    deliveries to."""

    @property
    def connection(self) -> DispatchConnection: ...

    async def enqueue(self, due: Sequence[Due]) -> int:
        """Dispatch these deliveries, each at its time (those of one batch ``job`` together);
        returns how many new jobs that made (a job already held is not made twice). While the
        connection is lost, nothing is dispatched and no error raised: the sweepers do it
        later."""
        ...

    async def without_jobs(self, due: Sequence[Due]) -> list[Due]:
        """The deliveries whose job is neither held nor running, as single jobs to dispatch
        (the sweeper's question)."""
        ...
