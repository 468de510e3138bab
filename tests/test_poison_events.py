"""Poison events: what cannot be rendered or attempted is recorded, retried by policy, then dead."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.delivery.deliverer import Deliverer, Target
from relay.delivery.policies import PolicyConfigs, resolve_policies
from relay.destinations import Outbound, Outcome
from relay.outbox.tables import DEAD, PENDING, SUCCEEDED
from relay.simulator import factories
from relay.store import inspect
from tests.conftest import TOKEN, running_client
from tests.relay_support import START, Clock, Relay
from tests.support import Sink

SECOND = timedelta(seconds=1)
LONE_SURROGATE = "hi \ud83d"  # a concatenated SMS with a missing part


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def relays(engine: AsyncEngine, clock: Clock) -> AsyncIterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for relay in made:
        await relay.aclose()


async def store_raw(engine: AsyncEngine, path: str, body: bytes, clock: Clock) -> str:
    """POST a body byte for byte (httpx's ``json=`` cannot encode a lone surrogate)."""
    async with running_client(engine, clock=clock) as client:
        answer = await client.post(
            f"{path}?token={TOKEN}", content=body, headers={"content-type": "application/json"}
        )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


async def only_delivery(engine: AsyncEngine) -> dict[str, object]:
    [row] = await inspect.list_deliveries(engine, limit=10)
    return row


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["envelope", "raw"])
async def test_a_lone_surrogate_is_relayed_losslessly(
    engine: AsyncEngine, clock: Clock, sink: Sink, relays: list[Relay], fmt: str
) -> None:
    inbound = {**factories.sms_inbound(), "message": LONE_SURROGATE}
    body = json.dumps(inbound).encode()  # ASCII, the surrogate as the escape \ud83d
    assert b"\\ud83d" in body
    event_id = await store_raw(engine, "/hooks/sms/inbound", body, clock)
    relay = Relay(engine, {"crm": {"type": "http", "url": sink.url(), "format": fmt}}, clock)
    relays.append(relay)
    [due] = await relay.route_all()

    assert await relay.deliverer.attempt(due.id) is None
    row = await only_delivery(engine)
    assert row["status"] == SUCCEEDED and row["attempts"] == 1
    [request] = sink.requests
    sent = json.loads(request.body)  # valid JSON (and ASCII, so valid UTF-8 too)
    if fmt == "envelope":
        assert sent["id"] == event_id
        assert sent["payload"]["message"] == LONE_SURROGATE
    else:
        assert request.body == body
        assert sent["message"] == LONE_SURROGATE


@pytest.mark.slow
async def test_a_content_type_beyond_ascii_is_relayed_as_received(
    engine: AsyncEngine, clock: Clock, sink: Sink, relays: list[Relay]
) -> None:
    body = json.dumps(factories.sms_inbound()).encode()
    async with running_client(engine, clock=clock) as client:
        answer = await client.post(
            f"/hooks/sms/inbound?token={TOKEN}",
            content=body,
            headers={"content-type": b"application/json; note=caf\xe9"},
        )
    assert answer.status_code == 200, answer.text
    relay = Relay(engine, {"crm": {"type": "http", "url": sink.url(), "format": "raw"}}, clock)
    relays.append(relay)
    [due] = await relay.route_all()

    assert await relay.deliverer.attempt(due.id) is None
    assert (await only_delivery(engine))["status"] == SUCCEEDED
    [request] = sink.requests
    assert request.body == body
    assert request.headers["content-type"] == "application/json; note=caf\xe9"  # latin-1, as sent


class Broken:
    """A destination with a bug: ``deliver`` raises (here, with text unfit for a log or a
    PostgreSQL text column, and a URL with a password)."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    async def deliver(self, outbound: Outbound, *, timeout: float) -> Outcome:
        self.calls += 1
        raise ValueError("cannot send \x00\ud83d to https://user:s3cret@crm.example/hook")

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        return None


async def test_an_attempt_that_raises_is_recorded_and_ends_dead(
    engine: AsyncEngine,
    clock: Clock,
    sink: Sink,
    relays: list[Relay],
    caplog: pytest.LogCaptureFixture,
) -> None:
    destinations = {"broken": {"type": "http", "url": sink.url(), "policy": "twice"}}
    relay = Relay(engine, destinations, clock)  # routes; the deliverer below attempts
    relays.append(relay)
    broken = Broken()
    configs = TypeAdapter(PolicyConfigs).validate_python(
        {"twice": {"type": "delays", "delays": ["1s"], "max_attempts": 2}}
    )
    deliverer = Deliverer(
        engine,
        {"broken": Target(broken, timedelta(seconds=5))},
        resolve_policies(configs),
        clock=clock,
        lease=timedelta(minutes=1),
    )
    inbound = factories.sms_inbound()
    await store_raw(engine, "/hooks/sms/inbound", json.dumps(inbound).encode(), clock)
    [due] = await relay.route_all()

    with caplog.at_level(logging.WARNING, logger="relay"):
        retry = await deliverer.attempt(due.id)
        assert retry is not None and retry.attempts == 1 and retry.at == START + SECOND
        row = await only_delivery(engine)
        assert row["status"] == PENDING and row["attempts"] == 1
        clock.to(retry.at)
        assert await deliverer.attempt(due.id) is None

    assert broken.calls == 2
    row = await only_delivery(engine)
    assert row["status"] == DEAD and row["attempts"] == 2 and row["last_status_code"] is None
    error = str(row["last_error"])
    assert "ValueError" in error and "cannot send" in error
    assert "s3cret" not in error and "\x00" not in error and len(error) <= 200
    shown = await inspect.get_delivery(engine, due.id)
    assert shown is not None
    assert [a["error"] for a in shown["attempt_log"]] == [error, error]

    failures = [r for r in caplog.records if "ValueError" in r.getMessage()]
    assert len(failures) == 2  # one warning per attempt ...
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in failures)  # no trace
    assert "s3cret" not in caplog.text
    assert any("dead after 2 attempts" in r.getMessage() for r in caplog.records)
    # an event the relay cannot send is that event's failure: the breaker does not count it
    [health] = await inspect.list_destinations(engine, ["broken"])
    assert health["consecutive_failures"] == 0 and health["paused_until"] is None
