"""Batches into a SQLite file, one transaction each, on a connection of their own.

Used by the event writer's own process (:mod:`receivers.store.writer_process`), so it needs
nothing beyond the standard library and pydantic-core. The values are written as SQLAlchemy
would write them (UTC datetimes as naive text, JSON as text), so that the app reads them back
through its tables alike.

The usual batch (new events, no rejections) is one multi-row insert in autocommit mode: its own
transaction, one call into SQLite where BEGIN, INSERT and COMMIT take three. When any of its rows
conflicts, that statement fails as a whole with nothing written, and the batch is written the
general way: BEGIN, one multi-row insert per chunk without RETURNING (its row count says whether
any were stored already), the copies counted on the stored rows, the rejections upserted by body
hash, COMMIT. Commits leave WAL checkpoints to a :class:`WalCheckpointer` (only past
:data:`BACKSTOP_PAGES` does a commit checkpoint itself)."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

from receivers.store.records import IDENTITY_COLUMNS, Identity, Row, identity
from receivers.store.rows import BatchRows
from receivers.store.sqlite_files import sqlite_connection
from receivers.store.wal_checkpoints import BACKSTOP_PAGES, WalCheckpointer

SQLITE_MAX_PARAMETERS = 32766  # SQLite's default host-parameter limit (3.32+)
STATEMENT_CACHE_SIZE = 1024  # multi-row inserts: one statement per batch size, two variants
EVENTS_TABLE = "received_events"
EVENT_COLUMNS = (
    "id",
    "source",
    "kind",
    "dedup_key",
    "received_at",
    "payload",
    "raw_body",
    "content_type",
    "method",
    "remote_addr",
    "duplicates",
)
REJECTED_TABLE = "rejected_bodies"
REJECTED_COLUMNS = (
    "id",
    "source",
    "path",
    "kind",
    "status",
    "reason",
    "errors",
    "body_hash",
    "raw_body",
    "content_type",
    "remote_addr",
    "received_at",
    "last_seen_at",
    "count",
)
EVENTS_PER_STATEMENT = SQLITE_MAX_PARAMETERS // len(EVENT_COLUMNS)


class SqliteBatchWriter:
    """Writes batches of rows into one SQLite file; see the module docstring. Not thread-safe:
    one thread uses it. It connects on the first write, and again after a failed one."""

    def __init__(self, database: str, checkpoints: WalCheckpointer | None = None) -> None:
        self._database = database
        self._connection: sqlite3.Connection | None = None
        self._checkpoints = checkpoints or WalCheckpointer(database)

    def write(self, rows: BatchRows) -> dict[Identity, str]:
        """Insert the event rows unless stored already, add ``duplicates + 1`` to the stored row
        of those that were, upsert the quarantine rows; answers every identity's stored id."""
        events, rejections = rows.events, rows.rejections
        if not events and not rejections:
            return {}
        conn = self.connect()
        try:
            if not rejections and self._insert_alone(conn, events):
                ids = {identity(row): row["id"] for row in events}
            else:
                conn.execute("BEGIN")
                ids = self._insert_events(conn, events)
                if rejections:
                    conn.executemany(_UPSERT_REJECTED, [_rejected_values(r) for r in rejections])
                conn.commit()
        except BaseException as exc:
            if isinstance(exc, sqlite3.OperationalError):
                self._disconnect()  # rolls back; the next batch starts afresh
            elif conn.in_transaction:
                conn.rollback()
            raise
        self._checkpoints.committed()
        return ids

    def connect(self) -> sqlite3.Connection:
        """The writer's connection (opened now if need be)."""
        if self._connection is None:
            conn = sqlite_connection(self._database, cached_statements=STATEMENT_CACHE_SIZE)
            conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
            self._connection = conn
        return self._connection

    def close(self) -> None:
        """Close the connection and the checkpointer (after its running checkpoint)."""
        self._disconnect()
        self._checkpoints.close()

    def _insert_alone(self, conn: sqlite3.Connection, events: list[Row]) -> bool:
        """Insert the events in one autocommitted statement; False, with nothing written, when
        there are none, too many for one statement, or any of them conflicts."""
        if not events or len(events) > EVENTS_PER_STATEMENT:
            return False
        try:
            conn.execute(
                insert_sql(EVENTS_TABLE, EVENT_COLUMNS, (), len(events)), _event_values(events)
            )
        except sqlite3.IntegrityError:
            return False
        return True

    def _insert_events(self, conn: sqlite3.Connection, events: list[Row]) -> dict[Identity, str]:
        ids = {identity(row): row["id"] for row in events}
        inserted = 0
        for start in range(0, len(events), EVENTS_PER_STATEMENT):
            part = events[start : start + EVENTS_PER_STATEMENT]
            sql = insert_sql(EVENTS_TABLE, EVENT_COLUMNS, IDENTITY_COLUMNS, len(part))
            inserted += conn.execute(sql, _event_values(part)).rowcount
        if inserted < len(events):
            for row in events:
                found = conn.execute(_FIND_EVENT, identity(row)).fetchone()
                if found is None:
                    raise RuntimeError("a conflicting event vanished")
                if found[0] != row["id"]:
                    ids[identity(row)] = found[0]
                    conn.execute(_COUNT_COPIES, (row["duplicates"] + 1, found[0]))
        return ids

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


