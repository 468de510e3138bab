"""The control API under /_sandbox/: list messages with their callbacks and the receiver's
answers, wait for a message (long-poll, bounded), send a callback again, magic numbers, reset."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from relay.sandbox.numbers import NUMBERS
from relay.sandbox.stepped_clock import SteppedClock
from tests.sandbox_support import START, reports, sandbox_api
from tests.support import Answer, Sink


async def test_messages_list_their_callbacks_with_the_receivers_answers(sink: Sink) -> None:
    sink.script["/hook"] = [Answer(503, body=b"busy")]
    async with sandbox_api() as api:
        sent = (await api.send(callbackUrl=sink.url(), message="hello")).json()
        await api.send(to="+99900000002")
        await api.sandbox.scheduler.idle()
        listed = (await api.client.get("/_sandbox/messages", params={"text": "hello"})).json()
    [message] = listed["messages"]
    assert message["requestId"] == sent["requestId"]
    assert (message["message"], message["status"], message["outcome"]) == (
        "hello",
        "DELIVERED",
        "delivered",
    )
    assert [h["status"] for h in message["history"]] == ["ACCEPTED", "BUFFERED", "DELIVERED"]
    first = message["callbacks"][0]
    assert first["state"] == "delivered"
    assert [(a["statusCode"], a["answer"]) for a in first["attempts"]] == [
        (503, "busy"),
        (200, "thanks"),
    ]
    assert all(a["durationMs"] > 0 for a in first["attempts"])


@pytest.mark.parametrize(
    ("query", "count"),
    [
        ({}, 2),
        ({"to": "+99900000002"}, 1),
        ({"status": "rejected"}, 1),
        ({"status": "DELIVERED", "to": "+99900000002"}, 0),
        ({"text": "nothing like it"}, 0),
    ],
)
async def test_the_list_filters_by_to_text_and_status(query: dict[str, str], count: int) -> None:
    async with sandbox_api() as api:
        await api.send()
        await api.send(to="+99900000002")
        await api.sandbox.scheduler.idle()
        answer = await api.client.get("/_sandbox/messages", params=query)
    assert len(answer.json()["messages"]) == count


async def test_wait_answers_once_a_matching_message_arrives() -> None:
    async with sandbox_api() as api:
        waiting = asyncio.create_task(
            api.client.get(
                "/_sandbox/messages/wait", params={"to": "+99900000001", "status": "UNDELIVERABLE"}
            )
        )
        await api.send()
        await api.send(to="+99900000001")
        answer = await asyncio.wait_for(waiting, 10)
    assert answer.status_code == 200
    assert (answer.json()["to"], answer.json()["status"]) == ("+99900000001", "UNDELIVERABLE")


async def test_wait_gives_up_after_its_timeout_with_a_404_problem() -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(
            "/_sandbox/messages/wait", params={"text": "never", "timeout": "0"}
        )
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"timeout": "-1"}, "timeout"),
        ({"timeout": "61"}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"timeout": "nan"}, "timeout"),
        ({"colour": "red"}, "colour"),
        ([("to", "+1"), ("to", "+2")], "to"),
    ],
)
async def test_bad_wait_parameters_are_400_problems(
    query: dict[str, str] | list[tuple[str, str]], field: str
) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get("/_sandbox/messages/wait", params=query)
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == field


async def test_a_callback_is_sent_again_on_request(sink: Sink) -> None:
    async with sandbox_api() as api:
        request_id = (await api.send(callbackUrl=sink.url())).json()["requestId"]
        await api.sandbox.scheduler.idle()
        listed = (await api.client.get("/_sandbox/callbacks")).json()["callbacks"]
        final = next(c for c in listed if c["label"] == "DELIVERED")
        answer = await api.client.post(f"/_sandbox/callbacks/{final['id']}/resend")
        assert answer.status_code == 202
        await api.sandbox.scheduler.idle()
        again = api.sandbox.state.callbacks[final["id"]]
    statuses = [r["status"] for r in reports(sink)]
    assert statuses == ["ACCEPTED", "BUFFERED", "DELIVERED", "DELIVERED"]
    assert [a.resent for a in again.attempts] == [False, True]
    assert final["subject"] == request_id


async def test_resending_an_unknown_callback_is_a_404_problem() -> None:
    async with sandbox_api() as api:
        answer = await api.client.post("/_sandbox/callbacks/nope/resend")
    assert answer.status_code == 404


async def test_reset_forgets_everything_and_cancels_pending_callbacks(sink: Sink) -> None:
    clock = SteppedClock(START)
    async with sandbox_api(clock=clock) as api:
        await api.send(callbackUrl=sink.url())
        answer = await api.client.post("/_sandbox/reset")
        assert answer.status_code == 204
        clock.advance(timedelta(hours=1))
        await api.sandbox.scheduler.idle()
        assert (await api.client.get("/_sandbox/messages")).json()["messages"] == []
        assert api.sandbox.state.callbacks == {}
    assert [r["status"] for r in reports(sink)] in ([], ["ACCEPTED"])  # sent before the reset


async def test_the_magic_numbers_are_listed() -> None:
    async with sandbox_api() as api:
        listed = (await api.client.get("/_sandbox/numbers")).json()["numbers"]
    assert [n["number"] for n in listed] == [n.number for n in NUMBERS]
    assert {"number", "product", "outcome", "errorCode", "implemented"} <= set(listed[0])


@pytest.mark.parametrize("path", ["/_sandbox/messages", "/_sandbox/messages/wait"])
@pytest.mark.parametrize("status", ["bogus", "", "DELIVERED,REJECTED"])
async def test_an_unknown_status_filter_is_a_400_naming_it(path: str, status: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(path, params={"status": status, "timeout": "0"})
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in answer.json()["errors"]] == ["status"]


async def test_the_message_list_is_paged_by_limit_and_offset() -> None:
    async with sandbox_api() as api:
        for n in range(5):
            await api.send(message=f"hello {n}")
        default = (await api.client.get("/_sandbox/messages")).json()
        page = (await api.client.get("/_sandbox/messages?limit=2&offset=3")).json()
    assert (default["total"], default["limit"], default["offset"]) == (5, 100, 0)
    assert len(default["messages"]) == 5
    assert [m["message"] for m in page["messages"]] == ["hello 3", "hello 4"]
    assert (page["total"], page["limit"], page["offset"]) == (5, 2, 3)


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=1001",
        "limit=",
        "limit=ten",
        "limit=1_0",
        "limit=%D9%A1",
        "offset=-1",
        "offset=" + "9" * 5000,
        "limit=1&limit=2",
    ],
)
async def test_a_bad_paging_parameter_is_a_400_naming_it(query: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get("/_sandbox/messages?" + query)
    assert answer.status_code == 400, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == [query.split("=")[0]]
