"""The console at a glance: the destinations summary table and its figures over the last hour,
the chart's points, plural forms, replay counts and broker attempts' outcomes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from html.parser import HTMLParser

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.console.pages import notice_text
from relay.console.wording import attempt_outcome, count_text, plural
from relay.outbox.tables import DEAD, PENDING
from relay.simulator import factories
from tests.console_support import ConsoleClient, console_client
from tests.relay_support import START, Clock, Relay, store_events

NOW = START  # the clock the console was logged in at (its sessions last an hour)
HOSTILE_NAME = '<img src=x onerror="alert(1)">'


class Table(HTMLParser):
    """The text of each cell of each body row of the first ``<table class="...{marker}...">``."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.rows: list[list[str]] = []
        self.inside = self.done = self.body = False
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "table" and self.marker in classes and not self.done:
            self.inside = True
        elif self.inside and tag == "tbody":
            self.body = True
        elif self.inside and self.body and tag == "tr":
            self.rows.append([])
        elif self.inside and self.body and tag == "td":
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.cell is not None:
            self.rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "table" and self.inside:
            self.inside, self.done = False, True

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def table_rows(page: str, marker: str = "summary") -> list[list[str]]:
    parser = Table(marker)
    parser.feed(page)
    return parser.rows


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def operator(engine: AsyncEngine, clock: Clock) -> AsyncIterator[ConsoleClient]:
    targets = {
        "api": "http: http://api.internal/hooks",
        "bus": "amqp: amqp://broker/vhost exchange 'events'",
        HOSTILE_NAME: "http: http://x.internal/",
    }
    async with console_client(
        engine, clock, ["api", "bus", "idle", HOSTILE_NAME], targets=targets
    ) as client:
        assert (await client.login()).status_code == 303
        yield client


async def seed_deliveries(
    engine: AsyncEngine, clock: Clock, names: list[str], request_id: str = "req-1"
) -> dict[str, str]:
    """One stored event with a delivery to each of ``names``: their ids by destination."""
    body = factories.sms_inbound({"requestId": request_id})
    await store_events(engine, [("/hooks/sms/inbound", body)], clock)
    destinations = {name: {"type": "http", "url": "http://127.0.0.1:9/"} for name in names}
    relay = Relay(engine, destinations, clock)
    try:
        due = await relay.route_all()
    finally:
        await relay.aclose()
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(outbox.DELIVERIES.c.destination, outbox.DELIVERIES.c.id).where(
                outbox.DELIVERIES.c.id.in_([d.id for d in due])
            )
        )
        return {name: delivery_id for name, delivery_id in rows}


async def seed_attempts(
    engine: AsyncEngine,
    delivery_id: str,
    attempts: list[tuple[datetime, float, int | None, str | None]],
) -> None:
    """Attempts of a delivery as (started, duration in ms, HTTP status, error)."""
    async with engine.begin() as conn:
        for number, (started, duration, status, error) in enumerate(attempts, 1):
            await conn.execute(
                insert(outbox.ATTEMPTS).values(
                    delivery_id=delivery_id,
                    number=number,
                    started_at=started,
                    duration_ms=duration,
                    status_code=status,
                    error=error,
                )
            )


