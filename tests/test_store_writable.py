"""What the store's errors say (full, unreachable, or a fault of the write itself), the state of
a process's writes that logs each change of it once, the event writer's lanes and the probe
that tell it how writes go."""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from receivers.store.probe import WriteProbe, probe_write
from receivers.store.records import Receipt, StoreFull, StoreUnavailable, StoreUnreachable
from receivers.store.writable import StoreWritable, refusal_of
from receivers.store.writer import EventWriter
from receivers.store.writer_process import _unwire, _wire
from tests.conftest import PG_ADMIN_DSN, service_missing
from tests.full_store_support import (
    BIG_TEXT,
    FillableStore,
    PostgresStore,
    SqliteStore,
    limit_pages,
    page_limit_environment,
)
from tests.store_support import NOW, arrival, driver_threads, drivers_ended, stored_events
from tests.support import free_port

SECRET = "hunter2-never-in-a-log"

# --- what an error says ------------------------------------------------------------------------


async def error_of(engine: AsyncEngine, sql: str, **values: object) -> Exception:
    """The error ``sql`` raises on ``engine``, as SQLAlchemy raises it."""
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql), values)
    except Exception as exc:
        return exc
    raise AssertionError(f"{sql} did not fail")


@pytest.fixture
async def capped(tmp_path: Path) -> AsyncIterator[tuple[AsyncEngine, SqliteStore]]:
    """A SQLite store that is full: an async engine capped at its pages, all of them taken."""
    path = tmp_path / "full.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
    store = SqliteStore(path, headroom=2)
    await store.fill()
    engine = create_engine(f"sqlite:///{path}")
    limit_pages(engine, store.pages)
    yield engine, store
    await engine.dispose()


async def test_sqlites_full_database_is_a_full_store(
    capped: tuple[AsyncEngine, SqliteStore],
) -> None:
    engine, store = capped
    failure = await error_of(engine, "INSERT INTO notes VALUES (:body)", body=BIG_TEXT * 2 + SECRET)
    refusal = refusal_of(failure)
    assert isinstance(refusal, StoreFull)
    assert str(refusal) == "database or disk is full"  # the driver's words, not the values
    with closing(sqlite3.connect(store.path)) as conn:  # the standard library's own error
        conn.execute(f"PRAGMA max_page_count={store.pages}")
        with pytest.raises(sqlite3.OperationalError) as raw:
            conn.execute("INSERT INTO notes VALUES (?)", (BIG_TEXT * 2,))
    assert isinstance(refusal_of(raw.value), StoreFull)


@pytest.fixture
async def postgresql(postgres_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(postgres_url)
    yield engine
    await engine.dispose()


@pytest.mark.parametrize(
    ("code", "refusal"),
    [
        ("disk_full", StoreFull),
        ("insufficient_resources", StoreFull),
        ("out_of_memory", StoreFull),
        ("configuration_limit_exceeded", StoreFull),
        ("too_many_connections", StoreUnreachable),
        ("unique_violation", type(None)),
        ("raise_exception", type(None)),
    ],
)
async def test_postgresqls_insufficient_resources_are_a_full_store(
    postgresql: AsyncEngine, code: str, refusal: type
) -> None:
    """Class 53 but too many connections (about connections, not room); another class is no
    refusal at all. The server raises each of them, through SQLAlchemy and through asyncpg."""
    raise_it = f"DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '{code}'; END $$"
    assert isinstance(refusal_of(await error_of(postgresql, raise_it)), refusal)
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        with pytest.raises(asyncpg.PostgresError) as raw:
            await conn.execute(raise_it)
    finally:
        await conn.close()
    assert isinstance(refusal_of(raw.value), refusal)


def test_no_space_left_on_a_device_is_a_full_store() -> None:
    if not Path("/dev/full").exists():
        service_missing("/dev/full", FileNotFoundError("/dev/full"))
    with pytest.raises(OSError) as raw, open("/dev/full", "wb", buffering=0) as device:
        device.write(b"x")
    assert raw.value.errno == errno.ENOSPC
    assert isinstance(refusal_of(raw.value), StoreFull)
    assert isinstance(refusal_of(OSError(errno.EDQUOT, "Disk quota exceeded")), StoreFull)


async def test_a_store_that_cannot_be_reached_is_unreachable(tmp_path: Path) -> None:
    before = driver_threads()
    sqlite = create_engine(f"sqlite:///{tmp_path / 'missing' / 'relay.db'}")
    postgres = create_engine(f"postgresql://postgres:{SECRET}@127.0.0.1:{free_port()}/test")
    try:
        for engine in (sqlite, postgres):
            refusal = refusal_of(await error_of(engine, "SELECT 1"))
            assert isinstance(refusal, StoreUnreachable)
            assert SECRET not in str(refusal)
    finally:
        await sqlite.dispose()
        await postgres.dispose()
        await drivers_ended(before)
    assert isinstance(refusal_of(TimeoutError()), StoreUnreachable)


async def test_a_fault_of_the_write_itself_is_no_refusal(sqlite_engine: AsyncEngine) -> None:
    twice = "INSERT INTO relay_instance_settings (key, value) VALUES ('a', 'b')"
    async with sqlite_engine.begin() as conn:
        await conn.execute(text(twice))
    assert refusal_of(await error_of(sqlite_engine, twice)) is None  # a unique constraint
    assert refusal_of(ValueError("a bug")) is None
    assert refusal_of(StoreUnavailable("the event writer is not running")) is None


# --- the state of a process's writes -----------------------------------------------------------


class Seconds:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "receivers.store.writable"
    ]


