"""The one write path of the store: a batch of items -> its rows -> one transaction.

Both lanes of the event writer (:mod:`receivers.store.writer`, and the writer's own process for
a SQLite file) write their groups with :func:`write_items`, and the relay writes its routing rows
with :func:`insert_rows`. A batch holds one row per event (its copies in the batch counted on
it) and one per rejected body (deduplicated by body hash). A duplicate is never inserted twice,
also when it was stored earlier or by another process: the unique constraint decides, and the
copy is counted on the stored row.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, select, tuple_, update
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from receivers.ids import new_ids
from receivers.store.in_commit import InCommit, InCommitFailed
from receivers.store.records import (
    IDENTITY_COLUMNS,
    Arrival,
    Identity,
    Item,
    Receipt,
    Rejection,
    Row,
    StoredEvent,
    StoreUnavailable,
    body_hash,
    identity,
)
from receivers.store.tables import ReceivedEvent, RejectedBody
from receivers.store.writable import refusal_of

log = logging.getLogger(__name__)

EVENTS: Table = ReceivedEvent.__table__  # type: ignore[attr-defined]
REJECTED: Table = RejectedBody.__table__  # type: ignore[attr-defined]
SQLITE_MAX_PARAMETERS = 32766
"""SQLite's default host-parameter limit (3.32+): one multi-row statement's bound values."""

CLIPPED = frozenset({"content_type", "remote_addr", "path", "reason"})
"""Columns whose text comes from the caller and is cut to fit (a long Content-Type header, an
IPv6 address with a zone id, a long path, a refusal naming many fields)."""
Answer = Receipt | StoreUnavailable | None
"""What an item gets: its receipt (an event), None (a quarantined body), or why it failed
(:class:`StoreFull` or :class:`StoreUnreachable` when the store refuses writes)."""


@dataclass(slots=True)
class BatchRows:
    """A batch's rows, and which items each event row stands for (first arrival first)."""

    events: list[Row]
    rejections: list[Row]
    copies: list[list[int]]


def batch_rows(items: Sequence[Item], now: datetime) -> BatchRows:
    """The rows of ``items``, all received ``now``; text is cut to its column's width."""
    copies: dict[Identity, list[int]] = {}
    rejected: dict[str, tuple[Rejection, int]] = {}
    for index, item in enumerate(items):
        if isinstance(item, Arrival):
            copies.setdefault(item.identity, []).append(index)
        else:
            digest = body_hash(item.raw_body)
            seen = rejected.get(digest)
            rejected[digest] = (seen[0], seen[1] + 1) if seen else (item, 1)
    ids = new_ids(now, len(copies) + len(rejected))
    events = []
    for same, event_id in zip(copies.values(), ids, strict=False):
        first = items[same[0]]
        assert isinstance(first, Arrival)
        row = _fields(first)
        row.update(id=event_id, received_at=now, duplicates=len(same) - 1)
        events.append(row)
    quarantine = []
    for (digest, (item, count)), row_id in zip(rejected.items(), ids[len(copies) :], strict=True):
        row = _fields(item)
        row.update(id=row_id, body_hash=digest, count=count, received_at=now, last_seen_at=now)
        quarantine.append(row)
    return BatchRows(events, quarantine, list(copies.values()))


def receipts(
    rows: BatchRows,
    stored: Mapping[Identity, str],
    count: int,
    written_with: Mapping[str, Any] | None = None,
) -> list[Answer]:
    """What each of the batch's ``count`` items gets, given every identity's stored id (and
    what the in-commit writer answered for each new event): a copy of an event in the batch,
    or of one stored before, is a duplicate."""
    answers: list[Answer] = [None] * count
    written = written_with or {}
    for row, same in zip(rows.events, rows.copies, strict=True):
        event_id = stored[identity(row)]
        new = event_id == row["id"]
        for position, index in enumerate(same):
            duplicate = position > 0 or not new
            answers[index] = Receipt(
                event_id, duplicate, None if duplicate else written.get(event_id)
            )
    return answers


def stored_events(
    items: Sequence[Item], answers: Sequence[Answer], at: datetime
) -> list[StoredEvent]:
    """The events of ``items`` that their answers say were newly stored."""
    return [
        StoredEvent(answer.event_id, item.source, item.kind, at, item.payload, answer.written_with)
        for item, answer in zip(items, answers, strict=True)
        if isinstance(answer, Receipt) and not answer.duplicate and isinstance(item, Arrival)
    ]


Transaction = Callable[[Callable[[Connection], Any]], Awaitable[Any]]
"""Runs a function of a connection in a transaction of its own, and returns its result."""


def in_transaction(engine: AsyncEngine) -> Transaction:
    """A :data:`Transaction` on an async engine (the function runs in SQLAlchemy's greenlet)."""

    async def run(function: Callable[[Connection], Any]) -> Any:
        async with engine.begin() as conn:
            return await conn.run_sync(function)

    return run


