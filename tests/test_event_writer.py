"""The event writer's in-process group commit: when a batch takes its events, who gets which
answer, and when the after-commit hook is called.

The store here is a stand-in whose writes start and end only when the test says so, so that
the order of arrivals, hand-overs and commits is exact (the real lanes are tested in
test_process_lane.py and, through the app, in test_receiving.py)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from receivers.store.group_commit import GroupCommit
from receivers.store.records import (
    Arrival,
    Identity,
    Receipt,
    StoredEvent,
    StoreUnavailable,
    identity,
)
from receivers.store.rows import BatchRows
from receivers.store.writer import EventWriter, Lane

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class GatedStore:
    """A batch store with two slots whose writes start (build) and commit on request."""

    slots = 2

    def __init__(self) -> None:
        self.handed: deque[tuple[Callable[[], BatchRows], asyncio.Future[dict[Identity, str]]]]
        self.handed = deque()
        self.started: deque[tuple[BatchRows, asyncio.Future[dict[Identity, str]]]] = deque()
        self.batches: list[list[str]] = []
        """The dedup keys of each batch, in the order the batches were built."""

    def write(self, build: Callable[[], BatchRows]) -> Awaitable[dict[Identity, str]]:
        future: asyncio.Future[dict[Identity, str]] = asyncio.get_running_loop().create_future()
        self.handed.append((build, future))
        return future

    async def close(self) -> None:
        return None

    def start_next(self) -> None:
        """Start the oldest handed-over write: the batch is built now."""
        build, future = self.handed.popleft()
        rows = build()
        self.batches.append([row["dedup_key"] for row in rows.events])
        self.started.append((rows, future))

    async def commit_next(self) -> None:
        """Commit the oldest started write and let its callers run."""
        rows, future = self.started.popleft()
        future.set_result({identity(row): row["id"] for row in rows.events})
        await settle()

    async def fail_next(self, exc: Exception) -> None:
        """Fail the oldest handed-over write before it was built (as a lost connection would)."""
        _, future = self.handed.popleft()
        future.set_exception(exc)
        await settle()


async def settle() -> None:
    """Let every ready callback and task of the loop run."""
    for _ in range(5):
        await asyncio.sleep(0)


def arrival(key: str) -> Arrival:
    return Arrival(
        source="default",
        kind="sms.inbound",
        dedup_key=key,
        payload={"requestId": key},
        raw_body=b'{"requestId": "%s"}' % key.encode(),
        content_type="application/json",
        method="POST",
        remote_addr="127.0.0.1",
    )


def group_commit(store: GatedStore) -> Callable[..., Lane]:
    """The writer's lane factory: group commit on ``store``."""
    return lambda _engine, **options: GroupCommit(store, **options)


def submit(writer: EventWriter, keys: str) -> list[asyncio.Future[Receipt]]:
    """Hand the writer one event per key (each a one-letter dedup key); their receipts."""
    return [asyncio.ensure_future(writer.store(arrival(key))) for key in keys]


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    engine = create_engine("sqlite:///:memory:")
    yield engine
    await engine.dispose()


@pytest.fixture
async def gated(engine: AsyncEngine) -> AsyncIterator[tuple[EventWriter, GatedStore]]:
    store = GatedStore()
    writer = EventWriter(engine, clock=lambda: NOW, lane=group_commit(store))
    await writer.start()
    yield writer, store
    while store.handed or store.started:  # let stop() finish whatever is left
        if store.handed:
            store.start_next()
        await store.commit_next()
    await writer.stop()


async def test_the_waiting_batch_takes_what_arrived_while_the_first_was_written(
    gated: tuple[EventWriter, GatedStore],
) -> None:
    writer, store = gated
    [first] = submit(writer, "a")
    store.start_next()  # "a" is being written
    later = submit(writer, "bcd")
    await settle()
    assert len(store.handed) == 1  # one batch waits behind the first, nothing taken yet

    await store.commit_next()
    assert first.done() and not any(receipt.done() for receipt in later)
    store.start_next()
    await store.commit_next()

    assert store.batches == [["a"], ["b", "c", "d"]]
    receipts = [await receipt for receipt in [first, *later]]
    assert all(isinstance(receipt, Receipt) and not receipt.duplicate for receipt in receipts)
    assert len({receipt.event_id for receipt in receipts}) == 4


