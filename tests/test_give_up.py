"""Giving a delivery up (issue #33, defect 6): dead now, without an attempt, saying who and why;
the next delivery of its per-key line goes at once; in flight, it stays dead. On SQLite and
PostgreSQL, through the outbox, `relay deliveries give-up` and the console."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from relay import outbox
from relay.cli import main
from relay.commands.give_up import os_user
from relay.delivery.give_up import give_up
from relay.dispatch.jobs import QUEUE_NAME
from relay.observe import progress
from relay.outbox.tables import DEAD, HELD, PENDING, SUCCEEDED
from relay.simulator import factories
from relay.store import inspect
from tests.conftest import REDIS_URL, TOKEN
from tests.console_support import USER, ConsoleClient, console_client
from tests.relay_support import Clock, Relay, store_events
from tests.store_support import eventually
from tests.support import Answer, Sink, serving

SECOND = timedelta(seconds=1)
QUICK = {"quick": {"type": "delays", "delays": ["10s"], "then": "10s", "give_up_after": "1h"}}
UNKNOWN = "01a20a53-0826-7c44-b32b-31e46ba11ceb"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def ordered(engine: AsyncEngine, clock: Clock, sink: Sink) -> AsyncIterator[Relay]:
    """A relay with one per-key HTTP destination, ``crm``, retrying every 10 s for an hour."""
    table = {"type": "http", "url": sink.url(), "policy": "quick", "ordering": "per-key"}
    relay = Relay(engine, {"crm": table}, clock, QUICK)
    yield relay
    await relay.aclose()


async def blocked_line(
    engine: AsyncEngine, clock: Clock, sink: Sink, relay: Relay, behind: int = 2
) -> list[str]:
    """The deliveries of one key, in arrival order: the first failed (the sink answered 500)
    and waits for its retry; ``behind`` later ones wait for it. The sink answers 200 from now."""
    ids = []
    for step in range(behind + 1):
        await store_events(engine, [dlr("m1", f"STEP{step}")], clock)
        clock.advance(timedelta(milliseconds=1))
    due = await relay.route_all()
    sink.answers["/hook"] = Answer(500)
    await relay.deliverer.attempt_many([d.id for d in due])
    sink.answers["/hook"] = Answer(200)
    ids = [d.id for d in due]
    assert [r["status"] for r in await rows(engine, ids)] == [PENDING] * (behind + 1)
    assert len(sink.requests) == 1
    return ids


def dlr(request_id: str, status: str) -> tuple[str, dict[str, Any]]:
    return "/hooks/sms/dlr", factories.sms_dlr({"requestId": request_id}, status=status)


async def rows(engine: AsyncEngine, ids: list[str]) -> list[dict[str, Any]]:
    found = {r["id"]: r for r in await inspect.list_deliveries(engine, limit=10_000)}
    return [found[i] for i in ids]


# --- the outbox ---------------------------------------------------------------------------------


async def test_giving_up_the_first_of_a_line_makes_it_dead_and_lets_the_next_go_at_once(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    first, second, third = await blocked_line(engine, clock, sink, ordered)
    clock.advance(3 * SECOND)  # before its retry: without the give-up, the line would wait

    done = await give_up(engine, clock(), [first], by="alice", reason="the CRM rejects it")

    assert done.given_up == [first] and done.finished == {} and done.unknown == []
    [row] = await rows(engine, [first])
    assert row["status"] == DEAD and row["attempts"] == 1  # no attempt made or counted
    assert row["last_error"] == "given up by alice: the CRM rejects it"
    assert row["last_status_code"] is None and row["next_attempt_at"] is None
    assert row["finished_at"] == clock().isoformat()
    [due] = done.next_in_line
    assert (due.id, due.attempts) == (second, 0) and due.at <= clock()
    assert await ordered.deliverer.attempt_many([due.id]) == []  # its end lets the third go
    assert [r["status"] for r in await rows(engine, [second, third])] == [SUCCEEDED] * 2
    assert len(sink.requests) == 3


async def test_final_deliveries_and_unknown_ids_are_reported_and_left_alone(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    first, second, third = await blocked_line(engine, clock, sink, ordered)
    await give_up(engine, clock(), [first], by="alice")
    assert await ordered.deliverer.attempt(second) is None  # alone: the third stays pending

    done = await give_up(
        engine, clock(), [first, second, UNKNOWN, third, third], by="bob", reason="again"
    )

    assert done.given_up == [third]  # given twice, given up once
    assert done.finished == {first: DEAD, second: SUCCEEDED} and done.unknown == [UNKNOWN]
    found = await rows(engine, [first, second, third])
    assert [r["last_error"] for r in found] == ["given up by alice", None, "given up by bob: again"]


async def test_a_held_delivery_can_be_given_up(
    engine: AsyncEngine, clock: Clock, sink: Sink
) -> None:
    sink.answers["/hook"] = Answer(410)
    relay = Relay(engine, {"crm": {"type": "http", "url": sink.url()}}, clock)
    try:
        await store_events(engine, [dlr("m1", "ACCEPTED")], clock)
        [due] = await relay.route_all()
        await relay.deliverer.attempt_many([due.id])
    finally:
        await relay.aclose()
    assert (await rows(engine, [due.id]))[0]["status"] == HELD
    done = await give_up(engine, clock(), [due.id], by="alice")
    assert done.given_up == [due.id] and done.next_in_line == []
    assert (await rows(engine, [due.id]))[0]["status"] == DEAD


class GatedSink(Sink):
    """A sink that holds each request until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def _endpoint(self, request: Request) -> Response:
        answer = await super()._endpoint(request)
        await self.gate.wait()
        return answer


