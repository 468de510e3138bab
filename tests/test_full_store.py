"""A full store: callbacks get 503 and the server is not ready, one WARNING when the store
starts refusing writes and one INFO when it takes them again (never a traceback per write), and
nothing acknowledged is lost, on the receiving side and on the relay's.

The store fills up as on a full disk (tests/full_store_support.py): SQLite capped in pages and
filled, PostgreSQL raising ``disk_full`` from a trigger. ``relay serve`` itself, with its log,
is in test_full_store_serve.py."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import StoredEvent
from receivers.store.engine import create_engine
from relay import outbox
from relay.cli import main
from relay.destinations import parse_destination_config
from relay.dispatch.in_process import InProcessDispatcher
from relay.observe.metrics import WorkerMetrics
from relay.outbox.hook import RoutingHook
from relay.outbox.router import Router
from relay.outbox.sweeper import Sweeper
from relay.outbox.tables import DEAD, SUCCEEDED, Delivery
from relay.simulator import factories
from relay.store import migrate
from tests.conftest import TOKEN, running_client
from tests.console_support import console_client
from tests.full_store_support import (
    BIG_TEXT,
    FillableStore,
    PostgresStore,
    SqliteStore,
    limit_pages,
    page_limit_environment,
)
from tests.relay_support import Clock, Relay, store_events
from tests.store_support import driver_threads, drivers_ended, eventually, stored_events
from tests.support import Answer, Sink, free_port

LANES = [("sqlite", False), ("sqlite", True), ("postgresql", False)]
LANE_IDS = [f"{db}-{'writer-process' if own else 'in-process'}" for db, own in LANES]
URL = f"/hooks/sms/inbound?token={TOKEN}"
REFUSED = re.compile(
    r"the store refuses (callbacks|the relay's writes): it is (full|unavailable) \(.+\)"
)
TAKEN = re.compile(r"the store takes (callbacks|the relay's writes) again after \d+\.\d s")
DELIVERIES = Delivery.__table__


@pytest.fixture
async def full_store(
    engine: AsyncEngine, backend: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FillableStore]:
    """The test's store, ready to be filled: every connection to it capped (SQLite; a writer
    process started from now on too), or its tables' trigger installed (PostgreSQL)."""
    if backend == "postgresql":
        store = PostgresStore(engine)
        await store.install()
        try:
            yield store
        finally:
            await store.remove()
        return
    capped = SqliteStore(Path(str(engine.url.database)))
    limit_pages(engine, capped.pages)
    await engine.dispose()  # its next connections are capped
    environment = page_limit_environment(capped.pages)
    for name in ("PYTHONPATH", "TEST_SQLITE_MAX_PAGE_COUNT"):
        monkeypatch.setenv(name, environment[name])
    yield capped


def store_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The log's lines about the store refusing and taking writes: (level, message)."""
    return [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if REFUSED.fullmatch(record.getMessage()) or TAKEN.fullmatch(record.getMessage())
    ]


def assert_no_trace(caplog: pytest.LogCaptureFixture) -> None:
    """No error and no traceback anywhere in the log."""
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], [r.getMessage() for r in bad]


def big_body() -> dict[str, Any]:
    """A callback whose stored row needs a page of its own."""
    return factories.sms_inbound({"message": BIG_TEXT})


