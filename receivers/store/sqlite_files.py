"""Plain ``sqlite3`` connections to a store file, with the pragmas every connection gets."""

from __future__ import annotations

import sqlite3
from typing import Any

CONNECT_TIMEOUT_SECONDS = 5
"""How long a connection waits for a lock (and PostgreSQL for a connection) before failing."""


def apply_pragmas(dbapi_connection: Any) -> None:
    """WAL, ``synchronous=FULL`` (an acknowledged event survives a crash or a power loss), the
    busy timeout and foreign keys, on any DB-API connection to SQLite."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute(f"PRAGMA busy_timeout={CONNECT_TIMEOUT_SECONDS * 1000}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def sqlite_connection(database: str, **options: Any) -> sqlite3.Connection:
    """A ``sqlite3`` connection in autocommit mode (transactions are begun explicitly) with the
    pragmas of :func:`apply_pragmas`."""
    conn = sqlite3.connect(
        database, timeout=CONNECT_TIMEOUT_SECONDS, isolation_level=None, **options
    )
    apply_pragmas(conn)
    return conn
