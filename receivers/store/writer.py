"""Group commit: concurrent requests share one transaction, so durable commits stay cheap.

Requests hand their event to :class:`EventWriter` and wait. Events are written in batches, one
transaction and one commit each, and every waiter is woken once its batch is committed. A batch
starts as soon as the store has room for it: an event arriving while nothing is being written is
handed over at once, and what arrives meanwhile groups up behind it. A duplicate (same source,
kind and dedup key) is never inserted twice, also when copies arrive in the same batch or in
another process: the unique constraint decides and the loser is counted on the stored row.

How a batch reaches the database depends on the backend (see :func:`batch_store`):

* a SQLite file: :class:`SqliteLane`, the writer's own connection in a thread of its own. A batch
  is one hand-off to that thread and one multi-row statement, and the next batch may queue
  behind it, so the event loop never waits for the disk;
* any other database: :class:`SqlAlchemyStore`, one transaction per batch on the engine, with
  statements built once (so SQLAlchemy compiles each of them once, not once per batch).

The after-commit hook gets the new events after their callers were woken, in commit order, one
call at a time, beside the writer: with ``hook_batch`` events, or with fewer once the oldest has
waited ``hook_delay`` seconds. Few calls under load (on SQLite each is a write transaction of its
own, competing for the one write lock), prompt ones otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Table, bindparam, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from receivers.ids import new_id
from receivers.store.engine import CONNECT_TIMEOUT_SECONDS, _sqlite_pragmas
from receivers.store.tables import ReceivedEvent, RejectedBody

log = logging.getLogger(__name__)

EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__
IDENTITY_COLUMNS = ("source", "kind", "dedup_key")
MAX_BATCH = 256
HOOK_DELAY_SECONDS = 0.05
SQLITE_MAX_PARAMETERS = 32766  # SQLite's default host-parameter limit (3.32+)

Clock = Callable[[], datetime]
Identity = tuple[str, str, str]
Row = dict[str, Any]


class StoreUnavailable(Exception):
    """The database could not take the write; the caller should answer 503."""


@dataclass(frozen=True)
class Arrival:
    """An accepted callback, ready to be stored."""

    source: str
    kind: str
    dedup_key: str
    payload: dict[str, Any]
    raw_body: bytes
    content_type: str | None
    method: str
    remote_addr: str | None

    @property
    def identity(self) -> Identity:
        return (self.source, self.kind, self.dedup_key)


@dataclass(frozen=True)
class Rejection:
    """A quarantined body: undecodable (400) or not fitting its kind's model (422)."""

    source: str
    path: str
    kind: str | None
    status: int
    reason: str
    errors: list[dict[str, Any]]
    raw_body: bytes
    content_type: str | None
    remote_addr: str | None


@dataclass(frozen=True)
class Receipt:
    """The stored event's id; ``duplicate`` when it had been stored before."""

    event_id: str
    duplicate: bool


@dataclass(frozen=True)
class StoredEvent:
    """What the after-commit hook gets for each newly stored event."""

    id: str
    source: str
    kind: str
    received_at: datetime
    payload: dict[str, Any]


AfterCommit = Callable[[Sequence[StoredEvent]], Awaitable[None]]


def body_hash(raw_body: bytes) -> str:
    """The fallback identity of a body."""
    return "sha256:" + hashlib.sha256(raw_body).hexdigest()


@dataclass(slots=True)
class _Pending:
    item: Arrival | Rejection
    future: asyncio.Future[Any]


@dataclass
class _Batch:
    """A batch handed to the store: who waits for it, its rows, and the store's answer."""

    items: list[_Pending]
    now: datetime
    copies: dict[Identity, list[_Pending]]
    rows: list[Row]
    written: Awaitable[dict[Identity, str]]