def assert_store_full(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["retry-after"] == "5"
    assert answer.json()["type"].endswith(":store-full")


@pytest.fixture(params=LANES, ids=LANE_IDS)
def lane(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The database and whether the event writer has its own process."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def backend(lane: tuple[str, bool]) -> str:
    """(Overrides conftest's: the lane decides the backend.)"""
    return lane[0]


# --- the receivers -------------------------------------------------------------------------------


async def test_callbacks_to_a_full_store_get_503_and_one_warning_then_200_and_one_info(
    engine: AsyncEngine,
    lane: tuple[str, bool],
    full_store: FillableStore,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)
    async with running_client(engine, writer_process=lane[1]) as client:
        before = await client.post(URL, json=big_body())
        assert before.status_code == 200, before.text
        await full_store.fill()

        one_by_one = [await client.post(URL, json=big_body()) for _ in range(10)]
        together = await asyncio.gather(*(client.post(URL, json=big_body()) for _ in range(20)))
        for answer in [*one_by_one, *together]:
            assert_store_full(answer)
        for _ in range(3):
            assert_store_full(await client.get("/readyz"))

        await full_store.make_room()
        after = await client.post(URL, json=big_body())
        assert after.status_code == 200, after.text
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text

    levels = [level for level, _ in store_lines(caplog)]
    assert levels == ["WARNING", "INFO"], store_lines(caplog)
    assert "it is full" in store_lines(caplog)[0][1]
    assert_no_trace(caplog)
    assert "Traceback" not in capfd.readouterr().err  # the writer process's own output
    stored = {row["id"] for row in (await stored_events(engine)).values()}
    assert stored == {before.json()["id"], after.json()["id"]}


async def test_a_full_store_that_gets_room_again_makes_the_server_ready_without_a_callback(
    engine: AsyncEngine,
    lane: tuple[str, bool],
    full_store: FillableStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that is not ready may get no callback: its readiness checks write a probe
    (kept by no one) that tells when the store takes callbacks again."""
    caplog.set_level(logging.INFO)
    async with running_client(engine, writer_process=lane[1]) as client:
        first = await client.post(URL, json=big_body())
        await full_store.fill()
        assert_store_full(await client.post(URL, json=big_body()))
        assert_store_full(await client.get("/readyz"))
        assert_store_full(await client.get("/readyz"))  # the probe does not fit either

        await full_store.make_room()

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await eventually(ready)

    assert [level for level, _ in store_lines(caplog)] == ["WARNING", "INFO"]
    assert_no_trace(caplog)
    stored = {row["id"] for row in (await stored_events(engine)).values()}
    assert stored == {first.json()["id"]}  # the probe left nothing behind


@pytest.fixture(params=["sqlite", "postgresql"])
async def unreachable(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[AsyncEngine, Path | None]]:
    """A store that cannot be reached, and the path that makes it reachable: a SQLite file in
    a directory that does not exist yet, or a PostgreSQL server that refuses connections
    (None: it stays so)."""
    database = tmp_path / "later" / "relay.db"
    url = f"sqlite:///{database}"
    if request.param == "postgresql":
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    before = driver_threads()
    engine = create_engine(url)
    yield engine, database if request.param == "sqlite" else None
    await engine.dispose()
    await drivers_ended(before)


@pytest.mark.parametrize("writer_process", [False, True], ids=["in-process", "writer-process"])
async def test_an_unreachable_store_is_one_warning_however_many_checks_and_callbacks(
    unreachable: tuple[AsyncEngine, Path | None],
    writer_process: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, database = unreachable
    caplog.set_level(logging.INFO)
    async with running_client(engine, writer_process=writer_process) as client:
        for _ in range(5):
            answer = await client.get("/readyz")
            assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
        for _ in range(3):
            answer = await client.post(URL, json=factories.sms_inbound())
            assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
            assert answer.json()["type"].endswith(":store-unavailable")
        if database is not None:  # the SQLite file can be made: the next callback is stored
            database.parent.mkdir()
            await migrate.upgrade(engine)
            assert (await client.post(URL, json=factories.sms_inbound())).status_code == 200

    lines = store_lines(caplog)
    assert lines[0][0] == "WARNING" and "it is unavailable" in lines[0][1], lines
    assert [level for level, _ in lines] == ["WARNING"] + (["INFO"] if database else [])
    assert_no_trace(caplog)
    assert "readiness check failed" not in caplog.text


# --- the relay -----------------------------------------------------------------------------------


relay_backends = pytest.mark.parametrize(
    "lane", [("sqlite", False), ("postgresql", False)], ids=["sqlite", "postgresql"], indirect=True
)


async def unrouted(engine: AsyncEngine, clock: Clock) -> list[outbox.EventRef]:
    return await outbox.unrouted_events(engine, clock() + timedelta(days=1), 1000)


@relay_backends
async def test_routing_into_a_full_store_leaves_the_events_to_the_sweeper_without_a_trace(
    engine: AsyncEngine, full_store: FillableStore, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    router = Router({"crm": parse_destination_config({"type": "http", "url": sink.url()})})
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(100)], clock)
    events = await unrouted(engine, clock)
    await full_store.fill()
    hook = RoutingHook(engine, router, clock)

    caplog.set_level(logging.INFO)
    stored = [StoredEvent(e.id, e.source, e.kind, clock(), dict(e.payload)) for e in events]
    await hook(stored[:50])
    await hook(stored[50:])  # no exception: the events stay stored, unrouted

    assert [level for level, _ in store_lines(caplog)] == ["WARNING"]
    assert "the relay's writes: it is full" in store_lines(caplog)[0][1]
    assert_no_trace(caplog)
    assert len(await unrouted(engine, clock)) == 100

    await full_store.make_room()
    clock.advance(timedelta(seconds=10))
    report = await Sweeper(
        engine,
        router,
        InProcessDispatcher(concurrency=1),
        clock=clock,
        interval=timedelta(seconds=1),
    ).sweep()
    assert report.routed_events == 100 and await unrouted(engine, clock) == []


@relay_backends
async def test_a_sweeper_on_a_full_store_logs_once_and_routes_once_there_is_room(
    engine: AsyncEngine, full_store: FillableStore, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    router = Router({"crm": parse_destination_config({"type": "http", "url": sink.url()})})
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(100)], clock)
    clock.advance(timedelta(seconds=10))
    await full_store.fill()
    metrics = WorkerMetrics()
    sweeper = Sweeper(
        engine,
        router,
        InProcessDispatcher(concurrency=1),
        clock=clock,
        interval=timedelta(milliseconds=20),
        metrics=metrics,
    )

    def sweeps(outcome: str) -> float:
        return metrics.registry.get_sample_value("relay_sweeps_total", {"outcome": outcome}) or 0

    caplog.set_level(logging.INFO)
    running = asyncio.create_task(sweeper.run())
    try:
        await eventually(lambda: sweeps("failed") >= 5)
        assert [level for level, _ in store_lines(caplog)] == ["WARNING"]
        assert_no_trace(caplog)

        await full_store.make_room()
        await eventually(lambda: sweeps("ok") >= 1)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert await unrouted(engine, clock) == []
    assert [level for level, _ in store_lines(caplog)] == ["WARNING", "INFO"]
    assert_no_trace(caplog)


@relay_backends
async def test_attempts_on_a_full_store_end_quietly_and_are_made_again_once_there_is_room(
    engine: AsyncEngine, full_store: FillableStore, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL refuses the claims (updates need room there); SQLite takes them (in place)
    and refuses the records of the attempts, whose leases then run out before they are made
    again: the destination may get an event twice, never none."""
    sink.answers["/hook"] = Answer(body=b"x" * 2000)  # an attempt's row needs room
    clock = Clock()
    relay = Relay(engine, {"crm": {"type": "http", "url": sink.url()}}, clock)
    try:
        posts = [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(40)]
        event_ids = set(await store_events(engine, posts, clock))
        due = await relay.route_all()
        await full_store.fill()

        caplog.set_level(logging.INFO)
        await relay.deliverer.attempt_many([d.id for d in due])  # no exception
        assert [level for level, _ in store_lines(caplog)] == ["WARNING"]
        assert_no_trace(caplog)

        await full_store.make_room()
        clock.advance(timedelta(minutes=5))  # past the leases of the unrecorded attempts
        await relay.deliverer.attempt_many([d.id for d in due])
    finally:
        await relay.aclose()

    async with engine.connect() as conn:
        rows = (await conn.execute(select(DELIVERIES.c.event_id, DELIVERIES.c.status))).all()
    assert {status for _, status in rows} == {SUCCEEDED} and len(rows) == 40
    assert {event_id for event_id, _ in rows} == event_ids
    delivered = {r.headers["webhook-id"] for r in sink.requests}
    assert delivered == event_ids
    assert [level for level, _ in store_lines(caplog)] == ["WARNING", "INFO"]
    assert_no_trace(caplog)
    assert DEAD not in {status for _, status in rows}


on_postgresql = pytest.mark.parametrize(
    "lane", [("postgresql", False)], ids=["postgresql"], indirect=True
)
"""A full PostgreSQL refuses updates too; SQLite updates a row in place, which a full file
still takes (the console's and the command's replay is such an update)."""


async def a_delivery(engine: AsyncEngine, sink: Sink) -> str:
    """The id of a delivery of a stored, routed event."""
    clock = Clock()
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr())], clock)
    relay = Relay(engine, {"crm": {"type": "http", "url": sink.url()}}, clock)
    try:
        [due] = await relay.route_all()
    finally:
        await relay.aclose()
    return due.id


