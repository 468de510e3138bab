"""End to end over real HTTP: an app sends SMS through the sandbox; the sandbox's delivery
reports reach a real `relay serve` (receivers, store, in-process worker), which relays them to
an HTTP sink, in order per message."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Any

import httpx
import pytest

from relay.sandbox.app import build_app
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.settings import SandboxSettings
from relay.server.runtime import start
from relay.settings import Settings
from relay.simulator.clocks import VirtualClock
from tests.conftest import TOKEN
from tests.sandbox_support import API_KEY, START, served, sms_fields
from tests.store_support import eventually
from tests.support import Sink

NUMBERS = ["+99900000000", "+99900000001", "+99900000002", "+99900000003", "+4915112345678"]
FINAL = {
    "+99900000000": "DELIVERED",
    "+99900000001": "UNDELIVERABLE",
    "+99900000002": "REJECTED",
    "+99900000003": "EXPIRED",
    "+4915112345678": "DELIVERED",
}


def relay_settings(database_url: str, sink: Sink) -> Settings:
    """`relay serve` with one HTTP destination that keeps each message's events in order."""
    return Settings(
        database_url=database_url,
        sources={"default": {"token": TOKEN}},
        destinations={
            "app": {
                "type": "http",
                "url": sink.url(),
                "policy": "quick",
                "timeout": "2s",
                "ordering": "per-key",
            }
        },
        policies={
            "quick": {"type": "delays", "delays": ["1s"], "then": "1s", "give_up_after": "5m"}
        },
        sweep_interval="200ms",
        lease_margin="1s",
    )


def relayed(sink: Sink) -> dict[str, list[dict[str, Any]]]:
    """The payloads the relay delivered, per requestId, in arrival order."""
    per_message: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for request in sink.requests:
        payload = json.loads(request.body)["payload"]
        per_message[payload["requestId"]].append(payload)
    return per_message


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_reports_reach_the_app_through_relay_serve_in_order(
    database_url: str, sink: Sink, method: str, engine: Any
) -> None:
    runtime = await start(relay_settings(database_url, sink))
    sandbox = Sandbox(SandboxSettings(api_key=API_KEY), clock=VirtualClock(START))
    try:
        async with served(runtime.app()) as relay_url, served(build_app(sandbox)) as sandbox_url:
            sandbox.base_url = sandbox_url
            callback_url = f"{relay_url}/hooks/sms/dlr?token={TOKEN}"
            sent: dict[str, str] = {}
            async with httpx.AsyncClient(base_url=sandbox_url, headers={"apikey": API_KEY}) as app:
                for index, to in enumerate(NUMBERS * 2):
                    fields = sms_fields(
                        to=to,
                        callbackUrl=callback_url,
                        callbackMethod=method,
                        reference=f"order-{index}",
                        message=f"Message {index}",
                    )
                    answer = await app.post("/messaging/v1/sms", json=fields)
                    assert answer.status_code == 200, answer.text
                    sent[answer.json()["requestId"]] = to
                await asyncio.wait_for(sandbox.scheduler.idle(), 60)
            attempts = [a for c in sandbox.state.callbacks.values() for a in c.attempts]
            assert {a.status_code for a in attempts} == {200}, [a.answer for a in attempts]
            expected = sum(3 if FINAL[to] != "REJECTED" else 2 for to in sent.values())
            await eventually(lambda: len(sink.requests) >= expected, timeout=60)
    finally:
        await runtime.engine.dispose()
    per_message = relayed(sink)
    assert set(per_message) == set(sent)
    for request_id, payloads in per_message.items():
        statuses = [p["status"] for p in payloads]
        final = FINAL[sent[request_id]]
        assert statuses == (
            ["ACCEPTED", final] if final == "REJECTED" else ["ACCEPTED", "BUFFERED", final]
        )
        assert len({p["reference"] for p in payloads}) == 1