class EventWriter:
    """The writer of one process; see the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock,
        after_commit: AfterCommit | None = None,
        max_batch: int = MAX_BATCH,
        hook_batch: int = MAX_BATCH,
        hook_delay: float = HOOK_DELAY_SECONDS,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._after_commit = after_commit
        self._max_batch = max_batch
        self._hook_batch = hook_batch
        self._hook_delay = hook_delay
        self._store: BatchStore | None = None
        self._queue: deque[_Pending] = deque()
        self._writing = 0
        self._unhooked: list[StoredEvent] = []
        self._hooking = False
        self._hook_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open the store."""
        self._store = batch_store(self._engine)

    async def stop(self) -> None:
        """Write what is queued, give the hook what it has not had, then close the store."""
        store, self._store = self._store, None
        if store is None:
            return
        self._pump(store)
        self._schedule_hook()
        while self._tasks:
            await asyncio.wait(set(self._tasks))
            self._pump(store)
            self._schedule_hook()
        await store.close()

    async def store(self, arrival: Arrival) -> Receipt:
        """Store an event (or count a duplicate); returns once it is committed."""
        result: Receipt = await self._submit(arrival)
        return result

    async def quarantine(self, rejection: Rejection) -> None:
        """Keep a rejected body (deduplicated by body hash); returns once committed."""
        await self._submit(rejection)

    def _submit(self, item: Arrival | Rejection) -> asyncio.Future[Any]:
        if self._store is None:
            raise StoreUnavailable("the event writer is not running")
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(item, future))
        self._pump(self._store)
        return future

    def _pump(self, store: BatchStore) -> None:
        """Hand what is queued to the store while it has room."""
        while self._queue and self._writing < store.slots:
            items = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
            self._writing += 1
            self._spawn(self._finish(store, self._begin(store, items)))

    def _begin(self, store: BatchStore, items: list[_Pending]) -> _Batch:
        """Build a batch's rows and hand them to the store (which may start at once)."""
        now = self._clock()
        copies: dict[Identity, list[_Pending]] = {}
        rejected: dict[str, tuple[Rejection, int]] = {}
        for pending in items:
            item = pending.item
            if isinstance(item, Arrival):
                copies.setdefault(item.identity, []).append(pending)
            else:
                digest = body_hash(item.raw_body)
                seen = rejected.get(digest)
                rejected[digest] = (seen[0], seen[1] + 1) if seen else (item, 1)
        rows = [_event_row(same, now) for same in copies.values()]
        quarantine = [_rejection_row(item, d, n, now) for d, (item, n) in rejected.items()]
        return _Batch(items, now, copies, rows, store.write(rows, quarantine))

    async def _finish(self, store: BatchStore, batch: _Batch) -> None:
        """Wait for a batch, wake its callers, keep its new events for the hook."""
        try:
            stored = await self._settle(store, batch)
        finally:
            self._writing -= 1
            self._pump(store)
        if stored and self._after_commit is not None:
            self._unhooked += stored
            self._schedule_hook()

    async def _settle(self, store: BatchStore, batch: _Batch) -> list[StoredEvent]:
        """Settle a batch's futures; returns its newly stored events."""
        try:
            ids = await batch.written
        except Exception as exc:
            if len(batch.items) > 1 and not _is_connection_error(exc):
                log.warning(
                    "batch write failed (%s); writing its items one by one", type(exc).__name__
                )
                stored: list[StoredEvent] = []
                for pending in batch.items:
                    stored += await self._settle(store, self._begin(store, [pending]))
                return stored
            log.error("store unavailable: %s", type(exc).__name__, exc_info=exc)
            for pending in batch.items:
                if not pending.future.done():
                    pending.future.set_exception(StoreUnavailable(str(type(exc).__name__)))
            return []
        stored = []
        for row, (identity, same) in zip(batch.rows, batch.copies.items(), strict=True):
            event_id = ids[identity]
            new = event_id == row["id"]
            if new:
                source, kind, _ = identity
                stored.append(StoredEvent(event_id, source, kind, batch.now, row["payload"]))
            for index, pending in enumerate(same):
                if not pending.future.done():
                    pending.future.set_result(Receipt(event_id, duplicate=index > 0 or not new))
        for pending in batch.items:
            if not pending.future.done():
                pending.future.set_result(None)  # quarantined
        return stored

    def _schedule_hook(self) -> None:
        """Call the hook now when enough events wait for it (or the writer stops), else soon."""
        if self._hooking or not self._unhooked:
            return
        if len(self._unhooked) >= self._hook_batch or self._store is None:
            self._call_hook()
        elif self._hook_timer is None:
            loop = asyncio.get_running_loop()
            self._hook_timer = loop.call_later(self._hook_delay, self._call_hook)

    def _call_hook(self) -> None:
        if self._hook_timer is not None:
            self._hook_timer.cancel()
            self._hook_timer = None
        if self._hooking or not self._unhooked:
            return
        self._hooking = True
        events, self._unhooked = self._unhooked, []
        self._spawn(self._run_hook(events))

    async def _run_hook(self, events: list[StoredEvent]) -> None:
        assert self._after_commit is not None
        try:
            await self._after_commit(events)
        except Exception:
            log.exception("after-commit hook failed; the events are stored and will be swept")
        finally:
            self._hooking = False
            self._schedule_hook()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _event_row(copies: list[_Pending], now: datetime) -> Row:
    """The row of an event that arrived ``len(copies)`` times in one batch."""
    first = copies[0].item
    assert isinstance(first, Arrival)
    return {
        "id": new_id(now),
        "source": first.source,
        "kind": first.kind,
        "dedup_key": first.dedup_key,
        "received_at": now,
        "payload": first.payload,
        "raw_body": first.raw_body,
        "content_type": first.content_type,
        "method": first.method,
        "remote_addr": first.remote_addr,
        "duplicates": len(copies) - 1,
    }