@on_postgresql
async def test_a_console_action_the_full_store_refuses_is_503_without_a_trace(
    engine: AsyncEngine, full_store: FillableStore, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    delivery_id = await a_delivery(engine, sink)
    await full_store.fill()
    caplog.set_level(logging.INFO)
    async with console_client(engine, Clock(), ["crm"]) as console:
        assert (await console.login()).status_code == 303
        replay = f"/console/deliveries/{delivery_id}/replay"
        refused = await console.act(replay, back="/console/deliveries")
        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["detail"] == "The store is full and refuses writes: try again later."
        assert (await console.act(replay, back="/console/deliveries")).status_code == 503

        await full_store.make_room()
        assert (await console.act(replay, back="/console/deliveries")).status_code == 303
    assert [level for level, _ in store_lines(caplog)] == ["WARNING"]
    assert_no_trace(caplog)


@on_postgresql
async def test_a_command_the_full_store_refuses_is_one_line(
    engine: AsyncEngine,
    full_store: FillableStore,
    sink: Sink,
    database_url: str,
    tmp_path: Path,
) -> None:
    delivery_id = await a_delivery(engine, sink)
    config = tmp_path / "relay.toml"
    config.write_text(f'database_url = "{database_url}"\n')
    replay = ["deliveries", "replay", delivery_id, "--config", str(config)]
    await full_store.fill()

    result = await asyncio.to_thread(CliRunner().invoke, main, replay)

    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1] == (
        "Error: the store is full and refuses writes: "
        "could not extend file: No space left on device"
    )
    assert "Traceback" not in result.output
    await full_store.make_room()
    result = await asyncio.to_thread(CliRunner().invoke, main, replay)
    assert result.exit_code == 0 and "replayed 1 delivery" in result.output
