"""Per-key ordering: a delivery waits for the earlier ones of its key, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from receivers import SourceConfig
from receivers.store import create_engine
from relay import outbox
from relay.cli import main
from relay.outbox.tables import DEAD, PENDING, SUCCEEDED, Delivery
from relay.simulator import factories
from relay.store import inspect
from tests.cli_support import table as cli_table
from tests.conftest import TOKEN, running_client
from tests.console_support import console_client
from tests.relay_support import Clock, Relay, store_events
from tests.support import Answer, Sink, serving

SECOND = timedelta(seconds=1)
QUICK = {"quick": {"type": "delays", "delays": ["10s"], "then": "10s", "give_up_after": "1m"}}
MakeRelay = Callable[..., Relay]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def ordered(engine: AsyncEngine, clock: Clock, sink: Sink) -> AsyncIterator[Relay]:
    """A relay with one per-key HTTP destination, ``crm``, retrying every 10 s for a minute."""
    table = {"type": "http", "url": sink.url(), "policy": "quick", "ordering": "per-key"}
    relay = Relay(engine, {"crm": table}, clock, QUICK)
    yield relay
    await relay.aclose()


def dlr(request_id: str, status: str) -> tuple[str, dict[str, Any]]:
    return "/hooks/sms/dlr", factories.sms_dlr({"requestId": request_id}, status=status)


def seen(sink: Sink) -> list[tuple[str, str]]:
    """(requestId, status) of each request the sink got, in order."""
    found = []
    for request in sink.requests:
        payload = json.loads(request.body)["payload"]
        found.append((payload["requestId"], payload["status"]))
    return found


async def store(engine: AsyncEngine, clock: Clock, *posts: tuple[str, dict[str, Any]]) -> None:
    """Store the callbacks one after another, a millisecond apart (their arrival order)."""
    for post in posts:
        await store_events(engine, [post], clock)
        clock.advance(timedelta(milliseconds=1))


async def test_a_later_event_waits_while_an_earlier_one_is_retried(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"), dlr("m2", "ACCEPTED"))
    accepted, delivered, other = await ordered.route_all()
    sink.answers["/hook"] = Answer(503)
    assert await ordered.deliverer.attempt_many([accepted.id, delivered.id, other.id]) != []
    # m1's ACCEPTED failed and waits 10 s; DELIVERED was not attempted; m2's key went on
    assert seen(sink) == [("m1", "ACCEPTED"), ("m2", "ACCEPTED")]
    assert await outbox.due_deliveries(engine, clock(), 100) == []  # the sweeper leaves it too
    assert await ordered.deliverer.attempt(delivered.id) is None
    assert len(sink.requests) == 2

    sink.answers["/hook"] = Answer(200)
    clock.advance(10 * SECOND)
    retry = await outbox.due_deliveries(engine, clock(), 100)
    assert {d.id for d in retry} == {accepted.id, other.id}
    # its success lets DELIVERED go at once, in the same call
    assert await ordered.deliverer.attempt_many([accepted.id]) == []
    assert seen(sink)[2:] == [("m1", "ACCEPTED"), ("m1", "DELIVERED")]
    rows = {r["id"]: r["status"] for r in await inspect.list_deliveries(engine, limit=10)}
    assert rows[accepted.id] == rows[delivered.id] == SUCCEEDED and rows[other.id] == PENDING


async def test_a_request_id_too_long_to_search_by_still_keeps_its_line(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    """The store keeps no platform id longer than 200 characters; the key is its hash."""
    long_id = "Q" * 257
    await store(engine, clock, dlr(long_id, "ACCEPTED"), dlr(long_id, "DELIVERED"))
    accepted, delivered = await ordered.route_all()
    sink.answers["/hook"] = Answer(503)
    await ordered.deliverer.attempt_many([accepted.id, delivered.id])
    assert seen(sink) == [(long_id, "ACCEPTED")]
    rows = await inspect.list_deliveries(engine, limit=10)
    assert {r["order_key"][:7] for r in rows} == {"sha256:"}


async def test_one_claim_takes_only_the_first_of_a_line(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    await store(engine, clock, *(dlr("m1", status) for status in ("ACCEPTED", "SENT", "DELIVERED")))
    due = await ordered.route_all()
    claims = await outbox.claim_many(engine, [d.id for d in reversed(due)], clock(), 60 * SECOND)
    assert list(claims) == [due[0].id]
    # a second worker claiming meanwhile gets none of them: the first is leased, the rest wait
    assert await outbox.claim_many(engine, [d.id for d in due], clock(), 60 * SECOND) == {}


async def test_a_dead_delivery_lets_the_next_go_and_shows_out_of_order_if_replayed(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"))
    accepted, delivered = await ordered.route_all()
    sink.answers["/hook"] = Answer(500)
    due = accepted
    for _ in range(20):  # every 10 s until the minute is up
        [due] = await ordered.deliverer.attempt_many([due.id])
        if due.id != accepted.id:
            break
        clock.to(due.at)
    # the dead one's end let the next go in the same call: it failed too, and waits its retry
    assert (due.id, due.attempts) == (delivered.id, 1)
    assert seen(sink)[-1] == ("m1", "DELIVERED")
    [row] = await inspect.list_deliveries(engine, status=DEAD, limit=10)
    assert row["id"] == accepted.id and row["out_of_order_if_replayed"] is True
    sink.answers["/hook"] = Answer(200)
    clock.to(due.at)
    assert await ordered.deliverer.attempt_many([delivered.id]) == []
    assert seen(sink)[-1] == ("m1", "DELIVERED")

    # replayed, it goes (after DELIVERED, as the flag said)
    [replayed] = await outbox.replay(engine, clock(), delivery_ids=[accepted.id])
    assert await ordered.deliverer.attempt_many([replayed.id]) == []
    assert seen(sink)[-1] == ("m1", "ACCEPTED")


async def test_a_breaker_hold_keeps_the_line_waiting(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"))
    accepted, delivered = await ordered.route_all()
    pause = Delivery.__table__.update().where(Delivery.__table__.c.id == accepted.id)
    async with engine.begin() as conn:  # held for the breaker: pending, due in 5 minutes
        await conn.execute(pause.values(next_attempt_at=clock() + 300 * SECOND))
    assert await ordered.deliverer.attempt_many([delivered.id]) == []
    assert sink.requests == []


async def test_an_unrouted_earlier_event_of_the_platform_id_holds_the_line(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    """A receiver died between storing ACCEPTED and routing it: DELIVERED, routed by another,
    waits until ACCEPTED is routed (by the sweeper) and delivered."""
    await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"))
    events = await outbox.unrouted_events(engine, clock() + SECOND, 10)
    [delivered] = await outbox.route_events(engine, ordered.router, events[1:], clock())
    assert await ordered.deliverer.attempt_many([delivered.id]) == []
    assert await outbox.due_deliveries(engine, clock(), 10) == []
    [accepted] = await ordered.route_all()
    assert await ordered.deliverer.attempt_many([accepted.id]) == []  # DELIVERED went next
    assert seen(sink) == [("m1", "ACCEPTED"), ("m1", "DELIVERED")]


async def test_ordering_none_and_events_without_a_key_do_not_wait(
    engine: AsyncEngine, clock: Clock, sink: Sink
) -> None:
    tables = {
        "plain": {"type": "http", "url": sink.url("/plain"), "policy": "quick"},
        "by-to": {
            "type": "http",
            "url": sink.url("/to"),
            "policy": "quick",
            "ordering": "per-key",
            "order_key": "{payload.recipient}",
        },
    }
    relay = Relay(engine, tables, clock, QUICK)
    try:
        await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"))
        due = await relay.route_all()
        rows = await inspect.list_deliveries(engine, limit=10)
        assert {r["order_key"] for r in rows} == {None}  # sms.dlr has no recipient field
        sink.answers["/plain"] = sink.answers["/to"] = Answer(503)
        await relay.deliverer.attempt_many([d.id for d in due])
        assert len(sink.requests) == 4  # nothing waited
    finally:
        await relay.aclose()


async def test_a_lease_lost_to_a_killed_worker_keeps_the_line_waiting(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    """A worker claims ACCEPTED and dies mid-attempt: DELIVERED waits for the lease to expire
    and ACCEPTED's next attempt, never overtakes it."""
    await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"))
    accepted, delivered = await ordered.route_all()
    assert list(await outbox.claim_many(engine, [accepted.id], clock(), 30 * SECOND))
    # the killed worker never records; its lease runs out
    clock.advance(31 * SECOND)
    assert await ordered.deliverer.attempt_many([delivered.id]) == []
    assert sink.requests == []
    [due] = await outbox.due_deliveries(engine, clock(), 10)
    assert due.id == accepted.id
    jobs = await ordered.deliverer.attempt_many([accepted.id])
    await ordered.deliverer.attempt_many([d.id for d in jobs])
    assert seen(sink) == [("m1", "ACCEPTED"), ("m1", "DELIVERED")]


