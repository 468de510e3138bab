"""Async engine construction: URL normalisation, SQLite durability pragmas, the JSON encoder."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from pydantic_core import PydanticSerializationError, to_json
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}
CONNECT_TIMEOUT_SECONDS = 5
"""How long a connection waits for a lock (and PostgreSQL for a connection) before failing."""


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
    options.setdefault("json_serializer", json_text)
    # a statement's parameters (events' personal data, generated secrets) stay out of its
    # errors' text, which tracebacks, logs and stored attempt errors print
    options.setdefault("hide_parameters", True)
    options.setdefault("connect_args", {"timeout": CONNECT_TIMEOUT_SECONDS})
    if backend == "postgresql":
        options.setdefault("pool_pre_ping", True)
        options.setdefault("pool_size", 10)
    engine = create_async_engine(full_url, **options)
    if backend == "sqlite":
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
    return engine


def sqlite_file(engine: AsyncEngine) -> str | None:
    """The path of the engine's SQLite file; None for any other database (or an in-memory or
    URI-configured SQLite, which only the engine itself can open alike)."""
    url = engine.url
    database = url.database
    if url.get_backend_name() == "sqlite" and database and database != ":memory:" and not url.query:
        return database
    return None


def json_text(value: Any) -> str:
    """A JSON column's text: pydantic-core's encoder (a few times faster than ``json.dumps``,
    compact, UTF-8, NaN and Infinity as ``json.dumps`` writes them), or ``json.dumps`` for what
    it cannot encode (lone surrogates). Both read back as the same value."""
    try:
        return to_json(value).decode()
    except PydanticSerializationError:
        return json.dumps(value)


def sqlite_pragmas(dbapi_connection: Any, _record: Any = None) -> None:
    """WAL, ``synchronous=FULL`` (an acknowledged event survives a crash or a power loss), the
    busy timeout and foreign keys, on every connection to SQLite."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(CONNECT_TIMEOUT_SECONDS * 1000)}")
    _wal_mode(cursor)
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


WAL_RETRY_SECONDS = 0.02


def _wal_mode(cursor: Any) -> None:
    """``journal_mode=WAL``, tried again for up to the connect timeout while SQLite says the
    database is locked: on a new file another process may be switching it or writing its first
    transaction, which SQLite reports at once, without its busy handler."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_SECONDS
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_SECONDS)