def _rejection_row(item: Rejection, digest: str, count: int, now: datetime) -> Row:
    """The quarantine row of a body that was rejected ``count`` times in one batch."""
    return {
        "id": new_id(now),
        "source": item.source,
        "path": item.path[:255],
        "kind": item.kind,
        "status": item.status,
        "reason": item.reason[:1000],
        "errors": item.errors,
        "body_hash": digest,
        "raw_body": item.raw_body,
        "content_type": item.content_type,
        "remote_addr": item.remote_addr,
        "received_at": now,
        "last_seen_at": now,
        "count": count,
    }


def _identity(row: Mapping[str, Any]) -> Identity:
    return (row["source"], row["kind"], row["dedup_key"])


# --- stores: how a batch reaches the database ------------------------------------------------


class BatchStore(Protocol):
    """Writes batches, each in one transaction."""

    slots: int
    """How many batches may be handed over before the first one is written."""

    def write(self, events: list[Row], rejections: list[Row]) -> Awaitable[dict[Identity, str]]:
        """Start writing a batch (at once, where the store can): insert the event rows (one per
        identity) unless stored already, add ``duplicates + 1`` to the stored row of those that
        were, upsert the quarantine rows by body hash. Answers every identity's stored id."""
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

    def write(self, events: list[Row], rejections: list[Row]) -> Awaitable[dict[Identity, str]]:
        return self._write(events, rejections)

    async def close(self) -> None:
        return None

    async def _write(self, events: list[Row], rejections: list[Row]) -> dict[Identity, str]:
        ids: dict[Identity, str] = {}
        async with self._engine.begin() as conn:
            statements = _statements(conn.dialect.name)
            if events:
                inserted = set((await conn.execute(statements.insert_events, events)).scalars())
                copies: dict[Identity, int] = {}
                for row in events:
                    if row["id"] in inserted:
                        ids[_identity(row)] = row["id"]
                    else:
                        copies[_identity(row)] = row["duplicates"] + 1
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

    A batch costs that thread as few calls into SQLite as possible: the events are one multi-row
    insert without RETURNING (its row count says whether any were stored already), begun
    implicitly by the driver, then the commit. Every call gives up the GIL and then has to wait
    for it while the event loop is busy."""

    slots = 2

    def __init__(self, database: str, dialect: Dialect) -> None:
        self._database = database
        self._event_values = _driver_values(EVENTS, EVENTS.c.keys(), dialect)
        self._rejected_values = _driver_values(REJECTED, REJECTED.c.keys(), dialect)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-writer")
        self._connection: sqlite3.Connection | None = None

    def write(self, events: list[Row], rejections: list[Row]) -> Awaitable[dict[Identity, str]]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._thread, self._write, events, rejections)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._disconnect)
        self._thread.shutdown()

    def _write(self, events: list[Row], rejections: list[Row]) -> dict[Identity, str]:
        conn = self._connect()
        try:
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
        return ids

    def _insert_events(self, conn: sqlite3.Connection, events: list[Row]) -> dict[Identity, str]:
        ids = {_identity(row): row["id"] for row in events}
        columns = tuple(EVENTS.c.keys())
        chunk = SQLITE_MAX_PARAMETERS // len(columns)
        inserted = 0
        for start in range(0, len(events), chunk):
            part = events[start : start + chunk]
            sql = _sqlite_insert_sql(EVENTS.name, columns, IDENTITY_COLUMNS, len(part))
            inserted += conn.execute(sql, self._event_values(part)).rowcount
        if inserted < len(events):
            for row in events:
                found = conn.execute(_FIND_EVENT, _identity(row)).fetchone()
                if found is None:
                    raise RuntimeError("a conflicting event vanished")
                if found[0] != row["id"]:
                    ids[_identity(row)] = found[0]
                    conn.execute(_COUNT_COPIES, (row["duplicates"] + 1, found[0]))
        return ids

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            conn = sqlite3.connect(self._database, timeout=CONNECT_TIMEOUT_SECONDS)
            _sqlite_pragmas(conn, None)
            self._connection = conn
        return self._connection

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


_FIND_EVENT = f"SELECT id FROM {EVENTS.name} WHERE " + " AND ".join(
    f"{name} = ?" for name in IDENTITY_COLUMNS
)
_COUNT_COPIES = f"UPDATE {EVENTS.name} SET duplicates = duplicates + ? WHERE id = ?"
_UPSERT_REJECTED = (
    f"INSERT INTO {REJECTED.name} ({', '.join(REJECTED.c.keys())}) "
    f"VALUES ({', '.join('?' * len(REJECTED.c))}) ON CONFLICT (body_hash) DO UPDATE SET "
    "count = count + excluded.count, last_seen_at = excluded.last_seen_at"
)


# --- multi-row SQLite inserts ----------------------------------------------------------------


async def sqlite_insert_many(
    conn: AsyncConnection, table: Table, rows: Sequence[Row], conflict: Sequence[str]
) -> int:
    """SQLite: insert ``rows`` (dicts with the same keys) on this connection, skipping those
    that conflict on the ``conflict`` columns; returns how many were inserted. Columns left out
    get the database's default, not SQLAlchemy's Python-side one.

    Each chunk is one multi-row ``INSERT ... ON CONFLICT DO NOTHING``, one call into the driver's
    thread: ``executemany`` or ``RETURNING`` would step the statement once per row, and every
    step gives up the GIL, then waits to get it back from the busy event loop."""
    if not rows:
        return 0
    names = tuple(rows[0])
    values = _driver_values(table, names, conn.dialect)
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    chunk = SQLITE_MAX_PARAMETERS // len(names)
    inserted = 0
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        sql = _sqlite_insert_sql(table.name, names, tuple(conflict), len(part))
        inserted += (await driver.execute(sql, values(part))).rowcount
    return inserted


@functools.lru_cache(maxsize=1024)
def _sqlite_insert_sql(
    table: str, columns: tuple[str, ...], conflict: tuple[str, ...], count: int
) -> str:
    values = "(" + ", ".join("?" * len(columns)) + ")"
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([values] * count)} "
        f"ON CONFLICT ({', '.join(conflict)}) DO NOTHING"
    )


_UNSET = object()


def _driver_values(
    table: Table, names: Sequence[str], dialect: Dialect
) -> Callable[[Sequence[Mapping[str, Any]]], list[Any]]:
    """rows -> the flat parameter list of a multi-row statement over the ``names`` columns, each
    value converted by its column's type (JSON, UTC datetimes) as SQLAlchemy would; a value
    shared with the previous row (a batch's timestamp) is converted once."""
    processors = [
        table.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names
    ]

    def values(rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        flat: list[Any] = []
        previous: list[Any] = [_UNSET] * len(names)
        converted: list[Any] = [None] * len(names)
        for row in rows:
            for index, name in enumerate(names):
                value = row[name]
                process = processors[index]
                if process is not None:
                    if value is not previous[index]:
                        previous[index], converted[index] = value, process(value)
                    value = converted[index]
                flat.append(value)
        return flat

    return values


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(
        exc,
        OperationalError
        | InterfaceError
        | sqlite3.OperationalError
        | OSError
        | ConnectionError
        | TimeoutError,
    ):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated
