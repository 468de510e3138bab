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
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from relay import migrate
from relay.simulator import factories
from relay.tables import Delivery
from tests.conftest import TOKEN, running_client
from tests.full_store_support import (
    BIG_TEXT,
    FillableStore,
    PostgresStore,
    SqliteStore,
    limit_pages,
    page_limit_environment,
)
from tests.store_support import driver_threads, drivers_ended, eventually, stored_events
from tests.support import free_port

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
