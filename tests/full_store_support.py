"""A store that fills up as on a full disk, without root, on SQLite and on PostgreSQL.

SQLite: ``PRAGMA max_page_count`` caps every connection of the processes under test (SQLite
keeps that limit per connection): in this process through an engine's connect event
(:func:`limit_pages`), in the processes a test starts (the event writer's, ``relay serve``)
through the ``sitecustomize`` module of :data:`PAGE_LIMIT_PATH`
(:func:`page_limit_environment`). :meth:`SqliteStore.fill` fills the file up to that cap with
rows of a table of the test's own, so that the next write that needs a page fails with SQLite's
"database or disk is full", as on a full disk; :meth:`SqliteStore.make_room` deletes them (the
file keeps its size, and SQLite reuses their pages). A write that fits in the free space of a
page it has already still succeeds, as it would on a full disk: the tests write callbacks of a
few KiB, which always need a page.

PostgreSQL: a trigger on the store's tables raises ``disk_full`` (SQLSTATE 53100) on every
INSERT and UPDATE while :meth:`PostgresStore.fill` has set its flag: an error of the server
itself, through the real driver, as a full disk gives it.

A filesystem image or a tmpfs of a given size would need root to mount.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parent.parent
PAGE_LIMIT_PATH = Path(__file__).resolve().parent / "page_limit"
PAGE_LIMIT_VARIABLE = "TEST_SQLITE_MAX_PAGE_COUNT"
HEADROOM_PAGES = 256
"""Pages the store may still grow by once a test has capped it (1 MiB): room for the events
the test stores before it fills the rest."""
FILLER = "test_filler"
SQLITE_FULL = 13
FULL_TABLES = (
    "received_events",
    "rejected_bodies",
    "routed_events",
    "deliveries",
    "delivery_attempts",
    "destination_states",
)
BIG_TEXT = "x" * 3000
"""A callback's text that makes its stored row need a page of its own."""


class FillableStore(Protocol):
    """A store a test can fill up and make room in again."""

    async def fill(self) -> None: ...

    async def make_room(self) -> None: ...


class SqliteStore:
    """The SQLite file at ``path`` (migrated), capped at :attr:`pages`: its size now plus
    ``headroom`` pages. Cap every connection to it with :func:`limit_pages` and
    :func:`page_limit_environment` before it is opened."""

    def __init__(self, path: Path, headroom: int = HEADROOM_PAGES) -> None:
        self.path = path
        with closing(sqlite3.connect(path)) as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {FILLER} (b BLOB)")
            conn.commit()
            self.pages = int(conn.execute("PRAGMA page_count").fetchone()[0]) + headroom

    async def fill(self) -> None:
        """Take every page left under the cap (and the room left in the filler's own)."""
        await asyncio.to_thread(self._fill)

    async def make_room(self) -> None:
        """Delete what :meth:`fill` wrote: its pages are free for the store again."""
        await asyncio.to_thread(self._execute, f"DELETE FROM {FILLER}")

    def _fill(self) -> None:
        with closing(self._connect()) as conn:
            for size in (4000, 1000, 100, 10):
                while True:
                    try:
                        conn.execute(f"INSERT INTO {FILLER} VALUES (zeroblob(?))", (size,))
                    except sqlite3.OperationalError as exc:
                        if exc.sqlite_errorcode != SQLITE_FULL:
                            raise
                        break

    def _execute(self, sql: str) -> None:
        with closing(self._connect()) as conn:
            conn.execute(sql)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA synchronous=OFF")  # the filler's rows need no durability
        conn.execute(f"PRAGMA max_page_count={self.pages}")
        return conn


def limit_pages(engine: AsyncEngine, pages: int) -> None:
    """Cap every connection ``engine`` opens from now on at ``pages`` pages."""

    def limit(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA max_page_count={int(pages)}")
        cursor.close()

    event.listen(engine.sync_engine, "connect", limit)


def page_limit_environment(pages: int, environment: dict[str, str] | None = None) -> dict[str, str]:
    """``environment`` (this process's by default) for a process whose SQLite connections are
    capped at ``pages`` pages: the cap, and the ``sitecustomize`` that applies it first on the
    path (then the project's root, so that the process runs this code)."""
    env = dict(os.environ if environment is None else environment)
    path = [str(PAGE_LIMIT_PATH), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, path))
    env[PAGE_LIMIT_VARIABLE] = str(pages)
    return env


class PostgresStore:
    """A PostgreSQL store whose writes fail with ``disk_full`` while it is filled; call
    :meth:`install` first and :meth:`remove` at the end."""

    def __init__(self, engine: AsyncEngine, tables: tuple[str, ...] = FULL_TABLES) -> None:
        self.engine = engine
        self.tables = tables

    async def install(self) -> None:
        statements = [
            "CREATE TABLE IF NOT EXISTS test_store_full (is_full boolean NOT NULL)",
            "DELETE FROM test_store_full",
            "INSERT INTO test_store_full VALUES (false)",
            """CREATE OR REPLACE FUNCTION test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT is_full FROM test_store_full) THEN
                    RAISE EXCEPTION 'could not extend file: No space left on device'
                        USING ERRCODE = 'disk_full';
                END IF;
                RETURN NULL;
            END $$""",
        ]
        for table in self.tables:
            statements += [
                f"DROP TRIGGER IF EXISTS test_disk_full ON {table}",
                f"CREATE TRIGGER test_disk_full BEFORE INSERT OR UPDATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION test_disk_full()",
            ]
        await self._run(statements)

    async def fill(self) -> None:
        await self._run(["UPDATE test_store_full SET is_full = true"])

    async def make_room(self) -> None:
        await self._run(["UPDATE test_store_full SET is_full = false"])

    async def remove(self) -> None:
        statements = [f"DROP TRIGGER IF EXISTS test_disk_full ON {t}" for t in self.tables]
        await self._run(
            [
                *statements,
                "DROP FUNCTION IF EXISTS test_disk_full()",
                "DROP TABLE IF EXISTS test_store_full",
            ]
        )

    async def _run(self, statements: list[str]) -> None:
        async with self.engine.begin() as conn:
            for statement in statements:
                await conn.execute(text(statement))
