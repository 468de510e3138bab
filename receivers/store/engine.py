"""Async engine construction: URL normalisation and SQLite durability pragmas."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from receivers.store.sqlite_files import CONNECT_TIMEOUT_SECONDS, apply_pragmas

ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}


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


def sqlite_file(engine: AsyncEngine) -> str | None:
    """The path of the engine's SQLite file; None for any other database (or an in-memory or
    URI-configured SQLite, which only the engine itself can open alike)."""
    url = engine.url
    database = url.database
    if url.get_backend_name() == "sqlite" and database and database != ":memory:" and not url.query:
        return database
    return None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    apply_pragmas(dbapi_connection)