@functools.lru_cache(maxsize=1024)
def insert_sql(table: str, columns: tuple[str, ...], conflict: tuple[str, ...], count: int) -> str:
    """``INSERT ... VALUES (...), (...) ON CONFLICT (...) DO NOTHING`` for ``count`` rows; with
    no ``conflict`` columns, a plain insert (which fails as a whole on any conflict)."""
    values = "(" + ", ".join("?" * len(columns)) + ")"
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([values] * count)}"
    return f"{sql} ON CONFLICT ({', '.join(conflict)}) DO NOTHING" if conflict else sql


def json_text(value: Any) -> str:
    """A JSON column's text: pydantic-core's encoder (a few times faster than ``json.dumps``,
    compact, UTF-8, NaN and Infinity as ``json.dumps`` writes them), or ``json.dumps`` for what
    it cannot encode (lone surrogates). Both read back as the same value."""
    try:
        return to_json(value).decode()
    except PydanticSerializationError:
        return json.dumps(value)


def sqlite_datetime(value: datetime) -> str:
    """A UTC datetime column's text on SQLite, as SQLAlchemy writes it (naive, microseconds)."""
    if value.tzinfo is None:
        raise ValueError("naive datetime given to a UTC column")
    utc = value.astimezone(UTC)
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d} "
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}.{utc.microsecond:06d}"
    )


def _event_values(rows: Sequence[Row]) -> list[Any]:
    """The flat parameters of a multi-row insert of event rows (one timestamp per batch)."""
    flat: list[Any] = []
    received: tuple[datetime, str] | None = None
    for row in rows:
        at = row["received_at"]
        if received is None or received[0] is not at:
            received = (at, sqlite_datetime(at))
        flat += (
            row["id"],
            row["source"],
            row["kind"],
            row["dedup_key"],
            received[1],
            json_text(row["payload"]),
            row["raw_body"],
            row["content_type"],
            row["method"],
            row["remote_addr"],
            row["duplicates"],
        )
    return flat


def _rejected_values(row: Row) -> tuple[Any, ...]:
    return tuple(
        json_text(row[name])
        if name == "errors"
        else sqlite_datetime(row[name])
        if name in ("received_at", "last_seen_at")
        else row[name]
        for name in REJECTED_COLUMNS
    )


_FIND_EVENT = f"SELECT id FROM {EVENTS_TABLE} WHERE " + " AND ".join(
    f"{name} = ?" for name in IDENTITY_COLUMNS
)
_COUNT_COPIES = f"UPDATE {EVENTS_TABLE} SET duplicates = duplicates + ? WHERE id = ?"
_UPSERT_REJECTED = (
    f"INSERT INTO {REJECTED_TABLE} ({', '.join(REJECTED_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(REJECTED_COLUMNS))}) ON CONFLICT (body_hash) DO UPDATE SET "
    "count = count + excluded.count, last_seen_at = excluded.last_seen_at"
)
