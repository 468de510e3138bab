"""Deliveries under the platform's schedules: fan-out, answers, breaker, 410, dead and replay."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.observe.logs import CONTEXT_FIELDS
from relay.outbox.tables import DEAD, HELD, PENDING, SUCCEEDED
from relay.simulator import factories
from relay.store import inspect
from tests.relay_support import START, Clock, Relay, store_events
from tests.support import Answer, Sink

SECOND = timedelta(seconds=1)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def relay_factory(engine: AsyncEngine, clock: Clock) -> AsyncIterator[object]:
    made: list[Relay] = []

    def make(destinations: dict[str, dict[str, object]], **kwargs: object) -> Relay:
        relay = Relay(engine, destinations, clock, **kwargs)  # type: ignore[arg-type]
        made.append(relay)
        return relay

    yield make
    for relay in made:
        await relay.aclose()


async def deliveries(engine: AsyncEngine, **filters: object) -> list[dict[str, object]]:
    return await inspect.list_deliveries(engine, limit=1000, **filters)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_fan_out_with_filters_and_platform_policies(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory(
        {  # type: ignore[operator]
            "everything": {"type": "http", "url": sink.url("/all")},
            "sms-only": {"type": "http", "url": sink.url("/sms"), "kinds": ["sms.*"]},
            "delivered": {
                "type": "http",
                "url": sink.url("/d"),
                "kinds": ["conversations.*"],
                "events": ["MessageStatus::delivered"],
                "channels": ["appa"],
            },
            "eu-only": {"type": "http", "url": sink.url("/eu"), "sources": ["eu"]},
            "custom": {
                "type": "http",
                "url": sink.url("/c"),
                "kinds": ["tts.event"],
                "policy": "standard",
            },
        }
    )
    await store_events(
        engine,
        [
            ("/hooks/sms/inbound", factories.sms_inbound()),
            (
                "/hooks/conversations",
                factories.conversations_status(event="MessageStatus::DELIVERED", channel="appa"),
            ),
            (
                "/hooks/conversations",
                factories.conversations_status(event="MessageStatus::seen", channel="appa"),
            ),
            ("/hooks/conversations", factories.conversations_inbound(kind="sms", channel="sms")),
            ("/hooks/numinfo/gnp", factories.numinfo_gnp()),
            ("/hooks/tts/events", factories.tts_event()),
        ],
        clock,
    )

    due = await relay.route_all()
    rows = await deliveries(engine)
    by_destination: dict[str, list[str]] = {}
    for row in rows:
        by_destination.setdefault(str(row["destination"]), []).append(str(row["policy"]))
    assert sorted(by_destination["everything"]) == sorted(
        [
            "platform-sms",
            "platform-status",
            "platform-status",
            "platform-sms",
            "platform-numinfo",
            "standard",
        ]
    )
    assert by_destination["sms-only"] == ["platform-sms"]
    assert by_destination["delivered"] == ["platform-status"]
    assert by_destination["custom"] == ["standard"]
    assert "eu-only" not in by_destination
    assert len(due) == len(rows) == 9
    assert {d.at for d in due} == {START}
    assert await relay.route_all() == []  # routing twice creates nothing


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["envelope", "raw"])
async def test_success_records_one_attempt_and_the_body_format(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object, fmt: str
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url(), "format": fmt}})  # type: ignore[operator]
    body = factories.sms_dlr()
    [event_id] = await store_events(engine, [("/hooks/sms/dlr", body)], clock)
    [due] = await relay.route_all()

    assert await relay.deliverer.attempt(due.id) is None
    [row] = await deliveries(engine)
    assert row["status"] == SUCCEEDED and row["attempts"] == 1
    assert row["last_status_code"] == 200
    [request] = sink.requests
    assert request.headers["webhook-id"] == event_id
    if fmt == "envelope":
        sent = json.loads(request.body)
        assert set(sent) == {"id", "kind", "source", "received_at", "payload"}
        assert sent["id"] == event_id and sent["kind"] == "sms.dlr"
        assert sent["payload"]["requestId"] == body["requestId"]
    else:
        assert json.loads(request.body) == body
        assert request.headers["content-type"] == "application/json"
    shown = await inspect.get_delivery(engine, due.id)
    assert shown is not None and [a["status_code"] for a in shown["attempt_log"]] == [200]


async def test_failures_follow_the_policy_then_succeed(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url(), "policy": "standard"}})  # type: ignore[operator]
    sink.script["/hook"] = [Answer(500), Answer(302, {"location": "/elsewhere"}), Answer(204)]
    await store_events(engine, [("/hooks/tts/events", factories.tts_event())], clock)
    [due] = await relay.route_all()

    first = await relay.deliverer.attempt(due.id)
    assert first is not None and first.at == START + 5 * SECOND and first.attempts == 1
    assert await relay.deliverer.attempt(due.id) is None  # not due yet: no attempt
    clock.to(first.at)
    second = await relay.deliverer.attempt(due.id)
    assert second is not None and second.at == first.at + timedelta(minutes=5)
    clock.to(second.at)
    assert await relay.deliverer.attempt(due.id) is None
    [row] = await deliveries(engine)
    assert row["status"] == SUCCEEDED and row["attempts"] == 3
    assert len(sink.requests) == 3
    assert len({r.headers["webhook-id"] for r in sink.requests}) == 1
    shown = await inspect.get_delivery(engine, due.id)
    assert shown is not None
    assert [a["status_code"] for a in shown["attempt_log"]] == [500, 302, 204]


async def test_each_failed_attempt_is_one_info_line_with_its_context(
    engine: AsyncEngine,
    clock: Clock,
    sink: Sink,
    relay_factory: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url(), "policy": "standard"}})  # type: ignore[operator]
    sink.script["/hook"] = [Answer(503), Answer(204)]
    [event_id] = await store_events(engine, [("/hooks/tts/events", factories.tts_event())], clock)
    [due] = await relay.route_all()

    with caplog.at_level(logging.INFO, logger="relay.delivery"):
        first = await relay.deliverer.attempt(due.id)
        assert first is not None
        clock.to(first.at)
        assert await relay.deliverer.attempt(due.id) is None  # succeeds: no line

    [line] = [r for r in caplog.records if r.name == "relay.delivery"]
    assert line.levelno == logging.INFO
    assert line.getMessage() == (
        f"attempt 1 of delivery {due.id} to crm failed: HTTP 503 Service Unavailable; "
        f"next attempt at {first.at.isoformat()}"
    )
    context = {key: getattr(line, key) for key in CONTEXT_FIELDS if hasattr(line, key)}
    assert context == {
        "event_id": event_id,
        "delivery_id": due.id,
        "destination": "crm",
        "attempt": 1,
        "status_code": 503,
    }


async def test_a_pause_and_its_end_are_one_line_each_and_a_success_none_at_info(
    engine: AsyncEngine,
    clock: Clock,
    sink: Sink,
    relay_factory: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = relay_factory(  # type: ignore[operator]
        {"crm": {"type": "http", "url": sink.url(), "policy": "pausing"}},
        policies={
            "pausing": {
                "type": "delays",
                "delays": ["1s"],
                "then": "1s",
                "give_up_after": "1h",
                "pause_after": 2,
                "pause_for": "10m",
            }
        },
    )
    sink.script["/hook"] = [Answer(503), Answer(503)]
    await store_events(engine, [("/hooks/tts/events", factories.tts_event())], clock)
    [due] = await relay.route_all()

    with caplog.at_level(logging.INFO, logger="relay.delivery"):
        for _ in range(2):
            retry = await relay.deliverer.attempt(due.id)
            assert retry is not None
            clock.to(retry.at)
        paused_until = START + SECOND + timedelta(minutes=10)
        clock.to(paused_until)
        assert await relay.deliverer.attempt(due.id) is None  # succeeds

    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "relay.delivery"]
    assert lines[0][1].startswith(f"attempt 1 of delivery {due.id} to crm failed")
    assert lines[1][1].startswith(f"attempt 2 of delivery {due.id} to crm failed")
    assert lines[2:] == [
        (
            "WARNING",
            f"destination crm paused until {paused_until.isoformat()} after 2 consecutive "
            "failures: its deliveries wait until then",
        ),
        ("INFO", "destination crm works again (it was paused after 2 consecutive failures)"),
    ]


async def test_a_410_is_one_warning_and_the_deliveries_it_holds_none(
    engine: AsyncEngine,
    clock: Clock,
    sink: Sink,
    relay_factory: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url()}})  # type: ignore[operator]
    sink.script["/hook"] = [Answer(410)]
    await store_events(
        engine,
        [("/hooks/sms/dlr", factories.sms_dlr()), ("/hooks/sms/dlr", factories.sms_dlr())],
        clock,
    )
    first, second = await relay.route_all()
    with caplog.at_level(logging.INFO, logger="relay.delivery"):
        await relay.deliverer.attempt(first.id)
        await relay.deliverer.attempt(second.id)  # held without an attempt
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "destination crm answered 410 Gone: it is disabled, and its deliveries are held until "
        "`relay destinations enable crm` (or the console) enables it"
    ]


@pytest.mark.slow
async def test_answers_with_nul_bytes_are_recorded(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    # PostgreSQL's text refuses NUL: unreplaced, the attempt could not be recorded and the
    # delivery would be attempted again and again, even after a 2xx.
    relay = relay_factory({"crm": {"type": "http", "url": sink.url(), "policy": "standard"}})  # type: ignore[operator]
    sink.script["/hook"] = [Answer(500, body=b"bad\x00thing"), Answer(200, body=b"\x00")]
    await store_events(engine, [("/hooks/tts/events", factories.tts_event())], clock)
    [due] = await relay.route_all()

    retry = await relay.deliverer.attempt(due.id)
    assert retry is not None and retry.attempts == 1
    clock.to(retry.at)
    assert await relay.deliverer.attempt(due.id) is None
    [row] = await deliveries(engine)
    assert row["status"] == SUCCEEDED and row["attempts"] == 2
    shown = await inspect.get_delivery(engine, due.id)
    assert shown is not None
    assert [a["response_excerpt"] for a in shown["attempt_log"]] == ["bad\ufffdthing", "\ufffd"]


@pytest.mark.slow
async def test_retry_after_is_honoured_within_bounds(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url(), "policy": "standard"}})  # type: ignore[operator]
    sink.script["/hook"] = [
        Answer(429, {"retry-after": "120"}),
        Answer(503, {"retry-after": "86400"}),
    ]
    await store_events(engine, [("/hooks/tts/events", factories.tts_event())], clock)
    [due] = await relay.route_all()

    first = await relay.deliverer.attempt(due.id)
    assert first is not None and first.at == START + 120 * SECOND  # later than the policy's 5 s
    clock.to(first.at)
    second = await relay.deliverer.attempt(due.id)
    assert second is not None and second.at == first.at + timedelta(hours=1)  # capped at 1 h


@pytest.mark.slow
async def test_gone_disables_the_destination_until_enabled(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url()}})  # type: ignore[operator]
    sink.script["/hook"] = [Answer(410)]
    await store_events(
        engine,
        [("/hooks/sms/dlr", factories.sms_dlr()), ("/hooks/sms/dlr", factories.sms_dlr())],
        clock,
    )
    first, second = await relay.route_all()

    assert await relay.deliverer.attempt(first.id) is None
    assert await relay.deliverer.attempt(second.id) is None  # held without an attempt
    assert len(sink.requests) == 1
    assert {r["status"] for r in await deliveries(engine)} == {HELD}
    [health] = await inspect.list_destinations(engine, ["crm"])
    assert health["disabled"] is True and health["disabled_reason"] == "410 Gone"

    released = await outbox.enable_destination(engine, "crm", clock())
    assert {d.id for d in released} == {first.id, second.id}
    for due in released:
        assert await relay.deliverer.attempt(due.id) is None
    assert {r["status"] for r in await deliveries(engine)} == {SUCCEEDED}
    [health] = await inspect.list_destinations(engine, ["crm"])
    assert health["disabled"] is False


@pytest.mark.slow
async def test_platform_sms_breaker_pauses_after_100_failures_without_counting_the_wait(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url()}})  # type: ignore[operator]
    sink.answers["/hook"] = Answer(503)  # unavailable: a failure that says it is down
    await store_events(
        engine,
        [
            ("/hooks/sms/inbound", factories.sms_inbound()),
            ("/hooks/sms/inbound", factories.sms_inbound()),
        ],
        clock,
    )
    failing, waiting = await relay.route_all()

    due = failing
    for attempt in range(100):
        clock.to(due.at)
        assert clock() == START + attempt * 10 * SECOND
        next_due = await relay.deliverer.attempt(due.id)
        assert next_due is not None
        due = next_due
    assert clock() == START + 990 * SECOND
    assert due.at == START + 1000 * SECOND  # the policy's next try ...
    [health] = await inspect.list_destinations(engine, ["crm"])
    assert health["consecutive_failures"] == 100
    paused_until = START + 990 * SECOND + timedelta(minutes=10)
    assert health["paused_until"] == paused_until.isoformat()

    held = await relay.deliverer.attempt(waiting.id)  # due since START, but the breaker holds it
    assert held is not None and held.at == paused_until and held.attempts == 0
    clock.to(due.at)
    held_again = await relay.deliverer.attempt(due.id)
    assert held_again is not None and held_again.at == paused_until
    assert len(sink.requests) == 100

    sink.answers["/hook"] = Answer(200)
    clock.to(paused_until)
    assert await relay.deliverer.attempt(waiting.id) is None
    assert await relay.deliverer.attempt(due.id) is None
    rows = {r["id"]: r for r in await deliveries(engine)}
    assert rows[waiting.id]["attempts"] == 1 and rows[waiting.id]["status"] == SUCCEEDED
    assert rows[failing.id]["attempts"] == 101 and rows[failing.id]["status"] == SUCCEEDED
    [health] = await inspect.list_destinations(engine, ["crm"])
    assert health["consecutive_failures"] == 0 and health["paused_until"] is None
    shown = await inspect.get_delivery(engine, failing.id)
    assert shown is not None
    assert [a["number"] for a in shown["attempt_log"]] == [1, 2, 3, *range(82, 102)]


@pytest.mark.slow
async def test_dead_after_give_up_then_replay_on_a_fresh_schedule(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory(  # type: ignore[operator]
        {"crm": {"type": "http", "url": sink.url(), "policy": "quick"}},
        policies={"quick": {"type": "delays", "delays": ["1s", "2s"]}},
    )
    sink.answers["/hook"] = Answer(500)
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr())], clock)
    [due] = await relay.route_all()
    times = []
    current: outbox.Due | None = due
    while current is not None:
        clock.to(current.at)
        times.append(clock() - START)
        current = await relay.deliverer.attempt(due.id)
    assert times == [timedelta(0), SECOND, 3 * SECOND]
    [row] = await deliveries(engine)
    assert row["status"] == DEAD and row["attempts"] == 3 and row["last_status_code"] == 500

    clock.advance(timedelta(hours=1))
    replayed = await outbox.replay(engine, clock(), status=DEAD, destination="crm")
    assert [r.id for r in replayed] == [due.id]
    [row] = await deliveries(engine)
    assert row["status"] == PENDING and row["next_attempt_at"] == clock().isoformat()
    again = await relay.deliverer.attempt(due.id)
    assert again is not None and again.at == clock() + SECOND  # the schedule starts over
    sink.answers["/hook"] = Answer(200)
    clock.to(again.at)
    assert await relay.deliverer.attempt(due.id) is None
    [row] = await deliveries(engine)
    assert row["status"] == SUCCEEDED and row["attempts"] == 5


@pytest.mark.slow
async def test_a_delivery_is_attempted_by_one_worker_at_a_time(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory({"crm": {"type": "http", "url": sink.url()}})  # type: ignore[operator]
    other = relay_factory({"crm": {"type": "http", "url": sink.url()}})  # type: ignore[operator]
    sink.answers["/hook"] = Answer(200, delay=0.2)
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr())], clock)
    [due] = await relay.route_all()

    results = await asyncio.gather(*(r.deliverer.attempt(due.id) for r in [relay, other] * 3))
    assert results == [None] * 6
    assert len(sink.requests) == 1
    [row] = await deliveries(engine)
    assert row["attempts"] == 1 and row["status"] == SUCCEEDED


@pytest.mark.slow
async def test_numinfo_answer_budget_caps_the_timeout(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay_factory: object
) -> None:
    relay = relay_factory({"lookup": {"type": "http", "url": sink.url(), "timeout": "30s"}})  # type: ignore[operator]
    sink.answers["/hook"] = Answer(200, delay=2.5)
    await store_events(engine, [("/hooks/numinfo/gnv", factories.numinfo_gnv())], clock)
    [due] = await relay.route_all()

    next_due = await relay.deliverer.attempt(due.id)
    assert next_due is not None and next_due.at == clock() + timedelta(minutes=1)
    [row] = await deliveries(engine)
    assert row["status"] == PENDING and "timeout after 2" in str(row["last_error"])