async def test_a_replayed_earlier_delivery_goes_before_later_pending_ones(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"))
    accepted, delivered = await ordered.route_all()
    async with engine.begin() as conn:  # DELIVERED is pending, due later
        table = Delivery.__table__
        later = clock() + 300 * SECOND
        await conn.execute(
            update(table).where(table.c.id == delivered.id).values(next_attempt_at=later)
        )
    assert await ordered.deliverer.attempt_many([accepted.id]) == []  # DELIVERED is not due
    await outbox.replay(engine, clock(), delivery_ids=[accepted.id])
    clock.advance(300 * SECOND)
    assert await ordered.deliverer.attempt_many([delivered.id]) == []  # the replay goes first
    assert seen(sink) == [("m1", "ACCEPTED")]
    assert await ordered.deliverer.attempt_many([accepted.id]) == []  # then DELIVERED, at once
    assert seen(sink) == [("m1", "ACCEPTED"), ("m1", "ACCEPTED"), ("m1", "DELIVERED")]


async def test_operators_see_who_waits_in_line_and_who_is_out_of_order_if_replayed(
    database_url: str, engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    await store(engine, clock, dlr("m1", "ACCEPTED"), dlr("m1", "DELIVERED"))
    accepted, delivered = await ordered.route_all()
    sink.answers["/hook"] = Answer(503)
    await ordered.deliverer.attempt_many([accepted.id, delivered.id])
    rows = {r["id"]: r for r in await inspect.list_deliveries(engine, limit=10)}
    assert [rows[accepted.id]["waiting_in_line"], rows[delivered.id]["waiting_in_line"]] == [
        False,
        True,
    ]
    assert rows[delivered.id]["order_key"] == "m1"
    listed_by_cli = await asyncio.to_thread(
        CliRunner().invoke, main, ["deliveries", "list"], env={"RELAY_DATABASE_URL": database_url}
    )
    cells = {row["ID"]: row for row in cli_table(listed_by_cli.output, first="ID")}
    assert cells[delivered.id]["STATUS"] == "pending" and cells[delivered.id]["ATTEMPTS"] == "0"
    assert cells[delivered.id]["NEXT ATTEMPT (UTC)"] == "waiting in line"
    assert cells[accepted.id]["NEXT ATTEMPT (UTC)"] != "waiting in line"
    async with console_client(engine, clock, ["crm"]) as console:
        assert (await console.login()).status_code == 303
        listed = (await console.http.get("/console/deliveries")).text
        assert listed.count("waits for an earlier event of its key") == 1
        async with engine.begin() as conn:  # ACCEPTED gave up; DELIVERED went since
            table = Delivery.__table__
            await conn.execute(update(table).where(table.c.id == accepted.id).values(status=DEAD))
            await conn.execute(
                update(table).where(table.c.id == delivered.id).values(status=SUCCEEDED, attempts=1)
            )
        [shown] = await inspect.list_deliveries(engine, status=DEAD, limit=10)
        assert shown["out_of_order_if_replayed"] is True and shown["waiting_in_line"] is False
        event = (await inspect.get_delivery(engine, accepted.id) or {})["event_id"]
        page = (await console.http.get(f"/console/events/{event}")).text
        assert "out of order if replayed" in page and "order key" in page


# -- property: whatever the failures, kills and routing order, each key's line keeps its order --

Step = tuple[str, Any]
steps = st.one_of(
    st.tuples(st.just("event"), st.integers(0, 1)),  # a callback of key 0 or 1 arrives
    st.tuples(st.just("route"), st.lists(st.integers(0, 3), min_size=1, max_size=2)),  # routed
    st.tuples(st.just("pass"), st.booleans()),  # a worker pass; the sink answers 200 or 503
    st.tuples(st.just("kill"), st.booleans()),  # a worker claims, (maybe) sends, and dies
    st.tuples(st.just("advance"), st.integers(1, 40)),  # seconds go by
)


@pytest.fixture
async def receiver(engine: AsyncEngine) -> AsyncIterator[tuple[httpx.AsyncClient, Clock]]:
    """A receiver (no hook) on a clock that the examples of a property test share."""
    clock = Clock()
    async with running_client(
        engine, {"default": SourceConfig(token=TOKEN)}, clock=clock
    ) as client:
        yield client, clock


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=st.lists(steps, min_size=1, max_size=24))
@example(plan=[("event", 0), ("event", 0), ("pass", False), ("advance", 10), ("pass", True)])
@example(plan=[("event", 0), ("event", 0), ("route", [1]), ("pass", True), ("route", [0])])
@example(plan=[("event", 0), ("event", 0), ("route", [0, 1]), ("kill", True), ("advance", 31)])
async def test_each_key_reaches_the_sink_in_arrival_order(
    engine: AsyncEngine,
    sink: Sink,
    receiver: tuple[httpx.AsyncClient, Clock],
    plan: list[Step],
) -> None:
    """Events of two keys arrive; routing happens late and out of order; worker passes meet
    a failing sink; workers die after claiming (some after sending); time goes by. For every
    key, what reached the sink (attempts that failed included) never goes back in arrival
    order, and in the end every delivery is succeeded or dead."""
    client, clock = receiver
    run = uuid.uuid4().hex[:8]  # examples share the store: this one's keys and events only
    table = {"type": "http", "url": sink.url(), "policy": "quick", "ordering": "per-key"}
    relay = Relay(engine, {"crm": table}, clock, QUICK, lease=30 * SECOND)
    sink.requests.clear()
    place: dict[str, tuple[str, int]] = {}  # event id -> (key, its place in arrival order)
    seen_at_sink: list[tuple[str, int]] = []
    unrouted: list[str] = []
    jobs: list[outbox.Due] = []

    def observe() -> None:
        for request in sink.requests:
            seen_at_sink.append(place[json.loads(request.body)["id"]])
        sink.requests.clear()

    async def due_now() -> list[str]:
        due = await outbox.due_deliveries(engine, clock(), 1000)
        mine = {d.id for d in due if d.id in deliveries} | {j.id for j in jobs if j.at <= clock()}
        return sorted(mine)

    deliveries: set[str] = set()
    try:
        for action, value in [*plan, ("drain", None)]:
            if action == "event":
                key = f"{run}-{value}"
                _, body = dlr(key, f"STEP{len(place)}")  # a new status: not a duplicate
                answer = await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=body)
                assert answer.status_code == 200 and answer.json()["id"] not in place
                place[answer.json()["id"]] = (key, len(place))
                unrouted.append(answer.json()["id"])
                clock.advance(timedelta(milliseconds=1))
            elif action == "route" or action == "drain":
                chosen = (
                    unrouted
                    if action == "drain"
                    else [unrouted[i % len(unrouted)] for i in value if unrouted]
                )
                events = await outbox.unrouted_events(engine, clock() + SECOND, 1000)
                picked = [e for e in events if e.id in set(chosen)]
                routed = await outbox.route_events(engine, relay.router, picked, clock())
                deliveries |= {d.id for d in routed}
                unrouted = [i for i in unrouted if i not in {e.id for e in picked}]
            if action == "pass" or action == "drain":
                sink.answers["/hook"] = Answer(200 if value in (True, None) else 503)
                for _ in range(200 if action == "drain" else 1):
                    ids = await due_now()
                    jobs = await relay.deliverer.attempt_many(ids) if ids else []
                    if action == "drain" and not ids:
                        if await _all_done(engine, deliveries):
                            break
                        clock.advance(10 * SECOND)
                observe()
            elif action == "kill":
                claims = await outbox.claim_many(engine, await due_now(), clock(), 30 * SECOND)
                if value:  # it sent them before it died: the sink has them
                    seen_at_sink.extend(place[c.delivery.event_id] for c in claims.values())
            elif action == "advance":
                clock.advance(value * SECOND)
    finally:
        await relay.aclose()
    assert await _all_done(engine, deliveries)
    for key in {key for key, _ in place.values()}:
        order = [at for k, at in seen_at_sink if k == key]
        assert order == sorted(order), f"key {key} reached the sink as {order}"


