"""The simulator against our own receivers: every scenario stored exactly once despite retries,
duplicates and shuffling; the platform's schedules to the second; signing; GET; the CLI."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from freezegun import freeze_time
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import SourceConfig
from receivers.store import queries
from receivers.store.engine import create_engine
from relay.delivery.policies import BUILTIN_POLICIES, attempt_times
from relay.simulator.cli import simulate
from relay.simulator.clocks import VirtualClock
from relay.simulator.platform import Platform
from relay.simulator.run import RunOptions, plan, run_units
from relay.simulator.scenarios import SCENARIOS, Callback
from relay.simulator.testing import PlatformSimulator
from relay.simulator.wire import Credentials, Endpoint
from tests.conftest import TOKEN, running_client
from tests.support import free_port
from tests.test_restart import start_server

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SIGNING_SECRET = "s3cret-of-the-platform-0001"
PLATFORM_PASSWORD = "pw-of-the-platform-0001"


class Flaky:
    """ASGI middleware: answers 503 to every ``every``-th request before the app sees it."""

    def __init__(self, app: ASGIApp, every: int) -> None:
        self.app, self.every, self.count = app, every, 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.count += 1
            if self.count % self.every == 0:
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await self.app(scope, receive, send)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_every_scenario_is_stored_exactly_once(engine: AsyncEngine, name: str) -> None:
    async with running_client(engine) as client:
        flaky = Flaky(client.app, every=4)  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=flaky)
        async with httpx.AsyncClient(transport=transport) as platform_client:
            platform = Platform(
                platform_client,
                Endpoint.parse(f"http://relay.test/hooks?token={TOKEN}"),
                clock=VirtualClock(START),
                duplicate_rate=0.5,
                rng=random.Random(7),
            )
            options = RunOptions(count=12, concurrency=4, shuffle=True)
            units = plan(SCENARIOS[name], options, random.Random(name))
            results = await run_units(platform, units, options)

    assert not any(r.given_up for r in results)
    answers = [a.status_code for r in results for a in r.attempts]
    assert 503 in answers and answers.count(200) > len(results)  # retries and duplicates
    events = await queries.list_events(engine, limit=10_000)
    assert len(events) == len(results)  # one stored event per callback, whatever the retries
    assert sum(e.duplicates for e in events) == sum(
        sum(1 for a in r.attempts if a.status_code == 200) - 1 for r in results
    )


def always(status: int) -> ASGIApp:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.mark.slow
@pytest.mark.parametrize(
    ("callback", "policy"),
    [
        (SCENARIOS["sms-inbound"].build(random.Random(1), {})[0], "platform-sms"),
        (SCENARIOS["numinfo-gnp"].build(random.Random(1), {})[0], "platform-numinfo"),
        (SCENARIOS["numinfo-gnv"].build(random.Random(1), {})[0], "platform-numinfo"),
        (SCENARIOS["conversations-status"].build(random.Random(1), {})[0], "platform-status"),
        (
            Callback(
                "conversations.inbound",
                {"event": "MoMessage", "messageId": "m", "channel": "appa"},
                "text",
            ),
            "platform-appa",
        ),
        (
            Callback(
                "conversations.inbound",
                {"event": "MoMessage", "messageId": "m", "channel": "sms"},
                "sms",
            ),
            "platform-sms",
        ),
        (SCENARIOS["tts-call"].build(random.Random(1), {})[0], "standard"),
    ],
)
async def test_retry_schedule_of_every_platform_policy(callback: Callback, policy: str) -> None:
    expected = list(attempt_times(BUILTIN_POLICIES[policy], START))
    with freeze_time(START) as frozen:
        clock = VirtualClock(START, tick=frozen.tick)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=always(500))) as client:
            platform = Platform(client, Endpoint.parse("http://receiver.test/hooks"), clock=clock)
            result = await platform.deliver(callback)
        assert datetime.now(UTC) >= expected[-1]  # freezegun moved with the platform

    assert result.given_up
    assert [a.sent_at for a in result.attempts] == expected
    assert {a.status_code for a in result.attempts} == {500}
    if policy == "platform-sms":  # every 10 s, 10 min pause after each 100 failures, 48 h
        assert expected[99] - expected[0] == timedelta(seconds=990)
        assert expected[100] - expected[99] == timedelta(minutes=10)
        assert (
            expected[-1] - expected[0]
            <= timedelta(hours=48)
            < expected[-1] - expected[0] + timedelta(minutes=10, seconds=10)
        )
    if policy == "platform-numinfo":
        minutes = [(t - START) // timedelta(minutes=1) for t in expected[:8]]
        assert minutes == [0, 1, 6, 16, 36, 66, 126, 186]
    if policy == "platform-status":
        assert len(expected) == 3


async def test_numinfo_success_is_200_within_two_seconds(engine: AsyncEngine) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=always(204))) as client:
        platform = Platform(
            client,
            Endpoint.parse("http://receiver.test/hooks"),
            clock=VirtualClock(START),
            retry=False,
        )
        gnp = SCENARIOS["numinfo-gnp"].build(random.Random(1), {})[0]
        dlr = SCENARIOS["sms-dlr"].build(random.Random(1), {})[0]
        assert (await platform.deliver(gnp)).given_up  # 204 is not the platform's 200
        assert not (await platform.deliver(dlr)).given_up  # any 2xx elsewhere


@pytest.mark.slow
@pytest.mark.parametrize("method", ["HS256", "HS512"])
async def test_signed_callbacks_are_verified_by_our_receivers(
    make_client: Any, engine: AsyncEngine, method: str
) -> None:
    source = SourceConfig(signature_secret=SIGNING_SECRET, signature_method=method)
    async with make_client({"default": source}) as receiver:
        transport = httpx.ASGITransport(app=receiver.app)
        async with httpx.AsyncClient(transport=transport) as client:
            endpoint = Endpoint.parse("http://relay.test/hooks")
            good = Platform(
                client,
                endpoint,
                clock=VirtualClock(),
                credentials=Credentials(SIGNING_SECRET, method),
            )
            bad = Platform(
                client,
                endpoint,
                clock=VirtualClock(),
                retry=False,
                credentials=Credentials("wrong", method),
            )
            callbacks = SCENARIOS["conversations-status"].build(random.Random(3), {})
            assert [(await good.deliver(c)).answers for c in callbacks] == [[200]] * len(callbacks)
            inbound = SCENARIOS["conversations-inbound"].build(random.Random(3), {})[0]
            assert (await bad.deliver(inbound)).answers == [401]
    assert await queries.count_events(engine) == len(callbacks)


async def test_get_variant_and_basic_auth_from_the_url(
    make_client: Any, engine: AsyncEngine
) -> None:
    source = SourceConfig(basic_auth=f"platform:{PLATFORM_PASSWORD}", token=TOKEN)
    async with make_client({"default": source}) as receiver:
        transport = httpx.ASGITransport(app=receiver.app)
        async with httpx.AsyncClient(transport=transport) as client:
            endpoint = Endpoint.parse(
                f"http://platform:{PLATFORM_PASSWORD}@relay.test/hooks?token={TOKEN}"
            )
            platform = Platform(client, endpoint, clock=VirtualClock(), method="GET")
            callbacks = SCENARIOS["sms-dlr"].build(random.Random(5), {"reference": "order-1"})
            results = [await platform.deliver(c) for c in callbacks]
    assert [r.answers for r in results] == [[200]] * len(callbacks)
    events = await queries.list_events(engine)
    assert {e.method for e in events} == {"GET"}
    assert {e.payload["reference"] for e in events} == {"order-1"}
    assert {e.payload["status"] for e in events} == {c.label for c in callbacks}


async def test_legacy_dlr_scenario_over_get_is_stored_as_sent(engine: AsyncEngine) -> None:
    async with running_client(engine) as receiver:
        transport = httpx.ASGITransport(app=receiver.app)  # type: ignore[attr-defined]
        async with httpx.AsyncClient(transport=transport) as client:
            endpoint = Endpoint.parse(f"http://relay.test/hooks?token={TOKEN}")
            platform = Platform(client, endpoint, clock=VirtualClock(), method="GET")
            units = plan(SCENARIOS["sms-dlr-legacy"], RunOptions(count=6), random.Random(2))
            results = await run_units(platform, units, RunOptions(count=6))

    assert [r.answers for r in results] == [[200]] * len(results)
    sent = {(r.callback.body["msgid"], r.callback.label): r.callback.body for r in results}
    events = await queries.list_events(engine, limit=100)
    assert {e.kind for e in events} == {"sms.dlr"} and {e.method for e in events} == {"GET"}
    assert {(e.payload["msgid"], e.payload["stat"]): e.payload for e in events} == sent
    assert {e.dedup_key for e in events} == {f"{msgid}|{stat}" for msgid, stat in sent}
    assert {stat for _, stat in sent} >= {"buffered", "delivered"}


def all_answered(ran: Result) -> dict[str, Any]:
    """The JSON report of a `relay simulate` run in which every callback got its 200."""
    assert ran.exit_code == 0, ran.output
    report: dict[str, Any] = json.loads(ran.stdout)
    summary = report["summary"]
    assert summary["given_up"] == 0 and summary["answers"] == {"200": summary["attempts"]}
    return report


def token_server(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A real `relay serve` on a free port: the default source by token, database r.db."""
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "r.db"}"\n[sources.default]\ntoken = "{TOKEN}"\n'
    )
    port = free_port()
    return start_server(config, port, tmp_path / "server.log"), port


