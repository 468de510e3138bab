"""A transactional outbox: the event writer routes new events in the transaction that stores
them, so an event and its deliveries commit together; a router that fails or cannot be loaded
never costs an event, and says so once, not per group.

Run on each lane: in this process on SQLite and on PostgreSQL, and in the writer's own process
on SQLite (which loads the router itself)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import StoredEvent
from receivers.store.in_commit import InCommitWriter, WriteInCommit
from receivers.store.records import Receipt
from receivers.store.writer import EventWriter, HookTiming
from relay.destinations import parse_destination_config
from relay.observe.logs import JsonLines
from relay.outbox import DELIVERIES, ROUTED
from relay.outbox.in_commit import first_jobs, routing_writer
from tests.store_support import NOW, arrival, stored_events

LANES = [("sqlite", False), ("sqlite", True), ("postgresql", False)]
LANE_IDS = {False: "in-process", True: "writer-process"}
DESTINATIONS = {
    "inbound": parse_destination_config(
        {"type": "http", "url": "http://127.0.0.1:9/in", "kinds": ["sms.inbound"]}
    ),
    "lines": parse_destination_config(
        {
            "type": "http",
            "url": "http://user:secret@127.0.0.1:9/lines",
            "kinds": ["sms.*"],
            "ordering": "per-key",
            "order_key": "{payload.requestId}",
        }
    ),
    "reports": parse_destination_config(
        {"type": "http", "url": "http://127.0.0.1:9/dlr", "kinds": ["sms.dlr"]}
    ),
}


@pytest.fixture(params=LANES, ids=[f"{db}-{LANE_IDS[own]}" for db, own in LANES])
def lane(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The database and whether the writer has its own process."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def backend(lane: tuple[str, bool]) -> str:
    """(Overrides conftest's: the lane decides the backend.)"""
    return lane[0]


async def running_writer(
    engine: AsyncEngine, lane: tuple[str, bool], in_commit: InCommitWriter
) -> AsyncIterator[EventWriter]:
    writer = EventWriter(engine, clock=lambda: NOW, writer_process=lane[1], in_commit=in_commit)
    await writer.start()
    try:
        yield writer
    finally:
        await writer.stop()


@pytest.fixture
async def writer(engine: AsyncEngine, lane: tuple[str, bool]) -> AsyncIterator[EventWriter]:
    async for running in running_writer(engine, lane, routing_writer(DESTINATIONS)):
        yield running


async def deliveries_of(engine: AsyncEngine, event_id: str) -> list[tuple[str, str, str | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(DELIVERIES.c.id, DELIVERIES.c.destination, DELIVERIES.c.order_key)
            .where(DELIVERIES.c.event_id == event_id)
            .order_by(DELIVERIES.c.destination)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


async def routed_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(ROUTED))).scalar_one())


async def test_an_event_and_its_deliveries_commit_together(
    writer: EventWriter, engine: AsyncEngine
) -> None:
    receipt = await writer.store(arrival("r-1"))

    made = await deliveries_of(engine, receipt.event_id)
    assert [(destination, key) for _, destination, key in made] == [
        ("inbound", None),
        ("lines", "r-1"),
    ]
    assert sorted(pair[0] for pair in receipt.written_with) == sorted(row[0] for row in made)
    assert len({pair[1] for pair in receipt.written_with}) == 1  # one first job for both
    assert await routed_count(engine) == 1

    again = await writer.store(arrival("r-1"))
    assert again == Receipt(receipt.event_id, True)  # a copy: nothing routed twice
    assert len(await deliveries_of(engine, receipt.event_id)) == 2

    unmatched = await writer.store(arrival("r-2", kind="conversations.status"))
    assert unmatched.written_with == []  # routed to no destination
    assert await deliveries_of(engine, unmatched.event_id) == []
    assert await routed_count(engine) == 2


