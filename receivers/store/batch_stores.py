"""How a batch reaches the database: the writer's own SQLite lane, or the SQLAlchemy engine."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import bindparam, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from receivers.store.engine import sqlite_connection
from receivers.store.records import IDENTITY_COLUMNS, Identity, Row, StoreUnavailable, identity
from receivers.store.sqlite_rows import SQLITE_MAX_PARAMETERS, driver_values, insert_sql
from receivers.store.tables import ReceivedEvent, RejectedBody
from receivers.store.wal_checkpoints import BACKSTOP_PAGES, WalCheckpointer

EVENTS = ReceivedEvent.__table__
BatchRows = tuple[list[Row], list[Row]]
"""A batch's event rows (one per identity) and quarantine rows."""
STATEMENT_CACHE_SIZE = 1024  # multi-row inserts: one statement per batch size, two variants
REJECTED = RejectedBody.__table__


class BatchStore(Protocol):
    """Writes batches, each in one transaction."""

    slots: int
    """How many batches may be handed over before the first one is written (each takes its
    events only when its write starts)."""

    def write(self, build: Callable[[], BatchRows]) -> Awaitable[dict[Identity, str]]:
        """Write the batch that ``build`` gives, calling it only when the write starts (so that a
        batch waiting for its turn takes what arrived meanwhile): insert the event rows unless
        stored already, add ``duplicates + 1`` to the stored row of those that were, upsert the
        quarantine rows by body hash. Answers every identity's stored id."""
        ...

    async def close(self) -> None:
        """Release what the store holds."""
        ...


def batch_store(engine: AsyncEngine) -> BatchStore:
    """The writer's own lane for a SQLite file; the engine for any other database."""
    url = engine.url
    database = url.database
    if url.get_backend_name() == "sqlite" and database and database != ":memory:" and not url.query:
        return SqliteLane(database, engine.dialect)
    return SqlAlchemyStore(engine)


class SqlAlchemyStore:
    """One transaction per batch on the engine, with statements built once."""

    slots = 1

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    def write(self, build: Callable[[], BatchRows]) -> Awaitable[dict[Identity, str]]:
        return self._write(build)

    async def close(self) -> None:
        return None

    async def _write(self, build: Callable[[], BatchRows]) -> dict[Identity, str]:
        events, rejections = build()
        ids: dict[Identity, str] = {}
        if not events and not rejections:
            return ids
        async with self._engine.begin() as conn:
            statements = _statements(conn.dialect.name)
            if events:
                inserted = set((await conn.execute(statements.insert_events, events)).scalars())
                copies: dict[Identity, int] = {}
                for row in events:
                    if row["id"] in inserted:
                        ids[identity(row)] = row["id"]
                    else:
                        copies[identity(row)] = row["duplicates"] + 1
                if copies:
                    ids |= await _count_copies(conn, statements, copies)
            if rejections:
                await conn.execute(statements.upsert_rejected, rejections)
        return ids


@dataclass(frozen=True)
class _Statements:
    """One backend's statements, built once so that SQLAlchemy compiles each of them once."""

    insert_events: Any
    find_events: Any
    count_copies: Any
    upsert_rejected: Any


@functools.cache
def _statements(backend: str) -> _Statements:
    dml = {"postgresql": postgresql, "sqlite": sqlite}.get(backend)
    if dml is None:
        raise StoreUnavailable(f"unsupported database backend {backend!r}")
    identity_columns = [EVENTS.c[name] for name in IDENTITY_COLUMNS]
    identity = tuple_(*identity_columns)
    rejected = dml.insert(REJECTED)
    return _Statements(
        insert_events=dml.insert(EVENTS)
        .on_conflict_do_nothing(index_elements=IDENTITY_COLUMNS)
        .returning(EVENTS.c.id),
        find_events=select(EVENTS.c.id, *identity_columns).where(
            identity.in_(bindparam("identities", expanding=True))
        ),
        count_copies=update(EVENTS)
        .where(EVENTS.c.id == bindparam("event_id"))
        .values(duplicates=EVENTS.c.duplicates + bindparam("extra")),
        upsert_rejected=rejected.on_conflict_do_update(
            index_elements=["body_hash"],
            set_={
                "count": REJECTED.c.count + rejected.excluded.count,
                "last_seen_at": rejected.excluded.last_seen_at,
            },
        ),
    )


async def _count_copies(
    conn: AsyncConnection, statements: _Statements, counts: dict[Identity, int]
) -> dict[Identity, str]:
    """Add the copies to the stored rows (inserted earlier or by another process); their ids."""
    query = statements.find_events.params(identities=list(counts))
    ids = {(r[1], r[2], r[3]): r[0] for r in await conn.execute(query)}
    missing = set(counts) - set(ids)
    if missing:
        raise RuntimeError(f"{len(missing)} conflicting events vanished")
    await conn.execute(
        statements.count_copies,
        [{"event_id": ids[identity], "extra": n} for identity, n in counts.items()],
    )
    return ids


