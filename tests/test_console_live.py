"""The live counts of the events and deliveries pages: what they count, the endpoint a page's
script polls (its session, its methods, hostile queries) and the one script the CSP lets run."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.console.script import LIVE_SCRIPT, script_hash
from relay.outbox.tables import DEAD
from relay.simulator import factories
from tests.console_support import ConsoleClient, console_client
from tests.relay_support import Clock, Relay, store_events

LIVE = re.compile(r'<p class="live" data-counts="([^"]*)" data-every="([0-9]+)">')
SCRIPTS = re.compile(r"<script([^>]*)>(.*?)</script>", re.DOTALL)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def console(engine: AsyncEngine, clock: Clock) -> AsyncIterator[ConsoleClient]:
    async with console_client(engine, clock, ["sink", "other"]) as client:
        yield client


@pytest.fixture
async def operator(console: ConsoleClient) -> ConsoleClient:
    assert (await console.login()).status_code == 303
    return console


async def sms(engine: AsyncEngine, clock: Clock, *request_ids: str) -> list[str]:
    """Stored events, each a second after the last, routed to ``sink`` and ``other``."""
    ids = []
    for request_id in request_ids:
        body = factories.sms_inbound({"requestId": request_id})
        ids += await store_events(engine, [("/hooks/sms/inbound", body)], clock)
        clock.advance(timedelta(seconds=1))
    destinations = {
        name: {"type": "http", "url": "http://127.0.0.1:9/"} for name in ("sink", "other")
    }
    relay = Relay(engine, destinations, clock)
    try:
        await relay.route_all()
    finally:
        await relay.aclose()
    return ids


def counts_url(page: str) -> str:
    found = LIVE.search(page)
    assert found is not None, "the page has no live counts"
    return found[1].replace("&amp;", "&")


async def test_the_events_page_counts_events_stored_after_it_was_served(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    await sms(engine, clock, "req-1", "req-2")
    page = (await operator.http.get("/console/events")).text
    assert '<span data-count="pending">4</span> pending' in page  # two events, two destinations
    url = counts_url(page)
    assert url.startswith("/console/counts?list=events&after=")
    assert (await operator.http.get(url)).json() == {
        "pending": "4",
        "held": "0",
        "dead": "0",
        "newer": "",
    }
    await sms(engine, clock, "req-3")
    assert (await operator.http.get(url)).json()["newer"] == "1 newer event"
    await sms(engine, clock, "req-4", "req-5")
    counts = (await operator.http.get(url)).json()
    assert counts == {"pending": "10", "held": "0", "dead": "0", "newer": "3 newer events"}


async def test_the_counts_follow_the_pages_filter(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    await sms(engine, clock, "req-1", "req-2")
    async with engine.begin() as conn:
        await conn.execute(
            update(outbox.DELIVERIES)
            .where(outbox.DELIVERIES.c.destination == "sink")
            .values(status=DEAD, next_attempt_at=None)
        )
    page = (await operator.http.get("/console/deliveries?destination=sink&status=dead")).text
    url = counts_url(page)
    assert "destination=sink" in url and "status=dead" in url
    assert (await operator.http.get(url)).json() == {
        "pending": "0",
        "held": "0",
        "dead": "2",
        "newer": "",
    }
    await sms(engine, clock, "req-3")  # a pending delivery to sink: not dead, not newer here
    assert (await operator.http.get(url)).json()["newer"] == ""
    everything = counts_url((await operator.http.get("/console/deliveries")).text)
    assert (await operator.http.get(everything)).json()["pending"] == "4"
    empty = counts_url((await operator.http.get("/console/events?q=nobody")).text)
    assert "after=" not in empty  # an empty page counts every matching row
    await sms(engine, clock, "nobody")
    assert (await operator.http.get(empty)).json()["newer"] == "1 newer event"


async def test_a_deeper_page_shows_no_newer_count(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    page = (await operator.http.get("/console/events?before=1000~" + "0" * 36)).text
    assert 'data-count="newer"' not in page
    assert 'data-count="pending"' in page


async def test_counts_want_the_pages_session(
    engine: AsyncEngine, clock: Clock, console: ConsoleClient
) -> None:
    answer = await console.http.get("/console/counts?list=events")
    assert answer.status_code == 403  # not a redirect: a script cannot log in
    assert answer.headers["content-type"] == "application/problem+json"
    assert "location" not in answer.headers
    await console.login()
    assert (await console.http.get("/console/counts?list=events")).status_code == 200
    await console.act("/console/logout")
    assert (await console.http.get("/console/counts?list=events")).status_code == 403


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_counts_refuse_other_methods(operator: ConsoleClient, method: str) -> None:
    answer = await operator.http.request(method, "/console/counts?list=events")
    assert answer.status_code == 405
    assert answer.headers["content-type"] == "application/problem+json"
    assert set(answer.headers["allow"].split(", ")) == {"GET", "HEAD"}


@pytest.mark.parametrize(
    "query",
    [
        "",
        "list=",
        "list=quarantine",
        "list=events&list=events",
        "list=" + "e" * 10_000,
        "list=events&after=yesterday",
        "list=events&after=" + "9" * 30 + "~" + "0" * 36,
        "list=events&kind=<script>",
        "list=deliveries&destination=nobody",
        "list=deliveries&status=" + "x" * 500,
        "list=events&since=%ff%fe",
        "list=events&" + "&".join(f"f{i}=1" for i in range(100)),
    ],
)
async def test_hostile_count_queries_are_a_400_problem(operator: ConsoleClient, query: str) -> None:
    answer = await operator.http.get(f"/console/counts?{query}")
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"
    assert "<script>" not in answer.text


async def test_a_huge_backlog_shows_as_its_cap(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay.console import queries

    monkeypatch.setattr(queries, "BACKLOG_CAP", 2)
    await sms(engine, clock, "req-1", "req-2", "req-3")
    counts = (await operator.http.get("/console/counts?list=events")).json()
    assert counts["pending"] == "4+"  # 2 destinations, each counted up to the cap
    assert counts["newer"] == "2+ newer events"


async def test_only_the_consoles_own_script_runs_and_only_by_its_hash(
    operator: ConsoleClient,
) -> None:
    for path in ("/console/events", "/console/deliveries"):
        answer = await operator.http.get(path)
        scripts = SCRIPTS.findall(answer.text)
        assert [(attributes, text) for attributes, text in scripts] == [("", LIVE_SCRIPT)]
        policy = answer.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["script-src"] == script_hash(LIVE_SCRIPT)
        assert directives["connect-src"] == "'self'"
        assert "unsafe" not in policy
    for path in ("/console/destinations", "/console/quarantine", "/console/login"):
        assert "<script" not in (await operator.http.get(path)).text
    assert "innerHTML" not in LIVE_SCRIPT and "eval" not in LIVE_SCRIPT
