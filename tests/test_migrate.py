"""Migrations run one process at a time: a server and a worker started together on a new
database must not both create its tables."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlmodel import SQLModel

from receivers.store import engine as store_engine
from receivers.store import tables as receiver_tables  # noqa: F401  (registers every table)
from receivers.store.engine import create_engine
from relay.console import tables as console_tables  # noqa: F401
from relay.console.queries import LISTED_INDEX
from relay.outbox import tables as relay_tables  # noqa: F401
from relay.server.runtime import prepare_database, require_current_schema
from relay.settings import SettingsError
from relay.store import migrate
from tests.conftest import create_postgres_database, drop_postgres_database

TOGETHER = 3


async def _migrate_together(url: str) -> list[str | None]:
    engines = [create_engine(url) for _ in range(TOGETHER)]
    try:
        await asyncio.gather(*(migrate.upgrade(engine) for engine in engines))
        return [await migrate.current_revision(engine) for engine in engines]
    finally:
        for engine in engines:
            await engine.dispose()


async def test_processes_migrating_a_new_sqlite_file_together_take_turns(
    tmp_path: Path,
) -> None:
    for run in range(3):  # each run failed without the lock
        url = f"sqlite:///{tmp_path / f'new-{run}.db'}"
        assert await _migrate_together(url) == [migrate.head_revision()] * TOGETHER


@contextlib.asynccontextmanager
async def _new_postgres_database() -> AsyncIterator[str]:
    name, url = await create_postgres_database("relay_migrate")
    try:
        yield url
    finally:
        await drop_postgres_database(name)


@pytest.fixture
async def new_postgres_url() -> AsyncIterator[str]:
    """An empty PostgreSQL database of this test's own."""
    async with _new_postgres_database() as url:
        yield url


async def test_upgrades_of_a_new_postgresql_database_together_take_turns(
    new_postgres_url: str,
) -> None:
    assert await _migrate_together(new_postgres_url) == [migrate.head_revision()] * TOGETHER


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite waits 0.1 s, not 5 s, for a lock held elsewhere."""
    monkeypatch.setattr(store_engine, "CONNECT_TIMEOUT_SECONDS", 0.1)
    monkeypatch.setattr(migrate, "CONNECT_TIMEOUT_SECONDS", 0.1)


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("BEGIN IMMEDIATE")
    return holder


async def test_a_migration_waits_for_a_write_lock_held_elsewhere(
    tmp_path: Path, short_busy_timeout: None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "busy.db"
    holder = _hold_write_lock(path)
    engine = create_engine(f"sqlite:///{path}")
    try:
        with caplog.at_level(logging.WARNING, logger=migrate.__name__):
            upgrade = asyncio.create_task(migrate.upgrade(engine))
            async with asyncio.timeout(10):
                while "waiting for the database's write lock" not in caplog.text:
                    await asyncio.sleep(0.01)
            assert not upgrade.done()
            holder.rollback()
            await upgrade
        assert await migrate.current_revision(engine) == migrate.head_revision()
        assert caplog.text.count("waiting for the database's write lock") == 1
    finally:
        holder.close()
        await engine.dispose()


async def test_a_migration_that_never_gets_the_write_lock_is_one_line(
    tmp_path: Path, short_busy_timeout: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "busy.db"
    holder = _hold_write_lock(path)
    engine = create_engine(f"sqlite:///{path}")
    try:
        with (
            monkeypatch.context() as three_tries,
            pytest.raises(SettingsError, match=r"write lock stayed taken for 0\.3"),
        ):
            three_tries.setattr(migrate, "SQLITE_LOCK_TRIES", 3)
            await migrate.upgrade(engine)
    finally:
        holder.close()
        await engine.dispose()
    # then, as processes that start together: they take turns (with the usual patience)
    assert await _migrate_together(f"sqlite:///{path}") == [migrate.head_revision()] * TOGETHER


async def test_a_current_database_is_not_locked_to_be_migrated(
    tmp_path: Path, short_busy_timeout: None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "current.db"
    url = f"sqlite:///{path}"
    assert await _migrate_together(url) == [migrate.head_revision()] * TOGETHER
    holder = _hold_write_lock(path)  # a long writer: nothing to migrate, nothing to wait for
    engine = create_engine(url)
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger=migrate.__name__):
            async with asyncio.timeout(10):
                await migrate.upgrade(engine)
        assert "waiting" not in caplog.text
    finally:
        holder.close()
        await engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
async def new_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database of this test's own, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'new.db'}"
        return
    async with _new_postgres_database() as url:
        yield url


async def test_a_revision_this_version_does_not_know_is_one_line(new_database_url: str) -> None:
    assert await _migrate_together(new_database_url) == [migrate.head_revision()] * TOGETHER
    engine = create_engine(new_database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '9f9f_future'"))
        for check in (migrate.upgrade, require_current_schema, prepare_database):
            with pytest.raises(SettingsError, match="revision 9f9f_future, which this version"):
                await check(engine)
    finally:
        await engine.dispose()


async def test_connecting_waits_while_another_process_holds_a_new_file_in_rollback_mode(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rollback.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")  # switching to WAL is refused at once meanwhile
    release = threading.Timer(0.3, holder.commit)
    release.start()
    engine = create_engine(f"sqlite:///{path}")
    try:
        await migrate.upgrade(engine)
        assert await migrate.current_revision(engine) == migrate.head_revision()
    finally:
        release.join()
        holder.close()
        await engine.dispose()


async def test_the_migrations_build_the_schema_the_tables_declare(new_database_url: str) -> None:
    engine = create_engine(new_database_url)
    try:
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            differences = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_type": True}),
                    SQLModel.metadata,
                )
            )
        sqlite = engine.dialect.name == "sqlite"
    finally:
        await engine.dispose()
    declared_elsewhere = {LISTED_INDEX} if sqlite else set()  # SQLite only, not in the tables
    assert [
        difference
        for difference in differences
        if not (difference[0] == "remove_index" and difference[1].name in declared_elsewhere)
    ] == []
