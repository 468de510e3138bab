"""The console's lists at scale: keyset pages, their indexes, their plans and what they read.

Speed itself is measured by ``scripts/bench_console.py``; these tests hold what makes it: every
list and filter walks an index in the list's order (no sort, no table scan) on both backends,
pages follow each other by a cursor, and no list reads a stored body.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from click.testing import CliRunner
from sqlalchemy import event, insert, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import new_ids
from receivers.store import ReceivedEvent, RejectedBody, create_engine
from receivers.store import queries as store_queries
from relay.cli import main
from relay.console import queries
from relay.console.filters import Cursor, DeliveryFilter, EventFilter
from relay.outbox import DELIVERIES, ROUTED
from relay.outbox.tables import DEAD, HELD, PENDING, SUCCEEDED
from relay.store import inspect as relay_inspect
from relay.store import migrate
from tests.conftest import TOKEN, create_postgres_database, drop_postgres_database
from tests.console_support import ConsoleClient, console_client
from tests.relay_support import START, Clock

EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__
PAGE = queries.PAGE_SIZE
EVENT_LINK = re.compile(r'href="/console/events/([0-9a-f-]{36})"')
DELIVERY_FORM = re.compile(r'action="/console/deliveries/([0-9a-f-]{36})/replay"')
REJECTED_LINK = re.compile(r'href="/console/quarantine/([0-9a-f-]{36})"')
NEXT = re.compile(r'<a href="(/console/[a-z]+\?[^"]*)" rel="next">')
BODY_COLUMNS = re.compile(r"\b(raw_body|payload)\b")
CONSOLE_INDEXES = {
    ("received_events", "ix_received_events_received_at"): ["received_at", "id"],
    ("received_events", "ix_received_events_kind"): ["kind", "received_at", "id"],
    ("received_events", "ix_received_events_kind_event"): [
        "kind",
        "event_name",
        "received_at",
        "id",
    ],
    ("received_events", "ix_received_events_event"): ["event_name", "received_at", "id"],
    ("received_events", "ix_received_events_source"): ["source", "received_at", "id"],
    ("received_events", "ix_received_events_platform_id"): ["platform_id", "received_at", "id"],
    ("received_events", "ix_received_events_listed"): [  # SQLite only
        "id",
        "source",
        "kind",
        "event_name",
        "platform_id",
        "received_at",
        "duplicates",
    ],
    ("deliveries", "ix_deliveries_created"): ["created_at", "id"],
    ("deliveries", "ix_deliveries_status_created"): ["status", "created_at", "id"],
    ("deliveries", "ix_deliveries_destination_created"): ["destination", "created_at", "id"],
    ("deliveries", "ix_deliveries_destination_status"): [
        "destination",
        "status",
        "created_at",
        "id",
    ],
    ("rejected_bodies", "ix_rejected_bodies_last_seen_at"): ["last_seen_at", "id"],
}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def operator(engine: AsyncEngine, clock: Clock) -> AsyncIterator[ConsoleClient]:
    async with console_client(engine, clock, ["sink", "other"]) as client:
        answer = await client.login()
        assert answer.status_code == 303, answer.text
        yield client


# --- rows written straight to the store (many, some with the same time) ----------------------


async def add_events(
    engine: AsyncEngine, moments: list[datetime], kind: str = "sms.inbound"
) -> list[str]:
    """One event per moment (equal moments allowed); their ids."""
    rows = []
    for number, moment in enumerate(moments):
        (event_id,) = new_ids(moment, 1)
        rows.append(
            {
                "id": event_id,
                "source": "default",
                "kind": kind,
                "dedup_key": f"{event_id}|{number}",
                "received_at": moment,
                "payload": {"requestId": event_id},
                "raw_body": b"{}",
                "method": "POST",
                "duplicates": 0,
                "platform_id": event_id,
                "event_name": "delivered",
            }
        )
    async with engine.begin() as conn:
        await conn.execute(insert(EVENTS), rows)
    return [row["id"] for row in rows]


async def add_deliveries(
    engine: AsyncEngine,
    event_ids: list[str],
    moments: list[datetime],
    status: str = DEAD,
    destination: str = "sink",
) -> list[str]:
    """One delivery per event, created at its moment; their ids."""
    rows = [
        {
            "id": new_ids(moment, 1)[0],
            "event_id": event_id,
            "destination": destination,
            "policy": "default",
            "status": status,
            "attempts": 1,
            "schedule_base": 0,
            "created_at": moment,
        }
        for event_id, moment in zip(event_ids, moments, strict=True)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(DELIVERIES), rows)
    return [row["id"] for row in rows]


async def add_rejected(engine: AsyncEngine, moments: list[datetime]) -> list[str]:
    rows = [
        {
            "id": new_ids(moment, 1)[0],
            "source": "default",
            "path": "/hooks/sms/dlr",
            "kind": "sms.dlr",
            "status": 400,
            "reason": "not JSON",
            "errors": [],
            "body_hash": f"sha256:{number:064x}",
            "raw_body": b"{",
            "received_at": moment,
            "last_seen_at": moment,
            "count": 1,
        }
        for number, moment in enumerate(moments)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(REJECTED), rows)
    return [row["id"] for row in rows]


def tied_moments(count: int) -> list[datetime]:
    """``count`` moments in three runs of equal times (pages end inside a run)."""
    return [START - timedelta(seconds=number % 3) for number in range(count)]


def newest_first(ids: list[str], moments: list[datetime]) -> list[str]:
    return [i for _, i in sorted(zip(moments, ids, strict=True), reverse=True)]


async def walk(operator: ConsoleClient, url: str, row: re.Pattern[str]) -> list[list[str]]:
    """Every page of a list from ``url`` on, following its "Older" link: each page's row ids."""
    pages = []
    while url:
        answer = await operator.http.get(url)
        assert answer.status_code == 200, answer.text
        pages.append(list(dict.fromkeys(row.findall(answer.text))))
        found = NEXT.search(answer.text)
        url = found[1].replace("&amp;", "&") if found else ""
    return pages