async def write_items(
    transaction: Transaction,
    items: Sequence[Item],
    now: datetime,
    *,
    in_commit: InCommit | None = None,
) -> list[Answer]:
    """Write ``items`` in one transaction, with what ``in_commit`` writes for the new events
    (:mod:`receivers.store.in_commit`); their answers. Should ``in_commit`` fail, the items are
    written again without it. When the write fails for another reason than a full or
    unavailable database, each item is written alone, so that only the one at fault fails. A
    full or unavailable database fails every item with :class:`StoreFull` or
    :class:`StoreUnreachable` and is not logged here: the writer's
    :class:`~receivers.store.writable.StoreWritable` says it once."""
    written_with: Mapping[str, Any] | None = None
    try:
        rows = batch_rows(items, now)
        if in_commit is not None:
            ids, written_with = await transaction(
                functools.partial(_write_with, rows=rows, items=items, now=now, in_commit=in_commit)
            )
            if written_with:  # it ran (a group without new events does not call it)
                in_commit.succeeded()
        else:
            ids = await transaction(functools.partial(write_rows, rows=rows))
    except InCommitFailed as failed:
        assert in_commit is not None
        refusal = refusal_of(failed.__cause__) if failed.__cause__ is not None else None
        if refusal is None:
            in_commit.failed(failed)
            return await write_items(transaction, items, now)
        return [type(refusal)(*refusal.args) for _ in items]
    except Exception as exc:
        refusal = refusal_of(exc)
        if refusal is not None:
            return [type(refusal)(*refusal.args) for _ in items]
        if len(items) > 1:
            log.warning("batch write failed (%s); writing its items one by one", type(exc).__name__)
            return [
                answer
                for item in items
                for answer in await write_items(transaction, [item], now, in_commit=in_commit)
            ]
        log.error("could not store %d item(s): %s", len(items), type(exc).__name__, exc_info=exc)
        return [StoreUnavailable(type(exc).__name__) for _ in items]
    return receipts(rows, ids, len(items), written_with)


def _write_with(
    conn: Connection, rows: BatchRows, items: Sequence[Item], now: datetime, in_commit: InCommit
) -> tuple[dict[Identity, str], dict[str, Any]]:
    """:func:`write_rows`, then ``in_commit`` with the new events, on one connection."""
    ids = write_rows(conn, rows)
    return ids, in_commit(conn, stored_events(items, receipts(rows, ids, len(items)), now))


def write_rows(conn: Connection, rows: BatchRows) -> dict[Identity, str]:
    """Insert the event rows unless stored already, add ``duplicates + 1`` to the stored row of
    those that were, upsert the quarantine rows by body hash; answers every identity's id."""
    events = rows.events
    ids = {identity(row): row["id"] for row in events}
    if events and insert_rows(conn, EVENTS, events, IDENTITY_COLUMNS) < len(events):
        ids |= _count_copies(conn, events)
    if rows.rejections:
        upsert = _dml(conn).insert(REJECTED)
        upsert = upsert.on_conflict_do_update(
            index_elements=["body_hash"],
            set_={
                "count": REJECTED.c.count + upsert.excluded.count,
                "last_seen_at": upsert.excluded.last_seen_at,
            },
        )
        conn.execute(upsert, rows.rejections)
    return ids


def insert_rows(
    conn: Connection, table: Table, rows: Sequence[Row], conflict: Sequence[str]
) -> int:
    """Insert ``rows`` (dicts with the same keys, all columns of ``table``), skipping those that
    conflict on the ``conflict`` columns; returns how many were inserted. On an async
    connection: :func:`insert_rows_async`.

    SQLite: one multi-row ``INSERT ... ON CONFLICT DO NOTHING`` per chunk, its values converted
    by the columns' own types: a single step in the driver, where ``executemany`` or
    ``RETURNING`` would step once per row, each step giving up the GIL and waiting to get it
    back from a busy event loop (SQLAlchemy's own ``executemany`` with ``RETURNING`` cost 35-48
    against 27-31 µs of CPU per row in a microbenchmark of 16-row batches). Other databases:
    SQLAlchemy's batched ``executemany``."""
    if not rows:
        return 0
    if conn.dialect.name != "sqlite":
        statement = _dml(conn).insert(table).on_conflict_do_nothing(index_elements=conflict)
        return len(conn.execute(statement.returning(table.c[conflict[0]]), rows).all())
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    inserted = 0
    try:
        for sql, values in _sqlite_inserts(table, rows, conflict, conn.dialect):
            cursor.execute(sql, values)
            inserted += cursor.rowcount
    finally:
        cursor.close()
    return inserted


