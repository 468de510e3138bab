"""Helpers of the store's tests (the write path, the coalescer, the event writer, its process):
items to write, bounded waits, and the writer processes this test process started."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.records import Arrival, Rejection, StoredEvent
from receivers.store.tables import ReceivedEvent, RejectedBody

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__
WAIT_SECONDS = 30.0
"""How long a bounded wait waits before the test fails."""


def arrival(key: str, **changes: Any) -> Arrival:
    """An event whose dedup key (and ``requestId``) is ``key``."""
    fields: dict[str, Any] = {
        "source": "default",
        "kind": "sms.inbound",
        "dedup_key": key,
        "payload": {"requestId": key, "text": "héllo", "n": [1, 2.5, None, True]},
        "raw_body": b'{"requestId": "%s"}' % key.encode(),
        "content_type": "application/json",
        "method": "POST",
        "remote_addr": "127.0.0.1",
    }
    return Arrival(**(fields | changes))


def unwritable(key: str) -> Arrival:
    """An event whose row no backend takes (its body is text, not bytes); it crosses the
    writer process's wire unchanged."""
    return arrival(key, raw_body="not bytes")


def rejection(body: bytes, **changes: Any) -> Rejection:
    """A quarantined body."""
    fields: dict[str, Any] = {
        "source": "default",
        "path": "/hooks/sms/inbound",
        "kind": None,
        "status": 400,
        "reason": "The body is not JSON.",
        "errors": [{"field": "(body)", "message": "not JSON"}],
        "raw_body": body,
        "content_type": None,
        "remote_addr": "10.0.0.1",
    }
    return Rejection(**(fields | changes))


async def eventually(
    check: Callable[[], Any | Awaitable[Any]], *, timeout: float = WAIT_SECONDS
) -> Any:
    """Poll ``check`` (sync or async) until it answers something true; that answer. Fails the
    test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout} s")
        await asyncio.sleep(0.01)


async def within(awaitable: Awaitable[Any], *, timeout: float = WAIT_SECONDS) -> Any:
    """Await ``awaitable``, failing the test after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        return await awaitable


def driver_threads() -> set[threading.Thread]:
    """The live threads of aiosqlite connections (one each)."""
    return {t for t in threading.enumerate() if t.name.endswith("(_connection_worker_thread)")}


async def drivers_ended(before: set[threading.Thread]) -> None:
    """Wait until the aiosqlite threads started since ``before`` have ended: one whose
    connection failed to open still hands its end to the event loop, which must not be closed
    by then (a thread's traceback in the next test)."""
    await eventually(lambda: not driver_threads() - before)


def blocking_eventually(check: Callable[[], Any], *, timeout: float = WAIT_SECONDS) -> Any:
    """:func:`eventually` for a test that must not let its event loop run meanwhile."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout} s")
        time.sleep(0.005)
    return value


class Stored(list[StoredEvent]):
    """An ``on_stored`` callback of a lane: keeps every reported batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[StoredEvent]] = []

    def __call__(self, events: list[StoredEvent]) -> None:
        self.batches.append(list(events))
        self.extend(events)


async def stored_events(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    """Every stored event row by dedup key."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(EVENTS))).mappings().all()
    return {row["dedup_key"]: dict(row) for row in rows}


async def rejected_bodies(engine: AsyncEngine) -> dict[bytes, dict[str, Any]]:
    """Every quarantine row by body."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(REJECTED))).mappings().all()
    return {row["raw_body"]: dict(row) for row in rows}


WRITER_PROCESS_WAIT_SECONDS = 10.0


def writer_processes(database: str, *, count: int | None = None) -> list[int]:
    """The pids of the live writer processes of ``database`` that this process started
    (found in /proc: children of this process running ``receivers.store.writer_process``).

    With ``count``, waits (up to 10 s) until that many are found: a child just forked shows
    this process's own command line until it has run ``exec``, which a loaded machine delays."""
    deadline = time.monotonic() + WRITER_PROCESS_WAIT_SECONDS
    while True:
        found = _writer_processes(database)
        if count is None or len(found) == count or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def _writer_processes(database: str) -> list[int]:
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        parent = re.search(r"^PPid:\s*(\d+)", status, re.MULTILINE)
        state = re.search(r"^State:\s*(\S)", status, re.MULTILINE)
        if (
            parent is not None
            and int(parent.group(1)) == me
            and (state is None or state.group(1) != "Z")
            and b"receivers.store.writer_process" in arguments
            and os.fsencode(database) in arguments
        ):
            found.append(int(entry.name))
    return found


def child_environment() -> dict[str, str]:
    """This environment, with the project's root first on the path (for a writer process that
    a test starts itself)."""
    import receivers

    root = str(Path(receivers.__file__).resolve().parent.parent)
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    }
