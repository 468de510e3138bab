"""The write probe: a write that needs room as a callback does, and keeps nothing.

While the store refuses writes, a process that is not ready may get no callbacks, and an idle
relay writes nothing: the readiness checks (while the store is full) and the sweeps (while it
refuses the relay's writes) try this instead, and its success ends the refusal
(:mod:`receivers.store.writable`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import new_id
from receivers.store.tables import ReceivedEvent
from receivers.store.writable import StoreWritable, reason

log = logging.getLogger(__name__)

PROBE_BYTES = 4096
"""The probe's body: about a callback's, so that it needs room as a callback does."""
EVENTS = ReceivedEvent.__table__  # type: ignore[attr-defined]


async def probe_write(engine: AsyncEngine, now: datetime) -> None:
    """Store an event row of a callback's size and delete it in the same transaction: raises
    what a callback's write would raise now, keeps nothing, and no reader ever sees the row."""
    event_id = new_id(now)
    row = {
        "id": event_id,
        "source": "",
        "kind": "",
        "dedup_key": f"probe:{uuid.uuid4()}",
        "received_at": now,
        "payload": {},
        "raw_body": bytes(PROBE_BYTES),
        "method": "",
        "duplicates": 0,
    }
    async with engine.begin() as conn:
        await conn.execute(insert(EVENTS), [row])
        await conn.execute(delete(EVENTS).where(EVENTS.c.id == event_id))


class WriteProbe:
    """:func:`probe_write`, one at a time (callers meanwhile share its outcome), which is noted
    in ``writable``."""

    def __init__(
        self, engine: AsyncEngine, writable: StoreWritable, clock: Callable[[], datetime]
    ) -> None:
        self._engine = engine
        self._writable = writable
        self._clock = clock
        self._running: asyncio.Task[None] | None = None

    async def __call__(self) -> None:
        """Probe (or wait for the probe under way); raises its error."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._probe())
            self._running.add_done_callback(_retrieved)
        await asyncio.shield(self._running)

    async def _probe(self) -> None:
        try:
            await probe_write(self._engine, self._clock())
        except Exception as exc:
            if not self._writable.failed(exc):  # no refusal: a fault of the probe's own
                log.warning("the write probe failed: %s", reason(exc))
            raise
        self._writable.succeeded()


def _retrieved(task: asyncio.Task[None]) -> None:
    """Mark a probe's error as seen: the checks that waited for it may have timed out."""
    if not task.cancelled():
        task.exception()
