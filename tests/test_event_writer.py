"""The event writer: concurrent callbacks share a commit, every caller gets its own answer, and
the after-commit hook gets the new events in commit order, batched and timed as configured.

Run on each lane: in this process on SQLite and on PostgreSQL, and in the writer's own process
on SQLite (the process itself is tested in test_writer_process.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from receivers.store.records import Receipt, StoredEvent, StoreUnavailable
from receivers.store.writer import EventWriter, HookTiming
from relay.store import migrate
from tests.store_support import (
    NOW,
    arrival,
    eventually,
    rejected_bodies,
    rejection,
    stored_events,
    unwritable,
)

LANES = [("sqlite", False), ("sqlite", True), ("postgresql", False)]
IN_PROCESS = [("sqlite", False), ("postgresql", False)]
LANE_IDS = {False: "in-process", True: "writer-process"}


@pytest.fixture(params=LANES, ids=[f"{db}-{LANE_IDS[own]}" for db, own in LANES])
def lane(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The database and whether the writer has its own process."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def backend(lane: tuple[str, bool]) -> str:
    """(Overrides conftest's: the lane decides the backend.)"""
    return lane[0]


class Ticking:
    """A clock that moves a second each time it is read (the writer reads it once per group)."""

    def __init__(self) -> None:
        self._ticks = count()

    def __call__(self) -> datetime:
        return NOW + timedelta(seconds=next(self._ticks))


@pytest.fixture
async def writer(engine: AsyncEngine, lane: tuple[str, bool]) -> AsyncIterator[EventWriter]:
    writer = EventWriter(engine, clock=lambda: NOW, writer_process=lane[1])
    await writer.start()
    yield writer
    await writer.stop()


def store_all(writer: EventWriter, keys: Sequence[str]) -> list[asyncio.Future[Receipt]]:
    """Hand the writer one event per key, all in this pass of the event loop."""
    return [asyncio.ensure_future(writer.store(arrival(key))) for key in keys]


async def groups(engine: AsyncEngine) -> list[list[str]]:
    """The stored events' keys, by their time of arrival (the time of their group's write)."""
    by_time: dict[datetime, list[str]] = {}
    for key, row in sorted((await stored_events(engine)).items()):
        by_time.setdefault(row["received_at"], []).append(key)
    return [by_time[moment] for moment in sorted(by_time)]


@pytest.mark.parametrize("lane", IN_PROCESS, indirect=True, ids=["sqlite", "postgresql"])
async def test_what_arrives_while_a_group_is_written_goes_in_the_next_group(
    engine: AsyncEngine,
) -> None:
    writer = EventWriter(engine, clock=Ticking(), writer_process=False)
    await writer.start()
    try:
        first = store_all(writer, "a")
        await asyncio.sleep(0)  # its group starts, with it alone
        receipts = await asyncio.gather(*first, *store_all(writer, "bcd"))
        receipts += await asyncio.gather(
            *store_all(writer, [f"m{index:03}" for index in range(300)])
        )
    finally:
        await writer.stop()

    assert all(isinstance(receipt, Receipt) and not receipt.duplicate for receipt in receipts)
    assert len({receipt.event_id for receipt in receipts}) == 304
    found = await groups(engine)
    assert found[:2] == [["a"], ["b", "c", "d"]]
    assert [len(group) for group in found[2:]] == [256, 44]  # one pass's calls, 256 at most


async def test_every_caller_gets_its_own_answer(writer: EventWriter, engine: AsyncEngine) -> None:
    first, copy, quarantined, other = await asyncio.gather(
        writer.store(arrival("a")),
        writer.store(arrival("a")),
        writer.quarantine(rejection(b"not json")),
        writer.store(arrival("b")),
    )
    later = await writer.store(arrival("a"))

    assert not first.duplicate and quarantined is None and not other.duplicate
    assert copy == later == Receipt(first.event_id, duplicate=True)
    rows = await stored_events(engine)
    assert {key: (row["id"], row["duplicates"]) for key, row in rows.items()} == {
        "a": (first.event_id, 2),
        "b": (other.event_id, 0),
    }
    assert rows["a"]["received_at"] == NOW
    assert (await rejected_bodies(engine))[b"not json"]["count"] == 1


async def test_an_item_that_cannot_be_written_fails_alone(
    writer: EventWriter, engine: AsyncEngine
) -> None:
    first = writer.store(arrival("first"))  # written alone: the others form the next group
    answers = await asyncio.gather(
        writer.store(arrival("a")),
        writer.store(unwritable("bad")),
        writer.quarantine(rejection(b"x")),
        writer.store(arrival("b")),
        return_exceptions=True,
    )
    await first

    a, bad, quarantined, b = answers
    assert isinstance(a, Receipt) and isinstance(b, Receipt) and quarantined is None
    assert isinstance(bad, StoreUnavailable)
    assert set(await stored_events(engine)) == {"first", "a", "b"}


@pytest.mark.parametrize("own_process", [False, True], ids=LANE_IDS.get)
async def test_an_unavailable_database_fails_its_callers_and_the_writer_goes_on(
    tmp_path: Path, own_process: bool
) -> None:
    database = tmp_path / "later" / "relay.db"  # its directory does not exist yet
    engine = create_engine(f"sqlite:///{database}")
    writer = EventWriter(engine, clock=lambda: NOW, writer_process=own_process)
    await writer.start()
    try:
        answers = await asyncio.gather(
            writer.store(arrival("a")),
            writer.quarantine(rejection(b"x")),
            writer.store(arrival("b")),
            return_exceptions=True,
        )
        assert all(isinstance(answer, StoreUnavailable) for answer in answers)
        assert writer.available  # a write failed; the writer did not

        database.parent.mkdir()
        await migrate.upgrade(engine)
        receipt = await writer.store(arrival("a"))
        assert not receipt.duplicate
        assert (await stored_events(engine))["a"]["id"] == receipt.event_id
    finally:
        await writer.stop()
        await engine.dispose()


async def test_stopping_writes_what_was_handed_over_and_gives_the_hook_the_rest(
    engine: AsyncEngine, lane: tuple[str, bool]
) -> None:
    hook = HookCalls()
    writer = EventWriter(
        engine,
        clock=lambda: NOW,
        after_commit=hook,
        hook_timing=HookTiming(delay=60),
        writer_process=lane[1],
    )
    assert not writer.available
    await writer.start()
    assert writer.available
    keys = [f"k{index:03}" for index in range(100)]
    receipts = store_all(writer, keys)
    await writer.stop()

    assert all(receipt.done() and not receipt.exception() for receipt in receipts)
    assert set(await stored_events(engine)) == set(keys)
    assert sorted(key for call in hook for key in call) == keys
    assert not writer.available
    with pytest.raises(StoreUnavailable):
        await writer.store(arrival("late"))


# --- the after-commit hook ---------------------------------------------------------------------


class HookCalls(list[list[str]]):
    """An after-commit hook that records the keys of each call's events."""

    def __init__(self, then: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__()
        self.events: list[StoredEvent] = []
        self._then = then

    async def __call__(self, events: Sequence[StoredEvent]) -> None:
        self.append([event.payload["requestId"] for event in events])
        self.events += events
        if self._then is not None:
            await self._then()


async def test_the_hook_gets_the_new_events_in_commit_order_after_their_callers_were_woken(
    engine: AsyncEngine, lane: tuple[str, bool]
) -> None:
    receipts: dict[str, asyncio.Future[Receipt]] = {}
    woken_first: list[bool] = []

    async def check_callers() -> None:
        woken_first.append(all(receipts[key].done() for key in hook[-1]))

    hook = HookCalls(check_callers)
    writer = EventWriter(
        engine,
        clock=Ticking(),
        after_commit=hook,
        hook_timing=HookTiming(delay=0),
        writer_process=lane[1],
    )
    await writer.start()
    try:
        for key in "abc":
            receipts[key] = asyncio.ensure_future(writer.store(arrival(key)))
            await receipts[key]
        await writer.store(arrival("a"))  # a duplicate: not new
        await writer.quarantine(rejection(b"x"))  # not an event
        await eventually(lambda: len(hook.events) >= 3)
    finally:
        await writer.stop()

    assert [key for call in hook for key in call] == ["a", "b", "c"]
    assert woken_first == [True] * len(hook)
    rows = await stored_events(engine)
    for event in hook.events:
        row = rows[event.payload["requestId"]]
        assert (event.id, event.source, event.kind) == (row["id"], row["source"], row["kind"])
        assert event.received_at == row["received_at"] and event.payload == row["payload"]


@pytest.fixture
async def hooked(sqlite_engine: AsyncEngine) -> AsyncIterator[Callable[..., Any]]:
    """Start a writer (in this process) with a recording hook and no hook delay."""
    writers: list[EventWriter] = []

    async def start(hook: HookCalls, **options: Any) -> EventWriter:
        timing = HookTiming(**({"delay": 0} | options))
        writer = EventWriter(
            sqlite_engine,
            clock=lambda: NOW,
            after_commit=hook,
            writer_process=False,
            hook_timing=timing,
        )
        await writer.start()
        writers.append(writer)
        return writer

    yield start
    for writer in writers:
        await writer.stop()


async def commit_together(writer: EventWriter, keys: str) -> None:
    """Store one event per key, all in one group: a rejected body is written first, alone, and
    the events wait behind it."""
    first = asyncio.ensure_future(writer.quarantine(rejection(keys.encode())))
    await asyncio.sleep(0)  # the quarantine call hands its body over
    await asyncio.gather(first, *store_all(writer, keys))


async def test_a_quiet_writer_calls_the_hook_after_each_commit(hooked: Any) -> None:
    hook = HookCalls()
    writer = await hooked(hook, busy_events=2, interval=60)
    await writer.store(arrival("a"))
    await eventually(lambda: hook == [["a"]])
    await writer.store(arrival("b"))  # the call before carried fewer than 2: no interval
    await eventually(lambda: hook == [["a"], ["b"]])


async def test_after_a_busy_call_the_next_waits_for_the_interval(hooked: Any) -> None:
    hook = HookCalls()
    writer = await hooked(hook, busy_events=2, interval=60)
    await commit_together(writer, "ab")
    await eventually(lambda: hook == [["a", "b"]])

    await writer.store(arrival("c"))
    await writer.store(arrival("d"))
    await writer.stop()  # stopping hands over what waits
    assert hook == [["a", "b"], ["c", "d"]]  # not called for "c" alone: 60 s had not passed


async def test_a_full_hook_batch_is_handed_over_at_once(hooked: Any) -> None:
    hook = HookCalls()
    writer = await hooked(hook, busy_events=2, interval=60, batch=3)
    await commit_together(writer, "ab")
    await eventually(lambda: hook == [["a", "b"]])
    await commit_together(writer, "cde")  # within the interval, but a full batch
    await eventually(lambda: hook == [["a", "b"], ["c", "d", "e"]])


async def test_a_quiet_writer_waits_for_the_hook_delay(hooked: Any) -> None:
    loop = asyncio.get_running_loop()
    called_at: list[float] = []

    async def note_time() -> None:
        called_at.append(loop.time())

    hook = HookCalls(note_time)
    writer = await hooked(hook, delay=0.2)
    before = loop.time()
    await writer.store(arrival("a"))
    await eventually(lambda: hook == [["a"]])
    assert called_at[0] - before >= 0.2


async def test_the_hook_is_called_one_call_at_a_time(hooked: Any) -> None:
    release = asyncio.Event()
    running = [0]
    most = [0]

    async def hold() -> None:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            await release.wait()
        finally:
            running[0] -= 1

    hook = HookCalls(hold)
    writer = await hooked(hook)
    await writer.store(arrival("a"))
    await eventually(lambda: hook == [["a"]])
    await writer.store(arrival("b"))
    await writer.store(arrival("c"))
    assert hook == [["a"]]  # the first call has not returned

    release.set()
    await eventually(lambda: hook == [["a"], ["b", "c"]])
    assert most[0] == 1


async def test_a_failing_hook_is_logged_and_the_next_events_still_reach_it(
    hooked: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def fail_first() -> None:
        if len(hook) == 1:
            raise RuntimeError("the hook broke")

    hook = HookCalls(fail_first)
    writer = await hooked(hook)
    with caplog.at_level(logging.ERROR, logger="receivers.store.writer"):
        await writer.store(arrival("a"))
        await eventually(lambda: "after-commit hook failed" in caplog.text)
    await writer.store(arrival("b"))
    await eventually(lambda: hook == [["a"], ["b"]])