@pytest.mark.parametrize("status", [200, 500])
async def test_a_delivery_given_up_while_in_flight_stays_dead_whatever_its_attempt_got(
    engine: AsyncEngine, clock: Clock, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(GatedSink()) as gated:
        gated.answers["/hook"] = Answer(status)
        relay = Relay(engine, {"crm": {"type": "http", "url": gated.url()}}, clock)
        try:
            await store_events(engine, [dlr("m1", "ACCEPTED")], clock)
            [due] = await relay.route_all()
            attempt = asyncio.create_task(relay.deliverer.attempt_many([due.id]))
            await eventually(lambda: gated.requests)  # sent, its answer held back
            done = await give_up(engine, clock(), [due.id], by="alice", reason="stuck")
            gated.gate.set()
            with caplog.at_level(logging.WARNING, logger="relay"):
                assert await attempt == []
        finally:
            await relay.aclose()
    assert done.given_up == [due.id]
    [row] = await rows(engine, [due.id])
    assert (row["status"], row["attempts"], row["last_error"]) == (
        DEAD,
        0,
        "given up by alice: stuck",
    )
    assert (await inspect.get_delivery(engine, due.id) or {})["attempt_log"] == []
    assert f"lease of delivery {due.id} was lost during its attempt" in caplog.text


async def test_a_given_up_delivery_is_replayed_like_any_dead_one(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay
) -> None:
    first, *_ = await blocked_line(engine, clock, sink, ordered, behind=0)
    await give_up(engine, clock(), [first], by="alice")
    [replayed] = await outbox.replay(engine, clock(), delivery_ids=[first])
    assert await ordered.deliverer.attempt_many([replayed.id]) == []
    [row] = await rows(engine, [first])
    assert (row["status"], row["attempts"], row["last_error"]) == (SUCCEEDED, 2, None)


# --- relay deliveries give-up -------------------------------------------------------------------


def config_file(tmp_path: Path, database_url: str, sink: Sink, redis_url: str | None) -> Path:
    config = tmp_path / "relay.toml"
    redis = f'redis_url = "{redis_url}"\n' if redis_url else ""
    config.write_text(
        f'database_url = "{database_url}"\n{redis}[sources.default]\ntoken = "{TOKEN}"\n'
        f'[destinations.crm]\ntype = "http"\nurl = "{sink.url()}"\npolicy = "quick"\n'
        'ordering = "per-key"\n[policies.quick]\ntype = "delays"\ndelays = ["10s"]\n'
        'then = "10s"\ngive_up_after = "1h"\n'
    )
    return config


async def cli(*args: str, input: str | None = None) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), input=input)