async def test_the_hook_gets_each_new_events_first_jobs(
    engine: AsyncEngine, lane: tuple[str, bool]
) -> None:
    hooked: list[StoredEvent] = []

    async def hook(events: Sequence[StoredEvent]) -> None:
        hooked.extend(events)

    writer = EventWriter(
        engine,
        clock=lambda: NOW,
        writer_process=lane[1],
        in_commit=routing_writer(DESTINATIONS),
        after_commit=hook,
        hook_timing=HookTiming(delay=0),
    )
    await writer.start()
    try:
        receipt = await writer.store(arrival("r-1", kind="sms.dlr"))
    finally:
        await writer.stop()
    (event,) = hooked
    assert event.id == receipt.event_id
    jobs = first_jobs(hooked)
    assert sorted(due.id for due in jobs) == sorted(
        row[0] for row in await deliveries_of(engine, event.id)
    )
    assert all(due.attempts == 0 and due.at == NOW and due.job for due in jobs)


def failing_on_bad_keys(argument: Any) -> WriteInCommit:
    """An in-commit writer that routes nothing and fails on a group holding a ``bad`` event."""

    def write(conn: Connection, events: Sequence[StoredEvent]) -> list[Any]:
        if any(e.payload["requestId"].startswith("bad") for e in events):
            raise RuntimeError("a router fault")
        return [[] for _ in events]

    return write


async def test_a_failing_router_never_costs_an_event_and_says_so_once_per_change(
    engine: AsyncEngine, lane: tuple[str, bool], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="receivers.store.in_commit")
    broken = InCommitWriter(f"{__name__}:failing_on_bad_keys")
    async for writer in running_writer(engine, lane, broken):
        first = await writer.store(arrival("bad-1"))
        retried = await writer.store(arrival("bad-1"))  # a copy: the router is not called
        second = await writer.store(arrival("bad-2"))
        fine = await writer.store(arrival("good-1"))
    assert retried.duplicate
    assert not first.duplicate and not second.duplicate
    assert first.written_with is None and second.written_with is None  # stored, unrouted
    assert fine.written_with == []
    assert sorted(await stored_events(engine)) == ["bad-1", "bad-2", "good-1"]
    # the writer's own process hands its records to the server, which logs them as its own
    assert [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records] == [
        ("ERROR", "writing the outbox with the events failed"),
        ("INFO", "writing the outbox with the events works again"),
    ]
    error = caplog.records[0]
    # with its traceback, where formatters print an exception (the JSON lines' "exception")
    assert "RuntimeError: a router fault" in json.loads(JsonLines().format(error))["exception"]


async def test_a_router_that_cannot_be_loaded_leaves_the_events_stored(
    engine: AsyncEngine, lane: tuple[str, bool], caplog: pytest.LogCaptureFixture
) -> None:
    async for writer in running_writer(engine, lane, InCommitWriter("no_such_module:routing")):
        receipt = await writer.store(arrival("r-1"))
    assert not receipt.duplicate and receipt.written_with is None
    assert await routed_count(engine) == 0
    assert [r.getMessage().split(";")[0] for r in caplog.records if r.levelname == "ERROR"] == [
        "could not load the outbox writer no_such_module:routing"
    ]


async def test_a_long_list_of_destinations_reaches_the_writer_wherever_it_runs(
    engine: AsyncEngine, lane: tuple[str, bool]
) -> None:
    """Their filters are over the system's limit on one command-line argument (128 KiB): the
    writer's own process gets them on its socket."""
    many = {
        f"destination-{n:04d}": parse_destination_config(
            {"type": "http", "url": f"http://127.0.0.1:9/{n}", "sources": ["default", "other"]}
        )
        for n in range(1200)
    }
    writer = routing_writer(many)
    assert len(writer.to_json()) > 128 * 1024
    async for running in running_writer(engine, lane, writer):
        receipt = await running.store(arrival("r-1"))
    assert len(receipt.written_with) == 1200
    assert len(await deliveries_of(engine, receipt.event_id)) == 1200
