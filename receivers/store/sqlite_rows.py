"""Multi-row SQLite inserts: one statement, one call into the driver, per chunk of rows."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from receivers.store.records import Row

SQLITE_MAX_PARAMETERS = 32766  # SQLite's default host-parameter limit (3.32+)


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


@functools.lru_cache(maxsize=1024)
def insert_sql(table: str, columns: tuple[str, ...], conflict: tuple[str, ...], count: int) -> str:
    """``INSERT ... VALUES (...), (...) ON CONFLICT (...) DO NOTHING`` for ``count`` rows; with
    no ``conflict`` columns, a plain insert (which fails as a whole on any conflict)."""
    values = "(" + ", ".join("?" * len(columns)) + ")"
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([values] * count)}"
    return f"{sql} ON CONFLICT ({', '.join(conflict)}) DO NOTHING" if conflict else sql


_UNSET = object()


def driver_values(
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