class SqliteLane:
    """The writer's own SQLite connection (with the engine's pragmas: WAL, synchronous=FULL),
    used from a thread of its own, one batch after the other.

    A batch costs that thread as few calls into SQLite as possible, since every call gives up the
    GIL and then has to wait for it while the event loop is busy. The usual batch (new events,
    no rejections) is one multi-row insert in autocommit mode: its own transaction, one call
    where BEGIN, INSERT and COMMIT take three. When any of its rows conflicts, that statement
    fails as a whole with nothing written, and the batch is written the general way: BEGIN, one
    multi-row insert without RETURNING (its row count says whether any were stored already),
    the copies counted, the rejections upserted, COMMIT.

    Two slots: while one batch is written, the next waits in the thread's queue, and is built
    there when its turn comes, from every event that arrived in the meantime.

    Commits leave the WAL checkpoints to a :class:`WalCheckpointer` (only past
    :data:`BACKSTOP_PAGES` does a commit checkpoint itself)."""

    slots = 2

    def __init__(
        self, database: str, dialect: Dialect, checkpoints: WalCheckpointer | None = None
    ) -> None:
        self._database = database
        self._event_values = driver_values(EVENTS, EVENTS.c.keys(), dialect)
        self._rejected_values = driver_values(REJECTED, REJECTED.c.keys(), dialect)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-writer")
        self._connection: sqlite3.Connection | None = None
        self._checkpoints = checkpoints or WalCheckpointer(database)

    def write(self, build: Callable[[], BatchRows]) -> Awaitable[dict[Identity, str]]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._thread, self._write, build)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._release)
        self._thread.shutdown()

    def _write(self, build: Callable[[], BatchRows]) -> dict[Identity, str]:
        events, rejections = build()
        if not events and not rejections:
            return {}
        conn = self._connect()
        try:
            if not rejections and self._insert_alone(conn, events):
                ids = {identity(row): row["id"] for row in events}
            else:
                conn.execute("BEGIN")
                ids = self._insert_events(conn, events)
                if rejections:
                    values = [self._rejected_values([row]) for row in rejections]
                    conn.executemany(_UPSERT_REJECTED, values)
                conn.commit()
        except BaseException as exc:
            if isinstance(exc, sqlite3.OperationalError):
                self._disconnect()  # rolls back; the next batch starts afresh
            elif conn.in_transaction:
                conn.rollback()
            raise
        self._checkpoints.committed()
        return ids

    def _insert_alone(self, conn: sqlite3.Connection, events: list[Row]) -> bool:
        """Insert the events in one autocommitted statement; False, with nothing written, when
        there are none, too many for one statement, or any of them conflicts."""
        if not events or len(events) > _EVENTS_PER_STATEMENT:
            return False
        try:
            conn.execute(
                insert_sql(EVENTS.name, _COLUMNS, (), len(events)), self._event_values(events)
            )
        except sqlite3.IntegrityError:
            return False
        return True

    def _insert_events(self, conn: sqlite3.Connection, events: list[Row]) -> dict[Identity, str]:
        ids = {identity(row): row["id"] for row in events}
        columns, chunk = _COLUMNS, _EVENTS_PER_STATEMENT
        inserted = 0
        for start in range(0, len(events), chunk):
            part = events[start : start + chunk]
            sql = insert_sql(EVENTS.name, columns, IDENTITY_COLUMNS, len(part))
            inserted += conn.execute(sql, self._event_values(part)).rowcount
        if inserted < len(events):
            for row in events:
                found = conn.execute(_FIND_EVENT, identity(row)).fetchone()
                if found is None:
                    raise RuntimeError("a conflicting event vanished")
                if found[0] != row["id"]:
                    ids[identity(row)] = found[0]
                    conn.execute(_COUNT_COPIES, (row["duplicates"] + 1, found[0]))
        return ids

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            conn = sqlite_connection(self._database, cached_statements=STATEMENT_CACHE_SIZE)
            conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
            self._connection = conn
        return self._connection

    def _release(self) -> None:
        self._disconnect()
        self._checkpoints.close()

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


_COLUMNS = tuple(EVENTS.c.keys())
_EVENTS_PER_STATEMENT = SQLITE_MAX_PARAMETERS // len(_COLUMNS)
_FIND_EVENT = f"SELECT id FROM {EVENTS.name} WHERE " + " AND ".join(
    f"{name} = ?" for name in IDENTITY_COLUMNS
)
_COUNT_COPIES = f"UPDATE {EVENTS.name} SET duplicates = duplicates + ? WHERE id = ?"
_UPSERT_REJECTED = (
    f"INSERT INTO {REJECTED.name} ({', '.join(REJECTED.c.keys())}) "
    f"VALUES ({', '.join('?' * len(REJECTED.c))}) ON CONFLICT (body_hash) DO UPDATE SET "
    "count = count + excluded.count, last_seen_at = excluded.last_seen_at"
)
