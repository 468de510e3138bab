"""The SQLite batch writer (run by the writer process): the usual batch is one statement,
conflicts take the general way, and everything reads back through the app's tables as written."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import new_ids
from receivers.store.engine import create_engine
from receivers.store.rows import BatchRows
from receivers.store.sqlite_batches import (
    EVENT_COLUMNS,
    REJECTED_COLUMNS,
    SqliteBatchWriter,
    sqlite_datetime,
)
from receivers.store.tables import ReceivedEvent, RejectedBody, UTCDateTime
from relay import migrate

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EVENTS = ReceivedEvent.__table__


@pytest.fixture
def batches(sqlite_engine: AsyncEngine) -> Iterator[SqliteBatchWriter]:
    writer = SqliteBatchWriter(str(sqlite_engine.url.database))
    yield writer
    writer.close()


def event_rows(*keys: str, duplicates: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "id": row_id,
            "source": "default",
            "kind": "sms.inbound",
            "dedup_key": key,
            "received_at": NOW,
            "payload": {"requestId": key},
            "raw_body": b'{"requestId": "%s"}' % key.encode(),
            "content_type": "application/json",
            "method": "POST",
            "remote_addr": "127.0.0.1",
            "duplicates": duplicates,
        }
        for key, row_id in zip(keys, new_ids(NOW, len(keys)), strict=True)
    ]


def batch(
    events: list[dict[str, Any]], rejections: list[dict[str, Any]] | None = None
) -> BatchRows:
    """The rows of a batch whose items were one per event row."""
    return BatchRows(events, rejections or [], [[index] for index in range(len(events))])


def rejection_row(body: bytes) -> dict[str, Any]:
    return {
        "id": new_ids(NOW, 1)[0],
        "source": "default",
        "path": "/hooks/sms/inbound",
        "kind": None,
        "status": 400,
        "reason": "The body is not JSON: Expecting value.",
        "errors": [{"field": "(body)", "message": "not JSON"}],
        "body_hash": f"sha256:{body.hex()}",
        "raw_body": body,
        "content_type": None,
        "remote_addr": None,
        "received_at": NOW,
        "last_seen_at": NOW,
        "count": 1,
    }


def traced(writer: SqliteBatchWriter) -> list[str]:
    statements: list[str] = []
    writer.connect().set_trace_callback(statements.append)
    return statements


async def stored(engine: AsyncEngine) -> dict[str, tuple[str, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT dedup_key, id, duplicates FROM received_events"))
        return {key: (row_id, duplicates) for key, row_id, duplicates in rows}


def test_the_columns_are_the_tables_columns() -> None:
    assert tuple(EVENTS.c.keys()) == EVENT_COLUMNS
    assert tuple(RejectedBody.__table__.c.keys()) == REJECTED_COLUMNS


@pytest.mark.parametrize(
    "moment",
    [
        NOW,
        datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 6, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
def test_datetimes_are_written_as_sqlalchemy_writes_them(moment: datetime) -> None:
    dialect = sqlite.dialect()
    column_type = UTCDateTime()
    bind = column_type.dialect_impl(dialect).bind_processor(dialect)
    assert bind is not None
    # the processor applies the column type's own conversion, then the dialect's
    assert sqlite_datetime(moment) == bind(moment)


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        sqlite_datetime(datetime(2026, 3, 1, 12, 0))


async def test_new_events_are_one_autocommitted_statement(
    batches: SqliteBatchWriter, sqlite_engine: AsyncEngine
) -> None:
    statements = traced(batches)
    rows = event_rows("a", "b", "c")
    ids = batches.write(batch(rows))

    assert ids == {("default", "sms.inbound", row["dedup_key"]): row["id"] for row in rows}
    assert await stored(sqlite_engine) == {row["dedup_key"]: (row["id"], 0) for row in rows}
    assert len(statements) == 1
    assert statements[0].startswith("INSERT INTO received_events")
    assert "ON CONFLICT" not in statements[0]


async def test_a_conflict_writes_the_batch_the_general_way(
    batches: SqliteBatchWriter, sqlite_engine: AsyncEngine
) -> None:
    first = event_rows("a")
    batches.write(batch(first))
    statements = traced(batches)
    second = event_rows("a", duplicates=1) + event_rows("b")
    ids = batches.write(batch(second))

    assert ids == {
        ("default", "sms.inbound", "a"): first[0]["id"],
        ("default", "sms.inbound", "b"): second[1]["id"],
    }
    assert await stored(sqlite_engine) == {"a": (first[0]["id"], 2), "b": (second[1]["id"], 0)}
    assert statements[0].startswith("INSERT") and "ON CONFLICT" not in statements[0]
    assert statements[1] == "BEGIN" and statements[-1] == "COMMIT"


async def test_rejections_share_the_events_transaction_and_are_counted_by_body(
    batches: SqliteBatchWriter, sqlite_engine: AsyncEngine
) -> None:
    statements = traced(batches)
    rows = event_rows("a")
    ids = batches.write(batch(rows, [rejection_row(b"not json")]))
    assert ids == {("default", "sms.inbound", "a"): rows[0]["id"]}
    assert statements[0] == "BEGIN" and statements[-1] == "COMMIT"

    later = rejection_row(b"not json") | {"last_seen_at": NOW + timedelta(hours=1), "count": 2}
    batches.write(batch([], [later]))
    async with sqlite_engine.connect() as conn:
        found = (await conn.execute(select(RejectedBody.__table__))).mappings().one()
    assert found["count"] == 3
    assert found["received_at"] == NOW and found["last_seen_at"] == NOW + timedelta(hours=1)
    assert found["errors"] == [{"field": "(body)", "message": "not JSON"}]


async def test_payloads_read_back_as_written(
    batches: SqliteBatchWriter, sqlite_engine: AsyncEngine
) -> None:
    """The writer encodes JSON columns itself (pydantic-core, json.dumps for lone surrogates);
    SQLAlchemy's JSON type must read every payload back as the same value."""
    payloads: list[dict[str, Any]] = [
        {"message": "héllo ✓ 日本", "n": 10**30, "f": 1e16, "neg": -0.5},
        {"price": math.inf, "other": -math.inf, "nested": {"list": [1, None, True, "x"]}},
        {"message": "lone \ud800 surrogate", "ok": "fine"},
        {"empty": {}, "quote": 'a "quoted" \\ back\nslash'},
    ]
    rows = event_rows(*(f"p{index}" for index in range(len(payloads))))
    for row, payload in zip(rows, payloads, strict=True):
        row["payload"] = payload
    batches.write(batch(rows))

    async with sqlite_engine.connect() as conn:
        result = await conn.execute(select(EVENTS))
        read_back = {row["dedup_key"]: row for row in result.mappings()}
    for row in rows:
        assert read_back[row["dedup_key"]]["payload"] == row["payload"]
        assert read_back[row["dedup_key"]]["received_at"] == NOW
        assert read_back[row["dedup_key"]]["raw_body"] == row["raw_body"]


async def test_nan_reads_back_as_nan(
    batches: SqliteBatchWriter, sqlite_engine: AsyncEngine
) -> None:
    rows = event_rows("nan")
    rows[0]["payload"] = {"totalPrice": math.nan}
    batches.write(batch(rows))
    async with sqlite_engine.connect() as conn:
        payload = await conn.scalar(select(EVENTS.c.payload).where(EVENTS.c.dedup_key == "nan"))
    assert math.isnan(payload["totalPrice"])


async def test_an_unavailable_file_fails_and_the_next_write_connects_again(tmp_path: Path) -> None:
    database = tmp_path / "later" / "relay.db"  # its directory does not exist yet
    writer = SqliteBatchWriter(str(database))
    try:
        with pytest.raises(sqlite3.OperationalError):
            writer.write(batch(event_rows("a")))

        database.parent.mkdir()
        engine = create_engine(f"sqlite:///{database}")
        await migrate.upgrade(engine)
        rows = event_rows("b")
        assert writer.write(batch(rows)) == {("default", "sms.inbound", "b"): rows[0]["id"]}
        assert await stored(engine) == {"b": (rows[0]["id"], 0)}
        await engine.dispose()
    finally:
        writer.close()