async def test_the_command_gives_up_reports_the_rest_and_enqueues_the_next_in_line(
    engine: AsyncEngine,
    database_url: str,
    clock: Clock,
    sink: Sink,
    ordered: Relay,
    redis: Redis,
    tmp_path: Path,
) -> None:
    first, second, third = await blocked_line(engine, clock, sink, ordered)
    await give_up(engine, clock(), [third], by="alice")
    config = config_file(tmp_path, database_url, sink, REDIS_URL)

    ran = await cli(
        "deliveries", "give-up", first, first.upper(), third, UNKNOWN,
        "--reason", "the CRM rejects it", "--by", "ops-bob", "--yes", "--config", str(config),
    )  # fmt: skip

    assert ran.exit_code == 1, ran.output
    assert ran.stdout == "gave up 1 delivery; 1 next in line due now\n"
    logged, *refused = ran.stderr.splitlines()
    assert logged.endswith(
        f" INFO relay.cli: cli: ops-bob gave up delivery {first} (the CRM rejects it) user=ops-bob"
    )
    assert refused == [
        f"not given up: {UNKNOWN}: no such delivery",
        f"not given up: {third}: dead already",
    ]
    [row] = await rows(engine, [first])
    assert (row["status"], row["last_error"]) == (DEAD, "given up by ops-bob: the CRM rejects it")
    jobs = [job.decode() for job in await redis.zrange(QUEUE_NAME, 0, -1)]
    assert [job.split(":")[2] for job in jobs] == [second]  # the worker takes it now

    again = await cli("deliveries", "give-up", second, "--yes", "--config", str(config))
    assert again.exit_code == 0, again.output
    assert again.stdout == "gave up 1 delivery\n"
    user = os_user()
    assert again.stderr.endswith(f"relay.cli: cli: {user} gave up delivery {second} user={user}\n")
    [row] = await rows(engine, [second])
    assert row["last_error"].startswith("given up by ") and row["last_error"] != "given up by "


