"""The store's one write path: a batch of items -> its rows -> one transaction, on SQLite and
PostgreSQL. Duplicates are counted on the stored row (within a batch, against rows stored before,
and against a concurrent writer), rejected bodies are one row per body hash, a bad item fails
alone, an unavailable database fails the whole batch; the rows read back as written."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import event, select
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import new_ids
from receivers.store.batches import (
    SQLITE_MAX_PARAMETERS,
    in_transaction,
    insert_rows,
    insert_rows_async,
    write_items,
)
from receivers.store.engine import create_engine
from receivers.store.records import Receipt, StoreUnavailable
from relay.store import migrate
from tests.store_support import (
    EVENTS,
    NOW,
    arrival,
    driver_threads,
    drivers_ended,
    rejected_bodies,
    rejection,
    stored_events,
    unwritable,
)
from tests.support import free_port

ONE_BY_ONE = "writing its items one by one"


async def test_a_batch_answers_each_item_in_order(engine: AsyncEngine) -> None:
    [old] = await write_items(in_transaction(engine), [arrival("old")], NOW)
    assert isinstance(old, Receipt) and not old.duplicate

    answers = await write_items(
        in_transaction(engine),
        [arrival("a"), rejection(b"x"), arrival("old"), arrival("a"), arrival("b")],
        NOW + timedelta(seconds=1),
    )

    a, quarantined, old_again, a_again, b = answers
    assert quarantined is None
    assert isinstance(a, Receipt) and isinstance(b, Receipt) and a.event_id != b.event_id
    assert not a.duplicate and not b.duplicate
    assert a_again == Receipt(a.event_id, duplicate=True)
    assert old_again == Receipt(old.event_id, duplicate=True)
    rows = await stored_events(engine)
    assert {key: (row["id"], row["duplicates"]) for key, row in rows.items()} == {
        "old": (old.event_id, 1),
        "a": (a.event_id, 1),
        "b": (b.event_id, 0),
    }
    assert rows["old"]["received_at"] == NOW and rows["a"]["received_at"] == NOW + timedelta(
        seconds=1
    )
    assert list(await rejected_bodies(engine)) == [b"x"]


async def test_a_batch_is_one_transaction(engine: AsyncEngine) -> None:
    await write_items(in_transaction(engine), [arrival("old")], NOW)
    commits: list[object] = []
    event.listen(engine.sync_engine, "commit", commits.append)
    answers = await write_items(
        in_transaction(engine),
        [arrival("old"), arrival("new"), rejection(b"x"), rejection(b"y")],
        NOW,
    )
    assert len(commits) == 1
    assert isinstance(answers[0], Receipt) and answers[0].duplicate
    assert set(await stored_events(engine)) == {"old", "new"}
    assert set(await rejected_bodies(engine)) == {b"x", b"y"}


async def test_every_copy_is_counted_on_the_stored_row(engine: AsyncEngine) -> None:
    [first] = await write_items(in_transaction(engine), [arrival("a")], NOW)
    assert isinstance(first, Receipt)
    again = await write_items(in_transaction(engine), [arrival("a"), arrival("a")], NOW)
    again += await write_items(in_transaction(engine), [arrival("a"), arrival("b")], NOW)

    assert again[:3] == [Receipt(first.event_id, duplicate=True)] * 3
    rows = await stored_events(engine)
    assert rows["a"]["duplicates"] == 3 and rows["b"]["duplicates"] == 0
    assert rows["a"]["id"] == first.event_id


async def test_rejected_bodies_are_one_row_per_body_counted_by_hash(engine: AsyncEngine) -> None:
    answers = await write_items(
        in_transaction(engine),
        [rejection(b"not json"), rejection(b"not json", reason="Again."), rejection(b"other")],
        NOW,
    )
    assert answers == [None, None, None]
    later = NOW + timedelta(hours=1)
    assert await write_items(
        in_transaction(engine), [rejection(b"not json", reason="Again.")], later
    ) == [None]

    rows = await rejected_bodies(engine)
    assert set(rows) == {b"not json", b"other"}
    kept = rows[b"not json"]
    assert kept["count"] == 3 and rows[b"other"]["count"] == 1
    assert kept["received_at"] == NOW and kept["last_seen_at"] == later
    assert kept["reason"] == "The body is not JSON."  # the first copy's, kept
    assert kept["errors"] == [{"field": "(body)", "message": "not JSON"}]
    assert kept["remote_addr"] == "10.0.0.1" and kept["body_hash"].startswith("sha256:")


async def test_an_item_that_cannot_be_written_fails_alone(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="receivers.store.batches"):
        answers = await write_items(
            in_transaction(engine),
            [arrival("a"), unwritable("bad"), rejection(b"x"), arrival("b")],
            NOW,
        )

    a, bad, quarantined, b = answers
    assert isinstance(a, Receipt) and isinstance(b, Receipt) and quarantined is None
    assert isinstance(bad, StoreUnavailable)
    assert set(await stored_events(engine)) == {"a", "b"}
    assert list(await rejected_bodies(engine)) == [b"x"]
    assert ONE_BY_ONE in caplog.text


@pytest.fixture(params=["sqlite", "postgresql"])
async def unreachable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A store that cannot be reached: a SQLite file in a directory that does not exist, or a
    PostgreSQL server that refuses connections."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'missing' / 'relay.db'}"
    else:
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    before = driver_threads()
    engine = create_engine(url)
    yield engine
    await engine.dispose()
    await drivers_ended(before)


async def test_an_unavailable_database_fails_the_whole_batch(
    unreachable: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="receivers.store.batches"):
        answers = await write_items(
            in_transaction(unreachable), [arrival("a"), rejection(b"x"), arrival("b")], NOW
        )
    assert len(answers) == 3 and all(isinstance(answer, StoreUnavailable) for answer in answers)
    assert ONE_BY_ONE not in caplog.text  # no point trying each item of it again


async def test_the_next_write_connects_again(tmp_path: Path) -> None:
    database = tmp_path / "later" / "relay.db"  # its directory does not exist yet
    engine = create_engine(f"sqlite:///{database}")
    try:
        [failed] = await write_items(in_transaction(engine), [arrival("a")], NOW)
        assert isinstance(failed, StoreUnavailable)

        database.parent.mkdir()
        await migrate.upgrade(engine)
        [stored] = await write_items(in_transaction(engine), [arrival("a")], NOW)
        assert isinstance(stored, Receipt) and not stored.duplicate
        assert (await stored_events(engine))["a"]["id"] == stored.event_id
    finally:
        await engine.dispose()


@pytest.fixture
async def second_engine(engine: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """Another engine on the same database, with connections of its own (as another server
    process would have)."""
    other = create_engine(engine.url.render_as_string(hide_password=False))
    yield other
    await other.dispose()


async def test_concurrent_writers_store_each_event_once(
    engine: AsyncEngine, second_engine: AsyncEngine
) -> None:
    keys = [f"k{index}" for index in range(50)]
    items = [arrival(key) for key in keys]
    ours, theirs = await asyncio.gather(
        write_items(in_transaction(engine), items, NOW),
        write_items(in_transaction(second_engine), items, NOW),
    )

    rows = await stored_events(engine)
    assert set(rows) == set(keys)
    for key, mine, other in zip(keys, ours, theirs, strict=True):
        assert isinstance(mine, Receipt) and isinstance(other, Receipt)
        assert mine.event_id == other.event_id == rows[key]["id"]
        assert sorted([mine.duplicate, other.duplicate]) == [False, True]
        assert rows[key]["duplicates"] == 1


# --- insert_rows -------------------------------------------------------------------------------


def event_rows(*keys: str, at: datetime = NOW) -> list[dict[str, Any]]:
    """Rows of the events table, in its column order."""
    return [
        {
            "id": row_id,
            "source": "default",
            "kind": "sms.inbound",
            "dedup_key": key,
            "received_at": at,
            "payload": {"requestId": key},
            "raw_body": b'{"requestId": "%s"}' % key.encode(),
            "content_type": "application/json",
            "method": "POST",
            "remote_addr": "127.0.0.1",
            "duplicates": 0,
            "platform_id": key,
            "event_name": None,
        }
        for key, row_id in zip(keys, new_ids(NOW, len(keys)), strict=True)
    ]


IDENTITY = ("source", "kind", "dedup_key")


async def insert(engine: AsyncEngine, rows: list[dict[str, Any]]) -> int:
    async with engine.begin() as conn:
        return await conn.run_sync(insert_rows, EVENTS, rows, ("source", "kind", "dedup_key"))


async def test_insert_rows_skips_the_conflicting_rows_and_counts_the_others(
    engine: AsyncEngine,
) -> None:
    first = event_rows("a", "b")
    assert await insert(engine, first) == 2
    second = event_rows("a", "c", "b", "d")
    assert await insert(engine, second) == 2
    assert await insert(engine, []) == 0

    rows = await stored_events(engine)
    assert {key: row["id"] for key, row in rows.items()} == {
        "a": first[0]["id"],
        "b": first[1]["id"],
        "c": second[1]["id"],
        "d": second[3]["id"],
    }


async def test_sqlite_takes_each_chunk_of_rows_in_one_statement(
    sqlite_engine: AsyncEngine,
) -> None:
    statements: list[str] = []
    chunk = SQLITE_MAX_PARAMETERS // len(EVENTS.columns)
    rows = event_rows(*(f"k{index}" for index in range(2 * chunk + 1)))
    engine = sqlalchemy.create_engine(sqlite_engine.url.set(drivername="sqlite"))

    @event.listens_for(engine, "connect")
    def trace(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_trace_callback(statements.append)  # what SQLite itself runs

    with engine.begin() as conn:
        assert insert_rows(conn, EVENTS, rows, IDENTITY) == len(rows)
    engine.dispose()

    inserts = [sql for sql in statements if sql.startswith("INSERT")]
    assert len(inserts) == 3 and all("ON CONFLICT" in sql for sql in inserts)
    assert len(await stored_events(sqlite_engine)) == len(rows)


async def test_insert_rows_async_is_insert_rows_on_an_async_connection(
    engine: AsyncEngine,
) -> None:
    first = event_rows("a", "b")
    async with engine.begin() as conn:
        assert await insert_rows_async(conn, EVENTS, first, IDENTITY) == 2
        assert await insert_rows_async(conn, EVENTS, event_rows("a", "c"), IDENTITY) == 1
        assert await insert_rows_async(conn, EVENTS, [], IDENTITY) == 0
    rows = await stored_events(engine)
    assert sorted(rows) == ["a", "b", "c"] and rows["a"]["id"] == first[0]["id"]
    assert rows["a"]["received_at"] == NOW and rows["a"]["payload"] == {"requestId": "a"}


PAYLOADS: list[dict[str, Any]] = [
    {"message": "héllo ✓ 日本", "n": 10**30, "f": 1e16, "neg": -0.5},
    {"nested": {"list": [1, None, True, "x"]}, "empty": {}},
    {"quote": 'a "quoted" \\ back\nslash', "tab": "\t"},
]
SQLITE_PAYLOADS: list[dict[str, Any]] = [  # JSON that PostgreSQL refuses, SQLite keeps
    {"price": math.inf, "other": -math.inf},
    {"message": "lone \ud800 surrogate", "ok": "fine"},
]


async def test_rows_read_back_as_written(engine: AsyncEngine) -> None:
    """The SQLite path converts the values itself (the columns' own bind processors): every
    type must read back through SQLAlchemy as the same value, as it does on PostgreSQL."""
    payloads = PAYLOADS + (SQLITE_PAYLOADS if engine.dialect.name == "sqlite" else [])
    moments = [
        NOW,
        datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 6, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5))),
    ]
    rows = event_rows(*(f"p{index}" for index in range(len(payloads))))
    for index, (row, payload) in enumerate(zip(rows, payloads, strict=True)):
        row |= {"payload": payload, "received_at": moments[index % len(moments)]}
        row |= {"raw_body": bytes(range(256)), "content_type": None, "duplicates": index}
    await insert(engine, rows)

    read_back = await stored_events(engine)
    for row in rows:
        found = read_back[row["dedup_key"]]
        assert found == row
        assert found["received_at"].tzinfo is not None


async def test_nan_reads_back_as_nan(sqlite_engine: AsyncEngine) -> None:
    rows = event_rows("nan")
    rows[0]["payload"] = {"totalPrice": math.nan}
    await insert(sqlite_engine, rows)
    async with sqlite_engine.connect() as conn:
        payload = await conn.scalar(select(EVENTS.c.payload).where(EVENTS.c.dedup_key == "nan"))
    assert math.isnan(payload["totalPrice"])


async def test_naive_datetimes_are_refused(engine: AsyncEngine) -> None:
    rows = event_rows("naive", at=datetime(2026, 3, 1, 12, 0))
    with pytest.raises((ValueError, StatementError), match="naive"):
        await insert(engine, rows)
    assert await stored_events(engine) == {}
