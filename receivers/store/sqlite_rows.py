"""Multi-row SQLite inserts on a SQLAlchemy connection (the relay's routing writes): one
statement, one call into the driver, per chunk of rows."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import JSON, LargeBinary, Table
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import TypeEngine

from receivers.store.records import Row
from receivers.store.sqlite_batches import SQLITE_MAX_PARAMETERS, insert_sql, json_text


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
    values = driver_values(table, names, conn.dialect)
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    chunk = SQLITE_MAX_PARAMETERS // len(names)
    inserted = 0
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        sql = insert_sql(table.name, names, tuple(conflict), len(part))
        inserted += (await driver.execute(sql, values(part))).rowcount
    return inserted


def driver_values(
    table: Table, names: Sequence[str], dialect: Dialect
) -> Callable[[Sequence[Mapping[str, Any]]], list[Any]]:
    """rows -> the flat parameter list of a multi-row statement over the ``names`` columns, each
    value converted by its column's type as SQLAlchemy would (UTC datetimes, JSON: see
    :func:`json_text`); a value shared with the previous row (a batch's timestamp) is converted
    once. Bytes go to the driver as they are (SQLAlchemy would wrap them in a memoryview)."""
    processors = [_bind_processor(table.c[name].type, dialect) for name in names]
    converted = [(index, process) for index, process in enumerate(processors) if process]
    pick = operator.itemgetter(*names)
    single = len(names) == 1

    def values(rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        flat: list[Any] = []
        previous: dict[int, tuple[Any, Any]] = {}
        for row in rows:
            row_values = [pick(row)] if single else list(pick(row))
            for index, process in converted:
                value = row_values[index]
                seen = previous.get(index)
                if seen is None or seen[0] is not value:
                    seen = previous[index] = (value, process(value))
                row_values[index] = seen[1]
            flat += row_values
        return flat

    return values


def _bind_processor(column_type: TypeEngine[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
    if isinstance(column_type, JSON):
        return json_text
    if isinstance(column_type, LargeBinary):
        return None
    processor: Callable[[Any], Any] | None = column_type.dialect_impl(dialect).bind_processor(
        dialect
    )
    return processor