def test_refused_writes_are_one_warning_and_the_next_success_one_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Seconds()
    writable = StoreWritable("callbacks", clock=clock)
    caplog.set_level(logging.INFO, logger="receivers.store.writable")
    writable.succeeded()  # nothing was refused: nothing to say
    for _ in range(100):
        assert writable.failed(StoreFull("database or disk is full"))
    assert writable.full and isinstance(writable.refusal, StoreFull)
    clock.now += 12.5
    writable.succeeded()
    writable.succeeded()

    assert lines(caplog) == [
        ("WARNING", "the store refuses callbacks: it is full (database or disk is full)"),
        ("INFO", "the store takes callbacks again after 12.5 s"),
    ]
    assert writable.refusal is None and not writable.full


def test_a_change_of_refusal_is_a_line_of_its_own(caplog: pytest.LogCaptureFixture) -> None:
    writable = StoreWritable("the relay's writes", clock=Seconds())
    caplog.set_level(logging.INFO, logger="receivers.store.writable")
    writable.failed(OSError(errno.ENOSPC, "No space left on device"))
    writable.failed(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    writable.failed(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    assert [level for level, _ in lines(caplog)] == ["WARNING", "WARNING"]
    assert lines(caplog)[1][1] == (
        "the store refuses the relay's writes: it is unavailable ([Errno 111] Connection refused)"
    )
    assert not writable.full


def test_other_errors_are_left_to_their_caller(caplog: pytest.LogCaptureFixture) -> None:
    writable = StoreWritable()
    caplog.set_level(logging.INFO, logger="receivers.store.writable")
    assert not writable.failed(ValueError("a bug"))
    assert not writable.failed(StoreUnavailable("an item the writer process cannot take"))
    assert writable.refusal is None and lines(caplog) == []


def test_only_a_new_event_in_a_group_ends_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    """A duplicate (counted on its stored row) or a quarantined body may fit in a full store
    where a new event does not."""
    writable = StoreWritable("callbacks")
    caplog.set_level(logging.INFO, logger="receivers.store.writable")
    writable.wrote([Receipt("a", False), StoreUnavailable("a row at fault")])
    assert writable.refusal is None
    writable.wrote([StoreFull("full"), StoreFull("full")])
    writable.wrote([Receipt("a", True), None, StoreFull("full")])
    assert writable.full
    writable.wrote([StoreFull("full"), Receipt("b", False)])
    assert writable.refusal is None
    assert [level for level, _ in lines(caplog)] == ["WARNING", "INFO"]


@pytest.mark.parametrize(
    "answer",
    [StoreFull("database or disk is full"), StoreUnreachable("unable to open database file")],
)
def test_a_refusal_crosses_the_writer_process_wire_as_it_is(answer: StoreUnavailable) -> None:
    crossed = _unwire(_wire(answer))
    assert type(crossed) is type(answer) and str(crossed) == str(answer)
    other = _unwire(_wire(StoreUnavailable("OperationalError")))
    assert type(other) is StoreUnavailable and str(other) == "OperationalError"


# --- the event writer and the probe ------------------------------------------------------------

LANES = [("sqlite", False), ("sqlite", True), ("postgresql", False)]


@pytest.fixture(params=LANES, ids=["sqlite-in-process", "sqlite-writer-process", "postgresql"])
def lane(request: pytest.FixtureRequest) -> tuple[str, bool]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def backend(lane: tuple[str, bool]) -> str:
    """(Overrides conftest's: the lane decides the backend.)"""
    return lane[0]


@pytest.fixture
async def full_store(
    engine: AsyncEngine, backend: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FillableStore]:
    if backend == "postgresql":
        store = PostgresStore(engine)
        await store.install()
        yield store
        await store.remove()
        return
    capped_store = SqliteStore(Path(str(engine.url.database)))
    limit_pages(engine, capped_store.pages)
    await engine.dispose()
    environment = page_limit_environment(capped_store.pages)
    for name in ("PYTHONPATH", "TEST_SQLITE_MAX_PAGE_COUNT"):
        monkeypatch.setenv(name, environment[name])
    yield capped_store


def big(key: str) -> object:
    """An event whose row needs a page of its own."""
    return arrival(key, raw_body=BIG_TEXT.encode(), payload={"requestId": key, "text": BIG_TEXT})


async def test_the_event_writer_fails_each_callback_of_a_full_store_and_notes_it_once(
    engine: AsyncEngine,
    lane: tuple[str, bool],
    full_store: FillableStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    writer = EventWriter(engine, clock=lambda: NOW, writer_process=lane[1])
    await writer.start()
    try:
        first = await writer.store(big("first"))  # type: ignore[arg-type]
        await full_store.fill()
        answers = await asyncio.gather(
            *(writer.store(big(f"k{index}")) for index in range(30)),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert all(isinstance(answer, StoreFull) for answer in answers), answers
        assert writer.writable.full

        await full_store.make_room()
        again = await writer.store(big("k0"))  # type: ignore[arg-type]
        assert writer.writable.refusal is None
    finally:
        await writer.stop()
    assert [level for level, _ in lines(caplog)] == ["WARNING", "INFO"]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    rows = await stored_events(engine)
    assert {key: row["id"] for key, row in rows.items()} == {
        "first": first.event_id,
        "k0": again.event_id,
    }


@pytest.mark.parametrize("lane", [LANES[0], LANES[2]], ids=["sqlite", "postgresql"], indirect=True)
async def test_the_probe_needs_room_as_a_callback_does_and_keeps_nothing(
    engine: AsyncEngine, full_store: FillableStore
) -> None:
    await probe_write(engine, NOW)
    await full_store.fill()
    with pytest.raises(Exception) as refused:
        await probe_write(engine, NOW)
    assert isinstance(refusal_of(refused.value), StoreFull)
    await full_store.make_room()
    await probe_write(engine, NOW)
    assert await stored_events(engine) == {}


async def test_probes_wanted_at_once_are_one_probe_and_its_outcome_is_noted(
    sqlite_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    inserts: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.startswith("INSERT INTO received_events"):
            inserts.append(statement)

    event.listen(sqlite_engine.sync_engine, "before_cursor_execute", count)
    writable = StoreWritable("callbacks")
    caplog.set_level(logging.INFO, logger="receivers.store.writable")
    writable.failed(StoreFull("database or disk is full"))
    probe = WriteProbe(sqlite_engine, writable, lambda: NOW)
    await asyncio.gather(*(probe() for _ in range(10)))
    assert len(inserts) == 1
    assert writable.refusal is None
    assert [level for level, _ in lines(caplog)] == ["WARNING", "INFO"]
    await probe()
    assert len(inserts) == 2  # a probe asked for after the last one ended is a new one