# --- keyset pages ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/console/events", "/console/events?kind=sms.inbound"])
async def test_event_pages_with_equal_times_have_no_gaps_or_repeats(
    engine: AsyncEngine, operator: ConsoleClient, path: str
) -> None:
    moments = tied_moments(2 * PAGE + 7)
    ids = await add_events(engine, moments)
    await add_events(engine, moments[:5], kind="sms.dlr")  # other kinds interleaved
    pages = await walk(operator, path, EVENT_LINK)
    listed = [i for page in pages for i in page]
    if "kind" in path:
        assert [len(page) for page in pages] == [PAGE, PAGE, 7]
        assert listed == newest_first(ids, moments)
    else:
        assert len(listed) == len(set(listed)) == 2 * PAGE + 12


@pytest.mark.parametrize("path", ["/console/deliveries", "/console/deliveries?status=dead"])
async def test_delivery_pages_with_equal_times_have_no_gaps_or_repeats(
    engine: AsyncEngine, operator: ConsoleClient, path: str
) -> None:
    moments = tied_moments(2 * PAGE + 7)
    events = await add_events(engine, moments)
    ids = await add_deliveries(engine, events, moments)
    pages = await walk(operator, path, DELIVERY_FORM)
    assert [len(page) for page in pages] == [PAGE, PAGE, 7]
    assert [i for page in pages for i in page] == newest_first(ids, moments)


async def test_quarantine_pages_with_equal_times_have_no_gaps_or_repeats(
    engine: AsyncEngine, operator: ConsoleClient
) -> None:
    moments = tied_moments(2 * PAGE + 7)
    ids = await add_rejected(engine, moments)
    pages = await walk(operator, "/console/quarantine", REJECTED_LINK)
    assert [len(page) for page in pages] == [PAGE, PAGE, 7]
    assert [i for page in pages for i in page] == newest_first(ids, moments)


LISTS = ["/console/events", "/console/deliveries", "/console/quarantine"]
UUID = "0190a0b0-0000-7000-8000-000000000001"


