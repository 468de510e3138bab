"""Async engine construction: URL normalisation and SQLite durability pragmas."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}
CONNECT_TIMEOUT_SECONDS = 5


def async_database_url(url: str) -> str:
    """``sqlite:///x.db`` -> ``sqlite+aiosqlite:///x.db``; ``postgresql://`` -> asyncpg."""
    parsed = make_url(url)
    driver = ASYNC_DRIVERS.get(parsed.drivername)
    if driver is None and parsed.drivername == "postgres":
        driver = ASYNC_DRIVERS["postgresql"]
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    return parsed.render_as_string(hide_password=False)


def create_engine(url: str, **options: Any) -> AsyncEngine:
    """An async engine; SQLite runs in WAL mode with ``synchronous=FULL`` so that an
    acknowledged event survives a crash or a power loss."""
    full_url = async_database_url(url)
    backend = make_url(full_url).get_backend_name()
    if backend == "sqlite":
        options.setdefault("connect_args", {"timeout": CONNECT_TIMEOUT_SECONDS})
        engine = create_async_engine(full_url, **options)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    if backend == "postgresql":
        options.setdefault("connect_args", {"timeout": CONNECT_TIMEOUT_SECONDS})
        options.setdefault("pool_pre_ping", True)
        options.setdefault("pool_size", 10)
    return create_async_engine(full_url, **options)


def sqlite_connection(database: str, **options: Any) -> sqlite3.Connection:
    """A plain ``sqlite3`` connection in autocommit mode (transactions are begun explicitly)
    with the engine's pragmas: WAL, ``synchronous=FULL``, the busy timeout."""
    conn = sqlite3.connect(
        database, timeout=CONNECT_TIMEOUT_SECONDS, isolation_level=None, **options
    )
    _sqlite_pragmas(conn, None)
    return conn


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute(f"PRAGMA busy_timeout={CONNECT_TIMEOUT_SECONDS * 1000}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
