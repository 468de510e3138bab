"""The console's destination health follows recent outcomes: "healthy" only with no pause, no
hold, no consecutive failures, nothing dead in the last hour and nothing retrying."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.console.health import Problem, Recent, problems
from relay.delivery.breaker import DestinationHealth
from relay.simulator import factories
from tests.console_support import ConsoleClient, console_client
from tests.relay_support import START, Clock, Relay, store_events
from tests.support import Answer, Sink

TEN_MIN = timedelta(minutes=10)
BADGES = re.compile(r"<h2>(\S+) (.*?)</h2>")
TAG = re.compile(r"<[^>]+>")


def texts(found: list[Problem]) -> list[str]:
    return [problem.text for problem in found]


def test_healthy_only_when_nothing_says_otherwise_and_each_reason_is_named() -> None:
    assert problems(DestinationHealth(), Recent(), START) == []
    assert texts(problems(DestinationHealth(consecutive_failures=1), Recent(), START)) == [
        "failing: 1 consecutive failure"
    ]
    assert texts(problems(DestinationHealth(), Recent(dead=3), START)) == [
        "3 dead in the last hour"
    ]
    assert texts(problems(DestinationHealth(), Recent(retrying=1), START)) == [
        "1 delivery retrying"
    ]
    paused = DestinationHealth(consecutive_failures=100, paused_until=START + TEN_MIN)
    assert texts(problems(paused, Recent(dead=2, retrying=7), START)) == [
        "breaker open",
        "failing: 100 consecutive failures",
        "2 dead in the last hour",
        "7 deliveries retrying",
    ]
    assert texts(problems(paused, Recent(), START + TEN_MIN)) == [
        "failing: 100 consecutive failures"  # the pause is over, the failures are not
    ]
    held = DestinationHealth(disabled=True, paused_until=START + TEN_MIN)
    assert texts(problems(held, Recent(), START)) == ["held"]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def operator(engine: AsyncEngine, clock: Clock) -> AsyncIterator[ConsoleClient]:
    async with console_client(engine, clock, ["fine", "down", "refusing", "dying"]) as console:
        assert (await console.login()).status_code == 303
        yield console


async def badges(operator: ConsoleClient) -> dict[str, str]:
    page = (await operator.http.get("/console/destinations")).text
    return {
        name: " | ".join(TAG.sub("", badge).strip() for badge in re.findall(r"<span.*?</span>", b))
        for name, b in BADGES.findall(page)
    }


async def test_the_destinations_page_says_healthy_only_of_the_destination_that_is(
    engine: AsyncEngine, clock: Clock, sink: Sink, operator: ConsoleClient
) -> None:
    sink.answers = {"/down": Answer(503), "/refusing": Answer(500), "/dying": Answer(500)}
    relay = Relay(
        engine,
        {
            name: {"type": "http", "url": sink.url(f"/{name}"), "policy": policy}
            for name, policy in (
                ("fine", "standard"),
                ("down", "standard"),
                ("refusing", "standard"),
                ("dying", "once"),
            )
        },
        clock,
        {"once": {"type": "delays", "delays": ["1s"], "max_attempts": 1}},
    )
    try:
        await store_events(
            engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(2)], clock
        )
        due = await relay.route_all()
        await relay.deliverer.attempt_many([d.id for d in due])
    finally:
        await relay.aclose()

    assert await badges(operator) == {
        "fine": "healthy",
        "down": "failing: 2 consecutive failures | 2 deliveries retrying",
        "refusing": "2 deliveries retrying",  # a 500 is not counted by the breaker, but shown
        "dying": "2 dead in the last hour",
    }
    clock.advance(timedelta(minutes=61))
    assert (await operator.login()).status_code == 303  # the test's sessions last an hour
    assert (await badges(operator))["dying"] == "healthy"  # died more than an hour ago