async def test_the_command_asks_on_a_terminal_and_refuses_to_guess_without_one(
    engine: AsyncEngine,
    database_url: str,
    clock: Clock,
    sink: Sink,
    ordered: Relay,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, *_ = await blocked_line(engine, clock, sink, ordered, behind=0)
    c = ("--config", str(config_file(tmp_path, database_url, sink, None)))

    piped = await cli("deliveries", "give-up", first, *c)
    assert piped.exit_code == 2 and "pass --yes" in piped.output
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    declined = await cli("deliveries", "give-up", first, *c, input="n\n")
    assert declined.exit_code == 1 and "Give up 1 of 1 delivery?" in declined.stderr
    assert (await rows(engine, [first]))[0]["status"] == PENDING
    accepted = await cli("deliveries", "give-up", first, *c, input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "the running `relay serve` picks them up" in accepted.stdout  # embedded mode
    assert (await rows(engine, [first]))[0]["status"] == DEAD


HOSTILE_ARGUMENTS = [
    ((), "Missing argument"),
    (("not-a-uuid",), "'not-a-uuid' is not a delivery id"),
    (("",), "'' is not a delivery id"),
    (("x" * 5000,), "is not a delivery id"),
    ((UNKNOWN + "0",), "is not a delivery id"),
    ((f"{UNKNOWN}\n",), "is not a delivery id"),
    (("\udcff\udcfe",), "is not a delivery id"),  # bytes that are not UTF-8, as Python gets them
    ((UNKNOWN, "--reason", ""), "--reason: empty"),
    ((UNKNOWN, "--reason", "   "), "--reason: empty"),
    ((UNKNOWN, "--reason", "r" * 201), "at most 200 characters"),
    ((UNKNOWN, "--reason", "line\nbreak"), "control characters"),
    ((UNKNOWN, "--by", ""), "--by: empty"),
    ((UNKNOWN, "--by", "b" * 65), "at most 64 characters"),
    ((UNKNOWN, "--by", "\x1b[31mroot"), "control characters"),
    ((UNKNOWN, "--by", "\udcffroot"), "control characters"),
]


async def test_hostile_arguments_are_usage_errors_and_change_nothing(
    engine: AsyncEngine,
    database_url: str,
    clock: Clock,
    sink: Sink,
    ordered: Relay,
    tmp_path: Path,
) -> None:
    first, *_ = await blocked_line(engine, clock, sink, ordered, behind=0)
    c = ("--config", str(config_file(tmp_path, database_url, sink, None)))
    for args, says in HOSTILE_ARGUMENTS:
        ran = await cli("deliveries", "give-up", *args, "--yes", *c)
        assert ran.exit_code == 2, (args, ran.output)
        assert re.search(says, ran.output), ran.output
        assert "Traceback" not in ran.output
    # an option given twice: click keeps the last one; a first id given twice counts once
    twice = await cli(
        "deliveries", "give-up", first, first, "--reason", "a", "--reason", "b", "--yes", *c
    )
    assert twice.exit_code == 0 and twice.stdout.startswith("gave up 1 delivery")
    [row] = await rows(engine, [first])
    assert (row["status"], row["last_error"]) == (DEAD, f"given up by {os_user()}: b")


# --- the console --------------------------------------------------------------------------------


@pytest.fixture
async def operator(engine: AsyncEngine, clock: Clock) -> AsyncIterator[ConsoleClient]:
    async with console_client(engine, clock, ["crm"]) as console:
        assert (await console.login()).status_code == 303
        yield console


async def test_the_console_asks_then_gives_up_and_logs_who(
    engine: AsyncEngine,
    clock: Clock,
    sink: Sink,
    ordered: Relay,
    operator: ConsoleClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second, _ = await blocked_line(engine, clock, sink, ordered)
    event_id = (await rows(engine, [first]))[0]["event_id"]
    page = (await operator.http.get(f"/console/events/{event_id}")).text
    assert f'action="/console/deliveries/{first}/give-up"' in page
    listed = (await operator.http.get("/console/deliveries")).text
    assert listed.count("/give-up") == 3  # one per pending delivery

    asked = await operator.act(f"/console/deliveries/{first}/give-up", back="/console/deliveries")
    assert asked.status_code == 200
    assert '<dd class="behind">2</dd>' in asked.text and 'name="reason"' in asked.text
    assert (await rows(engine, [first]))[0]["status"] == PENDING  # asking changes nothing

    with caplog.at_level(logging.INFO, logger="relay.console"):
        done = await operator.act(
            f"/console/deliveries/{first}/give-up",
            back="/console/deliveries?status=pending",
            confirm="yes",
            reason="  the CRM rejects it  ",
        )
    assert done.status_code == 303
    assert done.headers["location"] == "/console/deliveries?notice=given-up"
    [row] = await rows(engine, [first])
    assert (row["status"], row["last_error"]) == (DEAD, f"given up by {USER}: the CRM rejects it")
    assert [d.id for d in operator.enqueued] == [second]
    [record] = [r for r in caplog.records if "gave up" in r.getMessage()]
    assert record.getMessage() == f"console: {USER} gave up delivery {first} (the CRM rejects it)"
    assert record.user == USER  # type: ignore[attr-defined]
    page = (await operator.http.get(f"/console/events/{event_id}")).text
    assert f'action="/console/deliveries/{first}/give-up"' not in page  # dead: no button

    final = await operator.act(f"/console/deliveries/{first}/give-up", confirm="yes")
    assert final.status_code == 409 and final.json()["detail"].startswith("This delivery is dead")
    shown = await operator.act(f"/console/deliveries/{first}/give-up")
    assert shown.status_code == 200 and "nothing to give up" in shown.text


async def test_hostile_give_up_requests_are_problems_and_change_nothing(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay, operator: ConsoleClient
) -> None:
    first, *_ = await blocked_line(engine, clock, sink, ordered, behind=0)
    mine = f"/console/deliveries/{first}/give-up"
    for path, fields, status in [
        ("/console/deliveries/nope/give-up", {}, 404),
        (f"/console/deliveries/{UNKNOWN}/give-up", {"confirm": "yes"}, 404),
        (f"/console/deliveries/{first.upper()}/give-up", {"confirm": "yes"}, 404),
        ("/console/deliveries/%00/give-up", {}, 404),
        ("/console/deliveries/" + "a" * 5000 + "/give-up", {}, 404),
        (mine, {"confirm": "yes", "reason": "r" * 201}, 400),
        (mine, {"confirm": "yes", "reason": "a\x00b"}, 400),
        (mine, {"confirm": "yes", "reason": "\u202e\u0007bell"}, 400),
        (mine, {"confirm": "yes", "reason": "x" * 20_000}, 400),  # over the form's limit
    ]:
        answer = await operator.act(path, **fields)
        assert answer.status_code == status, (path[:80], fields, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
    assert (await rows(engine, [first]))[0]["status"] == PENDING


async def test_give_up_wants_a_post_with_the_sessions_csrf_token_and_one_of_each_field(
    engine: AsyncEngine, clock: Clock, sink: Sink, ordered: Relay, operator: ConsoleClient
) -> None:
    first, *_ = await blocked_line(engine, clock, sink, ordered, behind=0)
    url = f"/console/deliveries/{first}/give-up"
    got = await operator.http.get(url)
    assert got.status_code == 405 and got.headers["allow"] == "POST"
    for csrf in ("", "0" * 64):
        forged = await operator.http.post(url, data={"csrf": csrf, "confirm": "yes"})
        assert forged.status_code == 403
    repeated = await operator.http.post(
        url,
        content=f"csrf={operator.csrf}&confirm=yes&reason=a&reason=b".encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert repeated.status_code == 400 and "more than once" in repeated.json()["detail"]
    as_json = await operator.http.post(
        url, content=json.dumps({"csrf": operator.csrf, "confirm": "yes"}).encode()
    )
    assert as_json.status_code == 400
    operator.http.cookies.clear()
    assert (await operator.http.post(url, data={"confirm": "yes"})).status_code == 403
    assert (await rows(engine, [first]))[0]["status"] == PENDING
