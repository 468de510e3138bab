"""Migrations run one process at a time: a server and a worker started together on a new
database must not both create its tables."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from receivers.store import engine as store_engine
from receivers.store.engine import create_engine
from relay import migrate
from relay.settings import SettingsError
from tests.conftest import PG_ADMIN_DSN, service_missing

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


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
async def new_postgres_url() -> AsyncIterator[str]:
    """An empty PostgreSQL database of this test's own."""
    name = f"relay_migrate_{uuid.uuid4().hex[:12]}"
    try:
        await _admin(f'CREATE DATABASE "{name}"')
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        service_missing("PostgreSQL", exc)
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    yield f"{base}/{name}"
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
    monkeypatch.setattr(migrate, "SQLITE_LOCK_TRIES", 3)
    path = tmp_path / "busy.db"
    holder = _hold_write_lock(path)
    engine = create_engine(f"sqlite:///{path}")
    try:
        with pytest.raises(SettingsError, match=r"write lock stayed taken for 0\.3"):
            await migrate.upgrade(engine)
    finally:
        holder.close()
        await engine.dispose()
    assert await _migrate_together(f"sqlite:///{path}") == [migrate.head_revision()] * TOGETHER