async def _stored_events(database: Path) -> list[Any]:
    engine = create_engine(f"sqlite:///{database}")
    try:
        return await queries.list_events(engine, limit=1000)
    finally:
        await engine.dispose()


async def _raw_body(database: Path, event_id: str) -> bytes:
    """An event's raw body (lists leave it out)."""
    engine = create_engine(f"sqlite:///{database}")
    try:
        event = await queries.get_event(engine, event_id)
        assert event is not None
        return event.raw_body
    finally:
        await engine.dispose()


@pytest.mark.slow
def test_legacy_dlr_from_the_cli_and_the_platform_fixture_against_a_real_server(
    tmp_path: Path, platform: PlatformSimulator
) -> None:
    server, port = token_server(tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/hooks?token={TOKEN}"
        ran = CliRunner().invoke(
            simulate,
            [
                *("sms-dlr-legacy", "--url", url, "--method", "GET", "--count", "3"),
                *("--seed", "4", "--set", "sender=LEGACYCLI", "--set", "currency=USD", "--json"),
            ],
        )
        platform.target(f"http://127.0.0.1:{port}/hooks", token=TOKEN, method="GET")
        fixture = platform.sms_dlr_legacy(stat="rejected", sender="FIXTURE", err="102")
    finally:
        server.terminate()
        server.wait(timeout=30)

    report = all_answered(ran)
    summary = report["summary"]
    assert fixture.answers == [200]
    events = asyncio.run(_stored_events(tmp_path / "r.db"))
    assert {e.kind for e in events} == {"sms.dlr"} and {e.method for e in events} == {"GET"}
    from_cli = [e for e in events if e.payload["sender"] == "LEGACYCLI"]
    assert len(from_cli) == summary["events"] and len(events) == len(from_cli) + 1
    assert all(e.payload["currency"] == "USD" for e in from_cli)
    assert {a["event"] for a in report["attempts"]} == {
        f"{e.payload['msgid']}:{e.payload['stat']}" for e in from_cli
    }
    assert all(set(e.payload) <= LEGACY_FIELDS for e in events)
    assert all(isinstance(value, str) for e in events for value in e.payload.values())
    [rejected] = [e for e in events if e.payload["sender"] == "FIXTURE"]
    assert rejected.payload["stat"] == "rejected" and rejected.payload["err"] == "102"
    raw = asyncio.run(_raw_body(tmp_path / "r.db", rejected.id))
    assert raw.startswith(b"msgid=")  # the query string, as the platform sent it


LEGACY_FIELDS = {"receiver", "msgid", "ttid", "mccmnc", "err", "stat", "sender", "text"}
LEGACY_FIELDS |= {"donedate", "submitdate", "price", "currency", "priceEffective"}


@pytest.mark.slow
def test_cli_list_and_json_run_against_a_real_server(tmp_path: Path) -> None:
    listed = CliRunner().invoke(simulate, ["list"])
    assert listed.exit_code == 0
    assert [line.split()[0] for line in listed.output.splitlines()] == list(SCENARIOS)

    server, port = token_server(tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/hooks?token={TOKEN}"
        ran = CliRunner().invoke(
            simulate,
            [
                "tts-call",
                "--url",
                url,
                "--count",
                "5",
                "--json",
                "--seed",
                "1",
                "--set",
                "network=Acme Mobile",
                "--set",
                "rate=0.05",
                "--duplicate-rate",
                "1",
            ],
        )
        refused = CliRunner().invoke(
            simulate,
            [
                "sms-inbound",
                "--url",
                url.replace(TOKEN, "nope"),
                "--no-retry",
            ],
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    report = all_answered(ran)
    summary = report["summary"]
    assert summary["duplicates_sent"] == summary["events"]
    for attempt in report["attempts"]:
        assert {"event", "attempt", "scheduled_at", "sent_at", "status_code"} <= set(attempt)
    assert refused.exit_code == 1 and "given up    1" in refused.output
