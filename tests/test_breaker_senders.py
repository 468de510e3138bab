"""No sender can pause a destination: the breaker counts the failures that say the destination
is down, not those one message got (a consumer choking on some SMS), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from relay import outbox
from relay.outbox.tables import DEAD, SUCCEEDED
from relay.simulator import factories
from relay.store import inspect
from tests.relay_support import Clock, Relay, store_events
from tests.support import Answer, Sink, free_port, serving

SECOND = timedelta(seconds=1)
MARKER = "\u2620 poison"
PAUSING = {
    "pausing": {
        "type": "delays",
        "delays": ["10s"],
        "then": "10s",
        "give_up_after": "1h",
        "pause_after": 3,
        "pause_for": "10m",
    }
}


class PickySink(Sink):
    """A consumer with a bug: it answers 500 to inbound SMS whose text holds :data:`MARKER`,
    at once, and takes every other message."""

    async def _endpoint(self, request: Request) -> Response:
        answer = await super()._endpoint(request)
        payload = json.loads(self.requests[-1].body)["payload"]
        if MARKER in str(payload.get("message", "")):
            return Response(b"cannot parse this one", status_code=500)
        return answer


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def picky() -> AsyncIterator[PickySink]:
    async with serving(PickySink()) as running:
        yield running


@pytest.fixture
async def relays() -> AsyncIterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for relay in made:
        await relay.aclose()


def sms(count: int, text: str) -> list[tuple[str, dict[str, Any]]]:
    return [("/hooks/sms/inbound", factories.sms_inbound({"message": text})) for _ in range(count)]


async def statuses(engine: AsyncEngine) -> dict[str, tuple[str, int]]:
    rows = await inspect.list_deliveries(engine, limit=100_000)
    return {r["id"]: (r["status"], r["attempts"]) for r in rows}


@pytest.mark.slow
async def test_poison_sms_answered_500_never_pause_the_destination_for_the_others(
    engine: AsyncEngine, clock: Clock, picky: PickySink, relays: list[Relay]
) -> None:
    """The issue's attack under ``platform-sms`` (a pause after every 100 consecutive failures):
    120 poison SMS, then ordinary ones, then every 10 s the poison retried and more ordinary SMS
    arriving. The destination is never paused; each ordinary SMS is delivered at its first
    attempt, in the pass that finds it due."""
    relay = Relay(engine, {"crm": {"type": "http", "url": picky.url()}}, clock)
    relays.append(relay)
    poisoned = set(await store_events(engine, sms(120, f"hi {MARKER}"), clock))
    await store_events(engine, sms(10, "STOP"), clock)
    due = await relay.route_all()
    rows = await inspect.list_deliveries(engine, limit=1_000)
    poison = {r["id"] for r in rows if r["event_id"] in poisoned}
    assert len(poison) == 120
    retries = await relay.deliverer.attempt_many([d.id for d in due])
    assert {d.id for d in retries} == poison
    [health] = await inspect.list_destinations(engine, ["crm"])
    assert (health["consecutive_failures"], health["paused_until"]) == (0, None)

    for _ in range(6):  # 840 refusals in all
        clock.advance(10 * SECOND)
        await store_events(engine, sms(5, "hello"), clock)
        fresh = await relay.route_all()
        due_now = await outbox.due_deliveries(engine, clock(), 10_000)
        assert {d.id for d in due_now} == poison | {d.id for d in fresh}
        retries = await relay.deliverer.attempt_many([d.id for d in due_now])
        assert {d.id for d in retries} == poison  # the fresh ones went: none is held
        [health] = await inspect.list_destinations(engine, ["crm"])
        assert (health["consecutive_failures"], health["paused_until"]) == (0, None)

    found = await statuses(engine)
    ordinary = {i: s for i, s in found.items() if i not in poison}
    assert len(ordinary) == 40 and set(ordinary.values()) == {(SUCCEEDED, 1)}
    assert {found[i] for i in poison} == {("pending", 7)}


async def destination_down(cause: str, sink: Sink) -> dict[str, Any]:
    """The table of an HTTP destination that fails with ``cause``."""
    if cause == "connection refused":
        return {"type": "http", "url": f"http://127.0.0.1:{free_port()}/hook"}
    if cause == "timeout":
        sink.answers["/hook"] = Answer(delay=1.0)
        return {"type": "http", "url": sink.url(), "timeout": "100ms"}
    sink.answers["/hook"] = Answer(int(cause))
    return {"type": "http", "url": sink.url()}


@pytest.mark.parametrize("cause", ["connection refused", "timeout", "429", "502", "503", "504"])
async def test_a_destination_that_is_down_still_pauses(
    engine: AsyncEngine, clock: Clock, sink: Sink, relays: list[Relay], cause: str
) -> None:
    table = await destination_down(cause, sink) | {"policy": "pausing"}
    relay = Relay(engine, {"crm": table}, clock, PAUSING)
    relays.append(relay)
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(4)], clock)
    first, second, third, fourth = await relay.route_all()
    await relay.deliverer.attempt_many([first.id, second.id, third.id])
    [health] = await inspect.list_destinations(engine, ["crm"])
    paused_until = clock() + timedelta(minutes=10)
    assert health["consecutive_failures"] == 3
    assert health["paused_until"] == paused_until.isoformat()

    sent = len(sink.requests)
    [held] = await relay.deliverer.attempt_many([fourth.id])
    assert (held.id, held.attempts, held.at) == (fourth.id, 0, paused_until)
    assert len(sink.requests) == sent  # held by the pause, not attempted


async def test_a_consumer_answering_500_to_everything_is_not_paused_and_its_deliveries_die(
    engine: AsyncEngine, clock: Clock, sink: Sink, relays: list[Relay]
) -> None:
    """A truly broken consumer (500 to every message) cannot be told from one that refuses
    some messages: nothing pauses; each delivery follows its schedule and goes dead."""
    sink.answers["/hook"] = Answer(500)
    policies = {"pausing": {**PAUSING["pausing"], "max_attempts": 3}}
    relay = Relay(
        engine, {"crm": {"type": "http", "url": sink.url(), "policy": "pausing"}}, clock, policies
    )
    relays.append(relay)
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(5)], clock)
    due = [d.id for d in await relay.route_all()]
    while due:
        retries = await relay.deliverer.attempt_many(due)
        [health] = await inspect.list_destinations(engine, ["crm"])
        assert (health["consecutive_failures"], health["paused_until"]) == (0, None)
        if retries:
            clock.to(max(d.at for d in retries))
        due = [d.id for d in retries]
    assert set((await statuses(engine)).values()) == {(DEAD, 3)}
    assert len(sink.requests) == 15