HOSTILE_CURSORS = [
    "not-a-cursor",
    "~",
    f"~{UUID}",
    "12~",
    f"12~{UUID.upper()}",
    f"12~{UUID}x",
    f"99999999999999999999~{UUID}",
    f"-99999999999999999999~{UUID}",
    f"{'9' * 40}~{UUID}",
    "9" * 60_000,  # about as long as a URL can be
    f"1\x00~{UUID}",
    f"12~{UUID}\u00e9",
]


@pytest.mark.parametrize("path", LISTS)
async def test_a_hostile_page_cursor_is_a_400_problem(operator: ConsoleClient, path: str) -> None:
    for before in HOSTILE_CURSORS:
        answer = await operator.http.get(path, params={"before": before})
        assert answer.status_code == 400, (before[:50], answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["detail"].startswith("before:")


@pytest.mark.parametrize("path", LISTS)
async def test_a_repeated_or_badly_encoded_cursor_is_a_400_problem(
    operator: ConsoleClient, path: str
) -> None:
    for query in (f"before=1~{UUID}&before=2~{UUID}", "before=%ff%fe"):
        answer = await operator.http.get(f"{path}?{query}")
        assert answer.status_code == 400, (query, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("path", LISTS)
async def test_an_empty_cursor_is_the_first_page_and_one_past_every_row_an_empty_page(
    engine: AsyncEngine, operator: ConsoleClient, path: str
) -> None:
    moments = tied_moments(3)
    events = await add_events(engine, moments)
    await add_deliveries(engine, events, moments)
    await add_rejected(engine, moments)
    first = (await operator.http.get(path)).text
    for empty in ("", "   "):
        assert (await operator.http.get(path, params={"before": empty})).text == first
    oldest = Cursor(datetime(1970, 1, 1, tzinfo=UTC), UUID).encode()
    page = await operator.http.get(path, params={"before": oldest})
    assert page.status_code == 200
    pattern = {"events": EVENT_LINK, "deliveries": DELIVERY_FORM, "quarantine": REJECTED_LINK}
    assert pattern[path.rsplit("/", 1)[1]].findall(page.text) == []


# --- the indexes and the plans ----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
async def new_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database of this test's own, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'new.db'}"
        return
    name, url = await create_postgres_database("relay_console_indexes")
    try:
        yield url
    finally:
        await drop_postgres_database(name)


async def indexes(engine: AsyncEngine) -> dict[tuple[str, str], list[str]]:
    def read(sync: Any) -> dict[tuple[str, str], list[str]]:
        found = inspect(sync)
        return {
            (table, index["name"]): list(index["column_names"])
            for table in ("received_events", "deliveries", "rejected_bodies")
            for index in found.get_indexes(table)
        }

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def test_the_migration_says_nothing_of_the_indexes_on_a_new_database(
    new_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(new_database_url)
    try:
        with caplog.at_level(logging.INFO, logger="relay.migrate"):
            await migrate.upgrade(engine)
        assert ("deliveries", "ix_deliveries_created") in await indexes(engine)
    finally:
        await engine.dispose()
    said = [r.getMessage() for r in caplog.records if r.name == "relay.migrate"]
    assert not [line for line in said if "list indexes" in line]


async def test_the_migration_builds_an_index_per_list_filter_and_says_so(
    new_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(new_database_url)
    try:
        await migrate.upgrade(engine, "0005")
        events = await add_events(engine, tied_moments(3))
        await add_deliveries(engine, events, tied_moments(3))
        before = await indexes(engine)
        assert before[("deliveries", "ix_deliveries_status_created")] == ["status", "created_at"]
        with caplog.at_level(logging.INFO, logger="relay.migrate"):
            await migrate.upgrade(engine)
        found = await indexes(engine)
        expected = dict(CONSOLE_INDEXES)
        if engine.dialect.name != "sqlite":
            expected[("received_events", "ix_received_events_listed")] = None
        assert {key: found.get(key) for key in CONSOLE_INDEXES} == expected
        messages = [r.getMessage() for r in caplog.records if r.name == "relay.migrate"]
        assert messages[0].startswith(
            "building the console's list indexes over 3 events and 3 deliveries"
        )
        assert re.fullmatch(r"built the console's list indexes in \d+\.\d s", messages[1])

        async with engine.begin() as conn:
            await conn.run_sync(
                lambda sync: command.downgrade(migrate.alembic_config(sync), "0005")
            )
        assert await indexes(engine) == before
    finally:
        await engine.dispose()


@contextmanager
def statements(engine: Engine | None = None) -> Iterator[list[tuple[str, Any]]]:
    """The SQL statements (and parameters) sent meanwhile by ``engine`` (or by any engine)."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        seen.append((sql, parameters))

    target: Any = engine if engine is not None else Engine
    event.listen(target, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(target, "before_cursor_execute", capture)


async def plan(
    engine: AsyncEngine, call: Callable[[], Awaitable[Any]], as_planned: bool = False
) -> list[str]:
    """The plan lines of the one statement ``call`` sends, as the backend would run it with
    only index paths left open: SQLite's EXPLAIN QUERY PLAN; PostgreSQL's EXPLAIN with
    sequential scans, sorts, bitmap scans and hash or merge joins priced out, so that a Sort
    or Seq Scan node means no index can give the rows in the list's order (``as_planned``:
    with the planner's own choices)."""
    with statements(engine.sync_engine) as seen:
        await call()
    assert len(seen) == 1, seen
    sql, parameters = seen[0]
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, parameters)
            return [row[-1] for row in rows]
        priced_out = (
            () if as_planned else ("seqscan", "sort", "bitmapscan", "hashjoin", "mergejoin")
        )
        for setting in priced_out:
            await conn.exec_driver_sql(f"SET LOCAL enable_{setting} = off")
        rows = await conn.exec_driver_sql("EXPLAIN " + sql, parameters)
        return [row[0] for row in rows]


def sample(name: str) -> Any:
    """A value for each filter field (a new field must get one here)."""
    values = {
        "source": "default",
        "kind": "sms.dlr",
        "event": "delivered",
        "platform_id": "req-1",
        "status": DEAD,
        "destination": "sink",
        "since": START - timedelta(days=1),
        "until": START,
        "before": Cursor(START, UUID),
    }
    return values[name]


def one_filter_each(empty: Any) -> list[tuple[str, Any]]:
    """The filter with nothing set, then each field alone, then each field with a cursor:
    (the fields set, the filter)."""
    alone = [(f.name, replace(empty, **{f.name: sample(f.name)})) for f in fields(empty)]
    deeper = [
        (f"{name}+before", replace(f, before=sample("before")))
        for name, f in alone
        if name != "before"
    ]
    return [("", empty), *alone, *deeper]


Call = Callable[[AsyncEngine], Awaitable[Any]]
LIST_CALLS: list[tuple[str, bool, Call]] = [
    # (name, filtered: a condition narrows the index walk, the call)
    *(
        (f"events({name})", bool(name), lambda e, where=where: queries.events_page(e, where))
        for name, where in one_filter_each(EventFilter())
    ),
    *(
        (f"deliveries({name})", bool(name), lambda e, w=where: queries.deliveries_page(e, w))
        for name, where in one_filter_each(DeliveryFilter())
    ),
    ("quarantine", False, lambda e: queries.quarantine_page(e, None)),
    ("quarantine(before)", True, lambda e: queries.quarantine_page(e, sample("before"))),
    ("events list", False, lambda e: store_queries.list_events(e)),
    ("events list --kind", True, lambda e: store_queries.list_events(e, kind="sms.dlr")),
    ("events list --source", True, lambda e: store_queries.list_events(e, source="default")),
    ("rejected list", False, lambda e: store_queries.list_rejected(e)),
    ("deliveries list", False, lambda e: relay_inspect.list_deliveries(e)),
    ("deliveries list --status", True, lambda e: relay_inspect.list_deliveries(e, status=DEAD)),
    (
        "deliveries list --destination",
        True,
        lambda e: relay_inspect.list_deliveries(e, destination="sink"),
    ),
]
ORDER_SORTS = re.compile(r"TEMP B-TREE FOR (RIGHT PART OF |LAST TERM OF )?ORDER BY|\bSort\b")
LISTED_TABLE_SCAN = re.compile(r"^\s*SCAN (received_events|deliveries|rejected_bodies)\b")


@pytest.mark.parametrize(
    ("name", "filtered", "call"), LIST_CALLS, ids=[name for name, _, _ in LIST_CALLS]
)
async def test_every_list_and_filter_reads_an_index_in_the_lists_order(
    engine: AsyncEngine, name: str, filtered: bool, call: Call
) -> None:
    """No sort (the index gives the order) and no table scan: an unfiltered list walks its
    order's index from the newest row; a filtered one searches an index by its conditions."""
    lines = await plan(engine, lambda: call(engine))
    text = "\n".join(lines)
    assert not ORDER_SORTS.search(text), text
    assert "Seq Scan" not in text, text
    for line in lines:
        if LISTED_TABLE_SCAN.match(line):
            assert "USING" in line and not filtered, text


@pytest.mark.parametrize(
    ("name", "call"),
    [(name, call) for name, _, call in LIST_CALLS if name.startswith(("events(", "deliveries("))],
    ids=[name for name, _, _ in LIST_CALLS if name.startswith(("events(", "deliveries("))],
)
async def test_on_sqlite_the_console_lists_read_events_from_indexes_alone(
    sqlite_engine: AsyncEngine, name: str, call: Call
) -> None:
    """SQLite keeps the columns after an event's payload and raw body at the end of their
    overflow pages: a list that read an event's row would read its whole body."""
    lines = await plan(sqlite_engine, lambda: call(sqlite_engine))
    events = [line for line in lines if re.match(r"\s*(SEARCH|SCAN) received_events\b", line)]
    assert events and all("COVERING INDEX" in line for line in events), "\n".join(lines)


async def test_counts_read_an_index_and_no_table(engine: AsyncEngine) -> None:
    for _, where in one_filter_each(DeliveryFilter(status=DEAD)):
        lines = await plan(engine, lambda where=where: queries.count_deliveries(engine, where))
        text = "\n".join(lines)
        assert "Seq Scan" not in text and not re.search(r"SCAN deliveries$", text, re.M), text
    lines = await plan(
        engine, lambda: queries.backlog_counts(engine, ["sink", "other"], [PENDING, HELD, DEAD])
    )
    text = "\n".join(lines)
    assert "Seq Scan" not in text and not re.search(r"SCAN deliveries$", text, re.M), text


async def test_live_counts_read_an_index_and_no_table(engine: AsyncEngine) -> None:
    """A page's live count of rows above its newest one searches the list's index from that
    row up, with each filter, as the page itself reads it."""
    after = Cursor(START, UUID)
    for empty in (EventFilter(), DeliveryFilter()):
        for name, where in one_filter_each(empty):
            if "before" in name:
                continue
            for cursor in (None, after):
                lines = await plan(
                    engine, lambda w=where, c=cursor: queries.newer_count(engine, w, c)
                )
                text = "\n".join(lines)
                assert "Seq Scan" not in text, text
                assert not re.search(r"SCAN (received_events|deliveries)$", text, re.M), text


async def test_the_p50_reads_the_last_hours_attempts_by_index(engine: AsyncEngine) -> None:
    """The destinations page's medians read the last hour's attempts through their time
    index (and each one's delivery by its id), never every attempt or delivery kept."""
    lines = await plan(engine, lambda: queries.median_latency(engine, START))
    text = "\n".join(lines)
    assert "Seq Scan" not in text, text
    by_time = r"(USING INDEX|Index Scan using) ix_delivery_attempts_started_at"
    assert re.search(by_time, text), text
    assert not re.search(r"SCAN (delivery_attempts|deliveries)\b(?! USING)", text), text


# --- what lists read ---------------------------------------------------------------------------


async def test_no_console_list_reads_a_payload_or_a_raw_body(
    engine: AsyncEngine, operator: ConsoleClient
) -> None:
    moments = tied_moments(3)
    events = await add_events(engine, moments)
    await add_deliveries(engine, events, moments)
    await add_rejected(engine, moments)
    pages = [
        "/console/events",
        "/console/events?kind=sms.inbound&event=delivered&source=default&since=2026-01-01",
        f"/console/events?q={events[0]}",
        "/console/deliveries",
        "/console/deliveries?status=dead&destination=sink",
        "/console/quarantine",
        "/console/destinations",
    ]
    with statements(engine.sync_engine) as seen:
        for path in pages:
            assert (await operator.http.get(path)).status_code == 200
        assert (await operator.act("/console/deliveries/replay")).status_code == 200
    assert seen
    assert [sql for sql, _ in seen if BODY_COLUMNS.search(sql)] == []


def test_the_list_commands_read_no_raw_body_and_no_payload_they_do_not_print(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"

    async def fill() -> list[str]:
        engine = create_engine(url)
        try:
            await migrate.upgrade(engine)
            await add_rejected(engine, tied_moments(3))
            return await add_events(engine, tied_moments(3))
        finally:
            await engine.dispose()

    events = asyncio.run(fill())
    config = tmp_path / "relay.toml"
    config.write_text(f'database_url = "{url}"\n[sources.default]\ntoken = "{TOKEN}"\n')

    def run(*args: str) -> tuple[str, list[str]]:
        """The command's output and the statements it sent to list."""
        with statements() as seen:
            result = CliRunner().invoke(main, [*args, "--config", str(config)])
        assert result.exit_code == 0, result.output
        listing = re.compile(r"FROM (received_events|rejected_bodies)\s+ORDER BY")
        return result.output, [sql for sql, _ in seen if listing.search(sql)]

    output, sent = run("events", "list")
    assert events[0] in output and sent
    assert [sql for sql in sent if BODY_COLUMNS.search(sql)] == []
    output, sent = run("events", "list", "--json")  # the JSON shows payloads, never raw bodies
    assert '"payload"' in output and sent
    assert [sql for sql in sent if "raw_body" in sql] == []
    output, sent = run("rejected", "list")
    assert "not JSON" in output and sent
    assert [sql for sql in sent if "raw_body" in sql] == []


async def test_the_destinations_page_counts_a_backlog_up_to_a_cap_and_the_replay_exactly(
    engine: AsyncEngine, operator: ConsoleClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "BACKLOG_CAP", 3)
    moments = tied_moments(7)
    events = await add_events(engine, moments)
    await add_deliveries(engine, events[:5], moments[:5], status=DEAD)
    await add_deliveries(engine, events[5:], moments[5:], status=PENDING)
    await add_deliveries(engine, events[5:6], moments[5:6], SUCCEEDED, destination="other")
    page = (await operator.http.get("/console/destinations")).text
    assert re.search(r"status=dead&amp;destination=sink\">3\+</a>", page), page
    assert re.search(r"status=pending&amp;destination=sink\">2</a>", page), page
    assert re.search(r"status=held&amp;destination=sink\">0</a>", page), page
    confirm = await operator.act("/console/deliveries/replay", destination="sink")
    assert '<strong class="count">5</strong>' in confirm.text


async def test_the_waiting_in_line_flag_reads_one_platform_id_range_not_every_event(
    engine: AsyncEngine,
) -> None:
    """A pending delivery of a per-key destination waits while an earlier event of its
    platform id is unrouted: that check must look up its own event, then the range of its
    platform id, whatever the planner's estimates (a hash anti-join of every event against
    routed_events took 1.5 s a page at a million events)."""
    moments = [START - timedelta(seconds=n) for n in range(3000)]
    events = await add_events(engine, moments)
    async with engine.begin() as conn:
        await conn.execute(
            insert(ROUTED), [{"event_id": e, "routed_at": START, "deliveries": 1} for e in events]
        )
        await conn.execute(
            insert(DELIVERIES),
            [
                {
                    "id": new_ids(START, 1)[0],
                    "event_id": events[0],
                    "destination": "sink",
                    "policy": "default",
                    "status": PENDING,
                    "created_at": START,
                    "order_key": "k",
                    "arrived_at": START,
                }
            ],
        )
        await conn.exec_driver_sql("ANALYZE")
    lines = await plan(engine, lambda: queries.deliveries_page(engine, DeliveryFilter()), True)
    text = "\n".join(lines)
    whole_table = r"(Seq Scan on|^\s*SCAN) (received_events|routed_events|earlier|mine)\b|Hash"
    assert not re.search(whole_table, text, re.M), text
