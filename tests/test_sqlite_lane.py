"""The writer's SQLite lane: the usual batch is one statement; conflicts take the general way."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import new_ids
from receivers.store.batch_stores import BatchRows, SqliteLane, batch_store
from receivers.store.tables import ReceivedEvent

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EVENTS = ReceivedEvent.__table__


@pytest.fixture
async def lane(sqlite_engine: AsyncEngine) -> AsyncIterator[SqliteLane]:
    store = batch_store(sqlite_engine)
    assert isinstance(store, SqliteLane)
    yield store
    await store.close()


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
    events: list[dict[str, Any]], rejections: list[dict[str, Any]]
) -> Callable[[], BatchRows]:
    """A batch built already (the lane calls it when the write starts)."""
    return lambda: (events, rejections)


def rejection_row(body: bytes) -> dict[str, Any]:
    return {
        "id": new_ids(NOW, 1)[0],
        "source": "default",
        "path": "/hooks/sms/inbound",
        "kind": None,
        "status": 400,
        "reason": "The body is not JSON: Expecting value.",
        "errors": [],
        "body_hash": f"sha256:{body.hex()}",
        "raw_body": body,
        "content_type": None,
        "remote_addr": None,
        "received_at": NOW,
        "last_seen_at": NOW,
        "count": 1,
    }


def traced(lane: SqliteLane) -> list[str]:
    statements: list[str] = []
    lane._connect().set_trace_callback(statements.append)
    return statements


async def stored(engine: AsyncEngine) -> dict[str, tuple[str, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT dedup_key, id, duplicates FROM received_events"))
        return {key: (row_id, duplicates) for key, row_id, duplicates in rows}


async def test_new_events_are_one_autocommitted_statement(
    lane: SqliteLane, sqlite_engine: AsyncEngine
) -> None:
    await lane.write(batch(event_rows("warm-up"), []))  # connects (pragmas) in the lane's thread
    statements = await _in_lane(lane, traced)
    rows = event_rows("a", "b", "c")
    ids = await lane.write(batch(rows, []))

    assert ids == {("default", "sms.inbound", row["dedup_key"]): row["id"] for row in rows}
    assert (await stored(sqlite_engine)).items() >= {
        row["dedup_key"]: (row["id"], 0) for row in rows
    }.items()
    assert len(statements) == 1
    assert statements[0].startswith("INSERT INTO received_events")
    assert "ON CONFLICT" not in statements[0]


async def test_a_conflict_writes_the_batch_the_general_way(
    lane: SqliteLane, sqlite_engine: AsyncEngine
) -> None:
    first = event_rows("a")
    await lane.write(batch(first, []))
    statements = await _in_lane(lane, traced)
    second = event_rows("a", duplicates=1) + event_rows("b")
    ids = await lane.write(batch(second, []))

    assert ids == {
        ("default", "sms.inbound", "a"): first[0]["id"],
        ("default", "sms.inbound", "b"): second[1]["id"],
    }
    assert await stored(sqlite_engine) == {"a": (first[0]["id"], 2), "b": (second[1]["id"], 0)}
    assert statements[0].startswith("INSERT") and "ON CONFLICT" not in statements[0]
    assert statements[1] == "BEGIN" and statements[-1] == "COMMIT"


async def test_rejections_share_the_events_transaction(
    lane: SqliteLane, sqlite_engine: AsyncEngine
) -> None:
    await lane.write(batch(event_rows("warm-up"), []))
    statements = await _in_lane(lane, traced)
    rows = event_rows("a")
    ids = await lane.write(batch(rows, [rejection_row(b"not json")]))
    assert ids == {("default", "sms.inbound", "a"): rows[0]["id"]}
    assert statements[0] == "BEGIN" and statements[-1] == "COMMIT"
    async with sqlite_engine.connect() as conn:
        count = await conn.scalar(text("SELECT count FROM rejected_bodies"))
    assert count == 1


async def _in_lane(lane: SqliteLane, work: Any) -> Any:
    """Run ``work(lane)`` in the lane's own thread (where its connection lives)."""
    return await asyncio.get_running_loop().run_in_executor(lane._thread, work, lane)


async def test_payloads_read_back_as_written(lane: SqliteLane, sqlite_engine: AsyncEngine) -> None:
    """The lane encodes JSON columns itself (pydantic-core, json.dumps for lone surrogates);
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
    await lane.write(batch(rows, []))

    async with sqlite_engine.connect() as conn:
        result = await conn.execute(
            select(EVENTS.c.dedup_key, EVENTS.c.payload).where(
                EVENTS.c.dedup_key.in_([row["dedup_key"] for row in rows])
            )
        )
        read_back = {key: payload for key, payload in result}
    assert read_back == {row["dedup_key"]: row["payload"] for row in rows}


async def test_nan_reads_back_as_nan(lane: SqliteLane, sqlite_engine: AsyncEngine) -> None:
    rows = event_rows("nan")
    rows[0]["payload"] = {"totalPrice": math.nan}
    await lane.write(batch(rows, []))
    async with sqlite_engine.connect() as conn:
        payload = await conn.scalar(select(EVENTS.c.payload).where(EVENTS.c.dedup_key == "nan"))
    assert math.isnan(payload["totalPrice"])


async def test_a_waiting_batch_is_built_in_the_lane_after_the_one_before_is_committed(
    lane: SqliteLane, sqlite_engine: AsyncEngine
) -> None:
    seen: list[tuple[str, int]] = []

    def second() -> BatchRows:
        conn = lane._connect()  # only the lane's own thread may use it: this runs there
        (count,) = conn.execute("SELECT count(*) FROM received_events").fetchone()
        seen.append((threading.current_thread().name, count))
        return event_rows("b"), []

    first_rows = event_rows("a")
    await asyncio.gather(lane.write(batch(first_rows, [])), lane.write(second))

    assert len(seen) == 1
    thread, count = seen[0]
    assert thread.startswith("event-writer") and count == 1
    assert set(await stored(sqlite_engine)) == {"a", "b"}
