"""The simulator against our own receivers: every scenario stored exactly once despite retries,
duplicates and shuffling; the platform's schedules to the second; signing; GET; the CLI."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from freezegun import freeze_time
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import SourceConfig
from receivers.store import queries
from relay.policies import BUILTIN_POLICIES, attempt_times
from relay.simulator.cli import simulate
from relay.simulator.clocks import VirtualClock
from relay.simulator.platform import Platform
from relay.simulator.run import RunOptions, plan, run_units
from relay.simulator.scenarios import SCENARIOS, Callback
from relay.simulator.wire import Credentials, Endpoint
from tests.conftest import TOKEN, running_client
from tests.support import free_port
from tests.test_restart import start_server

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


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


@pytest.mark.parametrize("method", ["HS256", "HS512"])
async def test_signed_callbacks_are_verified_by_our_receivers(
    make_client: Any, engine: AsyncEngine, method: str
) -> None:
    source = SourceConfig(signature_secret="s3cret", signature_method=method)
    async with make_client({"default": source}) as receiver:
        transport = httpx.ASGITransport(app=receiver.app)
        async with httpx.AsyncClient(transport=transport) as client:
            endpoint = Endpoint.parse("http://relay.test/hooks")
            good = Platform(
                client, endpoint, clock=VirtualClock(), credentials=Credentials("s3cret", method)
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
    source = SourceConfig(basic_auth="platform:pw", token=TOKEN)
    async with make_client({"default": source}) as receiver:
        transport = httpx.ASGITransport(app=receiver.app)
        async with httpx.AsyncClient(transport=transport) as client:
            endpoint = Endpoint.parse(f"http://platform:pw@relay.test/hooks?token={TOKEN}")
            platform = Platform(client, endpoint, clock=VirtualClock(), method="GET")
            callbacks = SCENARIOS["sms-dlr"].build(random.Random(5), {"reference": "order-1"})
            results = [await platform.deliver(c) for c in callbacks]
    assert [r.answers for r in results] == [[200]] * len(callbacks)
    events = await queries.list_events(engine)
    assert {e.method for e in events} == {"GET"}
    assert {e.payload["reference"] for e in events} == {"order-1"}
    assert {e.payload["status"] for e in events} == {c.label for c in callbacks}


def test_cli_list_and_json_run_against_a_real_server(tmp_path: Path) -> None:
    listed = CliRunner().invoke(simulate, ["list"])
    assert listed.exit_code == 0
    assert [line.split()[0] for line in listed.output.splitlines()] == list(SCENARIOS)

    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "r.db"}"\n[sources.default]\ntoken = "{TOKEN}"\n'
    )
    port = free_port()
    server = start_server(config, port, tmp_path / "server.log")
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
    assert ran.exit_code == 0, ran.output
    report = json.loads(ran.stdout)
    summary = report["summary"]
    assert summary["given_up"] == 0 and summary["answers"] == {"200": summary["attempts"]}
    assert summary["duplicates_sent"] == summary["events"]
    for attempt in report["attempts"]:
        assert {"event", "attempt", "scheduled_at", "sent_at", "status_code"} <= set(attempt)
    assert refused.exit_code == 1 and "given up    1" in refused.output
