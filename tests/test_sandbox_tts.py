"""The sandbox's text-to-speech: POST /tts/v1/calls answers a TextToSpeechResponse; the call's
events happen on the clock, are listed by GET /tts/v1/calls/{callId}/events and, with an
eventsUrl, are POSTed there one by one, in order."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest

from receivers.payloads.tts import TtsEvent
from relay.sandbox.stepped_clock import SteppedClock
from tests.sandbox_support import START, sandbox_api
from tests.store_support import eventually
from tests.support import Sink


def call(**changes: Any) -> dict[str, Any]:
    """A valid TextToSpeechRequest changed by ``changes`` (None removes a field)."""
    fields = {
        "from": "+4930123456",
        "to": "+4915112345678",
        "message": "Your code is 1 2 3 4",
        "language": "en_gb",
    }
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


async def test_a_call_answers_starting_and_its_events_reach_the_events_url(sink: Sink) -> None:
    async with sandbox_api() as api:
        answer = await api.client.post("/tts/v1/calls", json=call(eventsUrl=sink.url()))
        await api.sandbox.scheduler.idle()
        listed = await api.client.get(f"/tts/v1/calls/{answer.json()['callId']}/events")
    body = answer.json()
    assert answer.status_code == 200
    assert uuid.UUID(body["callId"]).version == 4
    assert (body["status"], body["from"], body["to"]) == (
        "starting",
        "+4930123456",
        "+4915112345678",
    )
    pushed = [json.loads(b) for b in sink.bodies()]
    assert [e["status"] for e in pushed] == ["started", "ringing", "early", "completed"]
    assert listed.json() == pushed
    assert {e["callId"] for e in pushed} == {body["callId"]}
    completed = pushed[-1]
    assert completed["answerTime"] == "2026-11-26T12:00:05.000Z"
    assert int(completed["duration"]) >= 1
    for each in pushed:
        TtsEvent.model_validate(each)


async def test_the_not_answered_number_ends_in_hangup_without_completed(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.client.post("/tts/v1/calls", json=call(to="+99900000020", eventsUrl=sink.url()))
        await api.sandbox.scheduler.idle()
    pushed = [json.loads(b) for b in sink.bodies()]
    assert [e["status"] for e in pushed] == ["started", "ringing", "hangup"]
    assert "answerTime" not in pushed[-1]
    assert pushed[-1]["duration"] == "0"


async def test_the_initial_delay_lengthens_the_call() -> None:
    async with sandbox_api() as api:
        short = (await api.client.post("/tts/v1/calls", json=call())).json()["callId"]
        long = (await api.client.post("/tts/v1/calls", json=call(initialDelay=20))).json()["callId"]
        await api.sandbox.scheduler.idle()
        calls = api.sandbox.state.calls
        durations = [int(calls[c].events[-1]["duration"]) for c in (short, long)]
    assert durations[1] - durations[0] == 20


async def test_events_are_listed_as_they_happen_on_the_clock() -> None:
    clock = SteppedClock(START)
    async with sandbox_api(clock) as api:
        call_id = (await api.client.post("/tts/v1/calls", json=call())).json()["callId"]

        async def statuses() -> list[str]:
            events = (await api.client.get(f"/tts/v1/calls/{call_id}/events")).json()
            return [e["status"] for e in events]

        await eventually(lambda: api.sandbox.state.calls[call_id].status == "started")
        assert await statuses() == ["started"]
        clock.advance(timedelta(seconds=1))
        await eventually(lambda: api.sandbox.state.calls[call_id].status == "ringing")
        assert await statuses() == ["started", "ringing"]


async def test_a_call_without_events_url_pushes_nothing() -> None:
    async with sandbox_api() as api:
        await api.client.post("/tts/v1/calls", json=call(eventsUrl=""))
        await api.sandbox.scheduler.idle()
        assert api.sandbox.state.callbacks == {}


@pytest.mark.parametrize(
    "call_id", [str(uuid.uuid4()), "not-a-uuid", "%00", "x" * 5000, "../../messaging/v1/sms"]
)
async def test_events_of_an_unknown_call_are_a_404_problem(call_id: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(f"/tts/v1/calls/{call_id}/events")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"from": None}, "from"),
        ({"to": None}, "to"),
        ({"to": ""}, "to"),
        ({"to": "015112345678"}, "to"),
        ({"to": 4915112345678}, "to"),
        ({"from": ["+4930123456"]}, "from"),
        ({"message": None}, "message"),
        ({"message": ""}, "message"),
        ({"message": "a" * 3001}, "message"),
        ({"message": {"text": "hi"}}, "message"),
        ({"language": None}, "language"),
        ({"language": "klingon"}, "language"),
        ({"language": "EN_GB"}, "language"),
        ({"language": 7}, "language"),
        ({"initialDelay": "5"}, "initialDelay"),
        ({"initialDelay": 1.5}, "initialDelay"),
        ({"initialDelay": True}, "initialDelay"),
        ({"initialDelay": -1}, "initialDelay"),
        ({"initialDelay": 2**40}, "initialDelay"),
        ({"eventsUrl": "ftp://example.com/"}, "eventsUrl"),
        ({"eventsUrl": "/relative"}, "eventsUrl"),
        ({"eventsUrl": 12}, "eventsUrl"),
        ({"eventsUrl": "http://example.com:99999/"}, "eventsUrl"),
        ({"eventsUrl": "http://example.com:abc/"}, "eventsUrl"),
        ({"eventsUrl": "http://example.com/\r\n"}, "eventsUrl"),
        ({"eventsUrl": "http://example.com/\t"}, "eventsUrl"),
    ],
)
async def test_bad_fields_are_a_400_naming_the_field(changes: dict[str, Any], field: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.post("/tts/v1/calls", json=call(**changes))
        assert api.sandbox.state.calls == {}
    assert answer.status_code == 400, answer.text
    assert answer.json()["errors"][0]["field"] == field


@pytest.mark.parametrize(
    "body", [b"", b"   ", b"[]", b"null", b"{", b"\xff\xfe", b'{"to": "\\ud800"}']
)
async def test_a_body_that_is_no_json_object_is_a_400(body: bytes) -> None:
    async with sandbox_api() as api:
        answer = await api.client.post(
            "/tts/v1/calls", content=body, headers={"content-type": "application/json"}
        )
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"


async def test_a_huge_body_is_a_413() -> None:
    async with sandbox_api() as api:
        answer = await api.client.post("/tts/v1/calls", json=call(message="a" * 100_000))
    assert answer.status_code == 413


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/tts/v1/calls"),
        ("PUT", "/tts/v1/calls"),
        ("POST", f"/tts/v1/calls/{uuid.uuid4()}/events"),
    ],
)
async def test_wrong_methods_are_405(method: str, path: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.request(method, path)
    assert answer.status_code == 405


@pytest.mark.parametrize("key", [None, "", "wrong"])
async def test_without_the_key_it_is_401(key: str | None) -> None:
    async with sandbox_api() as api:
        api.client.headers.pop("apikey")
        headers = {} if key is None else {"apikey": key}
        started = await api.client.post("/tts/v1/calls", json=call(), headers=headers)
        events = await api.client.get(f"/tts/v1/calls/{uuid.uuid4()}/events", headers=headers)
    assert (started.status_code, events.status_code) == (401, 401)


async def test_chaos_api_429_refuses_the_call() -> None:
    async with sandbox_api() as api:
        answer = await api.client.post(
            "/tts/v1/calls", json=call(), headers={"x-sandbox-chaos": "api-429"}
        )
        assert api.sandbox.state.calls == {}
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "1"


async def test_the_control_api_lists_calls() -> None:
    async with sandbox_api() as api:
        await api.client.post("/tts/v1/calls", json=call(to="+99900000020"))
        await api.sandbox.scheduler.idle()
        [listed] = (await api.client.get("/_sandbox/calls")).json()["calls"]
    assert (listed["status"], listed["answered"]) == ("hangup", False)


async def test_beyond_max_messages_ended_calls_are_forgotten_and_live_ones_kept() -> None:
    clock = SteppedClock(START)
    async with sandbox_api(clock, max_messages=1) as api:
        first = (await api.client.post("/tts/v1/calls", json=call())).json()["callId"]
        refused = await api.client.post("/tts/v1/calls", json=call())
        clock.advance(timedelta(minutes=5))
        await eventually(lambda: api.sandbox.state.calls[first].status == "completed")
        second = (await api.client.post("/tts/v1/calls", json=call())).json()["callId"]
        assert list(api.sandbox.state.calls) == [second]
    assert refused.status_code == 503