async def insert_rows_async(
    conn: AsyncConnection, table: Table, rows: Sequence[Row], conflict: Sequence[str]
) -> int:
    """:func:`insert_rows` on an async connection. On SQLite each statement is one call into
    the driver's thread: SQLAlchemy's adapted cursor would make three, each waiting for the GIL
    to come back from a busy event loop."""
    if not rows:
        return 0
    if conn.dialect.name != "sqlite":
        return int(await conn.run_sync(insert_rows, table, rows, conflict))
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    inserted = 0
    for sql, values in _sqlite_inserts(table, rows, conflict, conn.dialect):
        inserted += (await driver.execute(sql, values)).rowcount
    return inserted


def _sqlite_inserts(
    table: Table, rows: Sequence[Row], conflict: Sequence[str], dialect: Dialect
) -> Iterator[tuple[str, list[Any]]]:
    """The multi-row statements of ``rows`` and their parameters, a chunk each."""
    if not rows:
        return
    names = tuple(rows[0])
    convert = _converters(table, names, dialect)
    pick = operator.itemgetter(*names) if len(names) > 1 else lambda row: (row[names[0]],)
    chunk = SQLITE_MAX_PARAMETERS // len(names)
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        yield (
            _insert_sql(table.name, names, tuple(conflict), len(part)),
            _values(part, pick, convert),
        )


@functools.lru_cache(maxsize=1024)
def _insert_sql(table: str, names: tuple[str, ...], conflict: tuple[str, ...], count: int) -> str:
    """``INSERT ... VALUES (...), (...) ON CONFLICT (...) DO NOTHING`` for ``count`` rows; with
    no ``conflict`` columns, a plain insert (which fails as a whole on any conflict)."""
    values = "(" + ", ".join("?" * len(names)) + ")"
    sql = f"INSERT INTO {table} ({', '.join(names)}) VALUES {', '.join([values] * count)}"
    return f"{sql} ON CONFLICT ({', '.join(conflict)}) DO NOTHING" if conflict else sql


def _values(
    rows: Sequence[Row],
    pick: Callable[[Row], tuple[Any, ...]],
    convert: Sequence[Callable[[Any], Any] | None],
) -> list[Any]:
    """The flat parameters of a multi-row statement, converted by the columns' types; a value
    shared with the previous row (a batch's timestamp) is converted once."""
    converted = [(index, process) for index, process in enumerate(convert) if process]
    flat: list[Any] = []
    previous: dict[int, tuple[Any, Any]] = {}
    for row in rows:
        values = list(pick(row))
        for index, process in converted:
            value = values[index]
            seen = previous.get(index)
            if seen is None or seen[0] is not value:
                seen = previous[index] = (value, process(value))
            values[index] = seen[1]
        flat += values
    return flat


def _count_copies(conn: Connection, events: list[Row]) -> dict[Identity, str]:
    """The stored ids of the events; those stored before get their copies counted."""
    columns = [EVENTS.c[name] for name in IDENTITY_COLUMNS]
    query = select(EVENTS.c.id, *columns).where(
        tuple_(*columns).in_(bindparam("identities", expanding=True))
    )
    found = conn.execute(query, {"identities": [identity(row) for row in events]})
    ids: dict[Identity, str] = {(r[1], r[2], r[3]): r[0] for r in found}
    if len(ids) < len(events):
        raise RuntimeError(f"{len(events) - len(ids)} conflicting events vanished")
    copies = [
        {"event_id": ids[identity(row)], "extra": row["duplicates"] + 1}
        for row in events
        if ids[identity(row)] != row["id"]
    ]
    if copies:
        count = (
            update(EVENTS)
            .where(EVENTS.c.id == bindparam("event_id"))
            .values(duplicates=EVENTS.c.duplicates + bindparam("extra"))
        )
        conn.execute(count, copies)
    return ids


def _fields(item: Item) -> Row:
    """The item's own fields (each a column of its table), caller-given text cut to its
    column's width (:data:`CLIPPED`: PostgreSQL refuses longer text, SQLite would keep it)."""
    row = dict(vars(item))
    for name, width in _clipped(type(item)):
        value = row[name]
        if isinstance(value, str) and len(value) > width:
            row[name] = value[:width]
    return row


@functools.cache
def _clipped(kind: type) -> tuple[tuple[str, int], ...]:
    """An item type's :data:`CLIPPED` fields and their columns' widths."""
    table = EVENTS if kind is Arrival else REJECTED
    return tuple(
        (name, table.c[name].type.length) for name in kind.__dataclass_fields__ if name in CLIPPED
    )


@functools.cache
def _converters(
    table: Table, names: tuple[str, ...], dialect: Dialect
) -> list[Callable[[Any], Any] | None]:
    """The bind processors of the ``names`` columns: values as SQLAlchemy would send them."""
    return [table.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names]


def _dml(conn: Connection) -> Any:
    """The backend's INSERT dialect (``ON CONFLICT`` is spelt alike in both)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql  # loaded where it is used

        return postgresql
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite
    raise StoreUnavailable(f"unsupported database backend {conn.dialect.name!r}")