async def test_the_summary_table_comes_first_with_each_destinations_last_hour(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = await seed_deliveries(engine, clock, ["api", "bus"])
    hour_ago = NOW - timedelta(hours=1)
    minute = timedelta(minutes=1)
    await seed_attempts(
        engine,
        ids["api"],
        [
            (hour_ago - minute, 9_999.0, 500, None),  # before the hour: not counted
            (hour_ago, 8_888.0, 500, None),  # the hour's first instant is outside it too
            (hour_ago + minute, 40.0, 200, None),
            (NOW - 30 * minute, 10.0, 200, None),
            (NOW - 20 * minute, 500.0, 503, "HTTP 503"),
            (NOW - 10 * minute, 30.0, 204, None),
            (NOW, 20.0, 200, None),  # now is inside the hour
        ],
    )
    await seed_attempts(  # a broker's attempts: no HTTP status, an error when it failed
        engine,
        ids["bus"],
        [(NOW - 5 * minute, 7.0, None, "connection refused"), (NOW - minute, 5.0, None, None)],
    )
    async with engine.begin() as conn:
        await conn.execute(
            update(outbox.DELIVERIES)
            .where(outbox.DELIVERIES.c.id == ids["bus"])
            .values(status=DEAD, next_attempt_at=None, finished_at=NOW)
        )

    page = (await operator.http.get("/console/destinations")).text
    assert page.index('class="list summary"') < page.index('<section class="destination"')
    rows = table_rows(page)
    by_name = {row[0]: row for row in rows}
    assert [row[0] for row in rows] == ["api", "bus", "idle", HOSTILE_NAME]
    # name, type, state, pending, dead, success rate, p50 (nearest rank: the 3rd of 5)
    assert by_name["api"] == ["api", "http", "healthy", "1", "0", "80.0 %", "30 ms"]
    assert by_name["bus"][1] == "amqp"
    assert by_name["bus"][3:] == ["0", "1", "50.0 %", "5 ms"]
    assert "1 dead in the last hour" in by_name["bus"][2]
    assert by_name["idle"] == ["idle", "-", "healthy", "0", "0", "-", "-"]
    assert "5 attempts, 80.0 % succeeded, p50 30 ms, mean 120 ms" in page
    assert "2 attempts, 50.0 % succeeded, p50 5 ms" in page

    clock.advance(timedelta(minutes=25))  # the hour moves on: four of api's attempts are left
    later = table_rows((await operator.http.get("/console/destinations")).text)
    assert later[0][5:] == ["75.0 %", "20 ms"]  # of 10, 20, 30 and 500 ms: the lower middle


async def test_the_summary_links_each_name_to_its_details_and_counts_to_the_list(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    page = (await operator.http.get("/console/destinations")).text
    assert '<a href="#destination-1">api</a>' in page
    assert '<section class="destination" id="destination-1">' in page
    assert 'href="/console/deliveries?status=dead&amp;destination=bus"' in page


async def test_hostile_names_and_huge_counts_stay_text(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = await seed_deliveries(engine, clock, [HOSTILE_NAME])
    await seed_attempts(engine, ids[HOSTILE_NAME], [(START, 1e12, 200, None)])
    page = (await operator.http.get("/console/destinations")).text
    assert HOSTILE_NAME not in page
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page
    assert table_rows(page)[3][-1] == "1000000000000 ms"
    assert count_text(12_345_678, "delivery") == "12,345,678 deliveries"


async def test_the_chart_marks_each_bucket_that_has_attempts(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = await seed_deliveries(engine, clock, ["api"])
    await seed_attempts(
        engine,
        ids["api"],
        [(NOW - timedelta(minutes=m), 10.0 * m, 200, None) for m in (1, 2, 26, 27, 50)],
    )
    page = (await operator.http.get("/console/destinations")).text
    assert page.count('<circle class="latency"') == 3  # three buckets with attempts
    assert page.count('<polyline class="latency" points="') == 1
    assert "2 attempts, 2 succeeded" in page  # a bucket's title, in words that read right


@pytest.mark.parametrize(
    ("number", "thing", "text"),
    [
        (0, "attempt", "0 attempts"),
        (1, "attempt", "1 attempt"),
        (2, "attempt", "2 attempts"),
        (1, "delivery", "1 delivery"),
        (12, "delivery", "12 deliveries"),
        (1, "consecutive failure", "1 consecutive failure"),
        (1_000, "day", "1,000 days"),
    ],
)
def test_plural_forms_read_right(number: int, thing: str, text: str) -> None:
    assert count_text(number, thing) == text
    assert plural("key") == "keys" and plural("newer delivery") == "newer deliveries"


def test_a_notice_names_what_the_action_made_due() -> None:
    assert notice_text("replayed", 12) == "Replayed 12 deliveries: they are due now."
    assert notice_text("replayed", 1) == "Replayed 1 delivery: it is due now."
    assert notice_text("replayed", None) == "Replayed: the deliveries are due now."
    assert notice_text("enabled", 1) == "Enabled: 1 held delivery released."
    assert notice_text("no such notice", 3) is None


async def test_a_replay_notice_says_how_many_were_replayed(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    for number in range(3):
        await seed_deliveries(engine, clock, ["api"], f"req-{number}")
        clock.advance(timedelta(seconds=1))
    async with engine.begin() as conn:
        await conn.execute(update(outbox.DELIVERIES).values(status=DEAD, next_attempt_at=None))
    done = await operator.act(
        "/console/deliveries/replay", destination="api", confirm="yes", count="3"
    )
    assert done.status_code == 303
    assert done.headers["location"] == (
        "/console/deliveries?status=dead&destination=api&notice=replayed&count=3"
    )
    shown = (await operator.http.get(done.headers["location"])).text
    assert "Replayed 3 deliveries: they are due now." in shown
    again = await operator.act("/console/deliveries/replay", confirm="yes", count="0")
    assert again.headers["location"] == "/console/deliveries?status=dead&notice=nothing"


@pytest.mark.parametrize("count", ["", "-1", "1e3", "12abc", "9" * 10, "<b>3</b>", "\uff13"])
async def test_a_notice_count_that_the_console_did_not_write_is_not_shown(
    operator: ConsoleClient, count: str
) -> None:
    page = await operator.http.get("/console/events", params={"notice": "replayed", "count": count})
    assert page.status_code == 200
    assert "Replayed: the deliveries are due now." in page.text
    assert "<b>3" not in page.text


async def test_broker_attempts_show_their_outcome(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = await seed_deliveries(engine, clock, ["bus"])
    await seed_attempts(
        engine, ids["bus"], [(START, 3.0, None, "connection refused"), (START, 2.0, None, None)]
    )
    async with engine.begin() as conn:
        await conn.execute(update(outbox.DELIVERIES).values(status="succeeded", attempts=2))
        event_id = await conn.scalar(select(outbox.DELIVERIES.c.event_id))
    page = (await operator.http.get(f"/console/events/{event_id}")).text
    outcomes = [row[2] for row in table_rows(page, "timeline")]
    assert outcomes == ["failed", "delivered"]
    assert "· 2 attempts" in page
    listed = table_rows((await operator.http.get("/console/deliveries")).text, "list")
    assert listed[0][6] == "delivered"
    assert attempt_outcome(502, "HTTP 502") == "502"


async def test_one_attempt_reads_as_one_attempt(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = await seed_deliveries(engine, clock, ["api"])
    await seed_attempts(engine, ids["api"], [(START, 3.0, 500, "HTTP 500")])
    async with engine.begin() as conn:
        await conn.execute(update(outbox.DELIVERIES).values(status=PENDING, attempts=1))
        event_id = await conn.scalar(select(outbox.DELIVERIES.c.event_id))
    page = (await operator.http.get(f"/console/events/{event_id}")).text
    assert "· 1 attempt ·" in page and "1 attempts" not in page