async def _all_done(engine: AsyncEngine, deliveries: set[str]) -> bool:
    rows = await inspect.list_deliveries(engine, limit=100_000)
    return all(r["status"] in (SUCCEEDED, DEAD) for r in rows if r["id"] in deliveries)


class LineWatchingSink(Sink):
    """A sink that answers after ``delay`` seconds, 503 for a seeded share of requests, and
    counts how many requests of each order key (the payload's requestId) it holds at once."""

    def __init__(self, delay: float, failing: float, seed: int) -> None:
        super().__init__()
        self.delay, self.failing, self.rng = delay, failing, random.Random(seed)
        self.holding: Counter[str] = Counter()
        self.most_at_once = 0

    async def _endpoint(self, request: Request) -> Response:
        key = json.loads(await request.body())["payload"]["requestId"]
        self.holding[key] += 1
        self.most_at_once = max(self.most_at_once, self.holding[key])
        try:
            answer = await super()._endpoint(request)
            await asyncio.sleep(self.delay)
        finally:
            self.holding[key] -= 1
        return Response(status_code=503) if self.rng.random() < self.failing else answer


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgresql"])  # a race needs a server database
async def test_two_workers_racing_on_postgresql_keep_each_line_one_at_a_time_in_order(
    database_url: str, engine: AsyncEngine, clock: Clock
) -> None:
    """Two workers (engines of their own: separate connections, real row races) attempt the
    same due deliveries at the same moments; the sink fails a third of the requests."""
    second_engine = create_engine(database_url)
    async with serving(LineWatchingSink(delay=0.02, failing=0.3, seed=23)) as sink:
        table = {"type": "http", "url": sink.url(), "policy": "quick", "ordering": "per-key"}
        workers = [
            Relay(engine, {"crm": table}, clock, QUICK),
            Relay(second_engine, {"crm": table}, clock, QUICK),
        ]
        try:
            keys = [f"m{k}" for k in range(20)]
            posts = [dlr(key, f"STEP{step}") for step in range(5) for key in keys]
            await store(engine, clock, *posts)
            await workers[0].route_all()
            for _ in range(100):
                due = [d.id for d in await outbox.due_deliveries(engine, clock(), 1000)]
                if not due:
                    if await outbox.delivery_counts(engine) == {SUCCEEDED: len(posts)}:
                        break
                    clock.advance(10 * SECOND)
                    continue
                while due:  # both at once, then what their ends let go, at once too
                    jobs = await asyncio.gather(*(w.deliverer.attempt_many(due) for w in workers))
                    due = sorted({d.id for found in jobs for d in found if d.at <= clock()})
        finally:
            for worker in workers:
                await worker.aclose()
            await second_engine.dispose()
    assert await outbox.delivery_counts(engine) == {SUCCEEDED: len(posts)}
    assert sink.most_at_once == 1
    by_key: dict[str, list[int]] = {}
    for request in sink.requests:
        payload = json.loads(request.body)["payload"]
        by_key.setdefault(payload["requestId"], []).append(int(payload["status"][4:]))
    assert sorted(by_key) == sorted(keys)
    for key, steps_seen in by_key.items():
        assert steps_seen == sorted(steps_seen), f"{key} reached the sink as {steps_seen}"