async def test_only_one_batch_at_a_time_waits_to_take_events(
    gated: tuple[EventWriter, GatedStore],
) -> None:
    writer, store = gated
    receipts = submit(writer, "abc")
    await settle()
    assert len(store.handed) == 1  # a second slot is free, but the first batch takes them all

    store.start_next()
    await store.commit_next()
    assert store.batches == [["a", "b", "c"]]
    assert all(receipt.done() for receipt in receipts)
    assert not store.handed


async def test_a_write_failing_before_its_batch_was_built_fails_the_queued_callers(
    gated: tuple[EventWriter, GatedStore],
) -> None:
    writer, store = gated
    receipts = submit(writer, "ab")
    await settle()
    await store.fail_next(ConnectionError("lost"))

    assert all(receipt.done() for receipt in receipts)
    for receipt in receipts:
        with pytest.raises(StoreUnavailable):
            receipt.result()
    assert not store.handed  # nothing is left queued for a batch that would never be built

    [retried] = submit(writer, "c")  # the writer goes on
    await settle()
    store.start_next()
    await store.commit_next()
    assert isinstance(await retried, Receipt)
    assert store.batches == [["c"]]


class HookCalls(list[list[str]]):
    """An after-commit hook that records the dedup keys of each call."""

    async def __call__(self, events: Sequence[StoredEvent]) -> None:
        self.append([event.payload["requestId"] for event in events])


async def hooked_writer(
    engine: AsyncEngine, store: GatedStore, hook: HookCalls, **options: Any
) -> EventWriter:
    """A started writer over ``store`` whose hook waits for no delay (only for the interval)."""
    writer = EventWriter(
        engine,
        clock=lambda: NOW,
        after_commit=hook,
        lane=group_commit(store),
        hook_delay=0,
        **options,
    )
    await writer.start()
    return writer


async def commit(writer: EventWriter, store: GatedStore, keys: str) -> None:
    """Store one event per key and commit them as one batch."""
    receipts = submit(writer, keys)
    await settle()
    store.start_next()
    await store.commit_next()
    assert all(receipt.done() for receipt in receipts)


async def test_a_quiet_writer_calls_the_hook_after_each_commit(engine: AsyncEngine) -> None:
    store, hook = GatedStore(), HookCalls()
    writer = await hooked_writer(engine, store, hook, hook_busy_events=2, hook_interval=60)
    await commit(writer, store, "a")
    await settle()
    await commit(writer, store, "b")  # the call before carried fewer than 2: no interval
    await settle()
    assert hook == [["a"], ["b"]]
    await writer.stop()


async def test_after_a_busy_call_the_next_waits_for_the_interval(engine: AsyncEngine) -> None:
    store, hook = GatedStore(), HookCalls()
    writer = await hooked_writer(engine, store, hook, hook_busy_events=2, hook_interval=60)
    await commit(writer, store, "ab")
    await settle()
    assert hook == [["a", "b"]]

    await commit(writer, store, "c")
    await commit(writer, store, "d")
    await settle()
    assert hook == [["a", "b"]]  # 60 s have not passed since the busy call began

    await writer.stop()  # stopping hands over what waits
    assert hook == [["a", "b"], ["c", "d"]]


async def test_a_full_hook_batch_is_handed_over_at_once(engine: AsyncEngine) -> None:
    store, hook = GatedStore(), HookCalls()
    writer = await hooked_writer(
        engine, store, hook, hook_busy_events=2, hook_interval=60, hook_batch=3
    )
    await commit(writer, store, "ab")
    await settle()
    await commit(writer, store, "cde")  # within the interval, but a full batch
    await settle()
    assert hook == [["a", "b"], ["c", "d", "e"]]
    await writer.stop()
