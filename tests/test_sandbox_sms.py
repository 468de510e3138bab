"""The sandbox's SMS API: send (POST body or GET query), the RestMessageResponse answer, the
delivery reports that follow the state machine on the clock, reading a message, conversions."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qs

import pytest

from relay.sandbox.stepped_clock import SteppedClock
from tests.sandbox_support import BASE, START, reports, sandbox_api, sms_fields
from tests.store_support import eventually
from tests.support import Sink

SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)


async def test_post_answers_a_rest_message_response_with_parts_and_prices() -> None:
    async with sandbox_api() as api:
        answer = await api.send(message="a" * 161, reference="order-1")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert body["status"] == "ACCEPTED"
    assert (body["size"], len(body["parts"])) == (2, 2)
    assert body["overallPrice"] == "0.0900"
    assert {p["price"] for p in body["parts"]} == {"0.0450"}
    assert {p["deliveryState"] for p in body["parts"]} == {"ACCEPTED"}
    assert body["reference"] == "order-1"
    assert body["href"] == f"{BASE}/messaging/v1/messages/{body['requestId']}"
    assert (body["to"], body["from"]) == ("+4915112345678", "ACME")


async def test_get_sends_with_the_query_parameters() -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(
            "/messaging/v1/sms", params=sms_fields(message="Ж" * 71, encoding="AUTO")
        )
        assert answer.status_code == 200
        assert answer.json()["size"] == 2
        assert api.sandbox.state.messages[answer.json()["requestId"]].encoding == "UNICODE"


async def test_delivery_reports_follow_the_state_machine_in_order(sink: Sink) -> None:
    async with sandbox_api() as api:
        sent = (await api.send(callbackUrl=sink.url(), reference="ref-7")).json()
        await api.sandbox.scheduler.idle()
        message = api.sandbox.state.messages[sent["requestId"]]
    got = reports(sink)
    assert [r["status"] for r in got] == ["ACCEPTED", "BUFFERED", "DELIVERED"]
    assert {r["requestId"] for r in got} == {sent["requestId"]}
    assert {r["reference"] for r in got} == {"ref-7"}
    assert got[-1]["doneDate"] == "2026-11-26T12:00:03.000Z"
    assert [at - START for _, at in message.history] == [timedelta(0), SECOND, 3 * SECOND]


async def test_get_reports_carry_the_fields_as_query_parameters(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.send(callbackUrl=sink.url() + "?token=t", callbackMethod="get", reference="r")
        await api.sandbox.scheduler.idle()
    queries = [parse_qs(r.query) for r in sink.requests]
    assert [q["status"] for q in queries] == [["ACCEPTED"], ["BUFFERED"], ["DELIVERED"]]
    assert all(q["reference"] == ["r"] and q["token"] == ["t"] for q in queries)
    assert all(r.method == "GET" and r.body == b"" for r in sink.requests)


async def test_without_callback_url_no_report_is_sent(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.send(callbackUrl="")
        await api.sandbox.scheduler.idle()
        assert api.sandbox.state.callbacks == {}
        [message] = api.sandbox.state.messages.values()
        assert message.status == "DELIVERED"


@pytest.mark.parametrize(
    ("to", "statuses", "error_code", "done_after"),
    [
        ("+99900000000", ["ACCEPTED", "BUFFERED", "DELIVERED"], None, 3 * SECOND),
        ("+99900000001", ["ACCEPTED", "BUFFERED", "UNDELIVERABLE"], "001", 5 * SECOND),
        ("+99900000006", ["ACCEPTED", "BUFFERED", "UNDELIVERABLE"], "027", 5 * SECOND),
        ("+99900000002", ["ACCEPTED", "REJECTED"], "102", SECOND),
        ("+99900000003", ["ACCEPTED", "BUFFERED", "EXPIRED"], "003", timedelta(hours=48)),
        ("+99900000004", ["ACCEPTED", "BUFFERED", "DELIVERED"], None, timedelta(hours=2)),
        ("+4915112345678", ["ACCEPTED", "BUFFERED", "DELIVERED"], None, 3 * SECOND),
    ],
)
async def test_magic_numbers_force_the_outcome(
    sink: Sink, to: str, statuses: list[str], error_code: str | None, done_after: timedelta
) -> None:
    async with sandbox_api() as api:
        await api.send(to=to, callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
    got = reports(sink)
    assert [r["status"] for r in got] == statuses
    assert got[-1].get("errorCode") == error_code
    assert {p.get("errorCode") for p in got[-1]["parts"]} == {error_code}
    assert got[-1]["doneDate"] == (START + done_after).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


async def test_a_rejected_message_is_not_charged(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.send(to="+99900000002", callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
    assert reports(sink)[-1]["overallPrice"] == "0.0000"


async def test_validity_ends_a_late_delivery_as_expired(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.send(to="+99900000004", validity="60", callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
    final = reports(sink)[-1]
    assert final["status"] == "EXPIRED"
    assert final["doneDate"] == "2026-11-26T13:00:00.000Z"


async def test_send_date_time_delays_the_delivery(sink: Sink) -> None:
    async with sandbox_api() as api:
        answer = await api.send(sendDateTime="2026-11-26T14:00:00+01:00", callbackUrl=sink.url())
        assert answer.status_code == 200, answer.text
        await api.sandbox.scheduler.idle()
        [message] = api.sandbox.state.messages.values()
    assert [(s, at - START) for s, at in message.history] == [
        ("ACCEPTED", timedelta(0)),
        ("BUFFERED", HOUR + SECOND),
        ("DELIVERED", HOUR + 3 * SECOND),
    ]


async def test_a_reply_arrives_as_an_inbound_sms_at_the_inbound_url(sink: Sink) -> None:
    async with sandbox_api(inbound_url=sink.url("/inbound")) as api:
        await api.send(to="+99900000005", **{"from": "+4917012345678"}, callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
    [inbound] = reports(sink, "/inbound")
    assert (inbound["from"], inbound["to"]) == ("+99900000005", "+4917012345678")
    assert inbound["message"] and inbound["missingParts"] is False
    assert inbound["contentList"][0]["sequenceNumber"] == 1
    assert inbound["contentList"][0]["sentDate"] == "2026-11-26T12:00:33.000Z"


async def test_without_an_inbound_url_the_reply_is_not_sent(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.send(to="+99900000005", callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
        kinds = [c.kind for c in api.sandbox.state.callbacks.values()]
    assert kinds == ["sms.dlr"] * 3


async def test_reading_a_message_shows_its_current_state() -> None:
    clock = SteppedClock(START)
    async with sandbox_api(clock=clock) as api:
        request_id = (await api.send()).json()["requestId"]

        async def status() -> str:
            answer = await api.client.get(f"/messaging/v1/messages/{request_id}")
            assert answer.status_code == 200
            return str(answer.json()["status"])

        assert await status() == "ACCEPTED"
        clock.advance(SECOND)
        await eventually(lambda: api.sandbox.state.messages[request_id].status == "BUFFERED")
        assert await status() == "BUFFERED"
        clock.advance(2 * SECOND)
        await eventually(lambda: api.sandbox.state.messages[request_id].status == "DELIVERED")
        assert await status() == "DELIVERED"


async def test_reading_an_unknown_message_is_a_404_problem() -> None:
    async with sandbox_api() as api:
        answer = await api.client.get("/messaging/v1/messages/nope")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/problem+json"


async def test_a_conversion_is_recorded() -> None:
    async with sandbox_api() as api:
        request_id = (await api.send()).json()["requestId"]
        answer = await api.client.post(
            "/messaging/v1/conversion",
            json={"requestId": request_id, "delivered": False, "timestamp": "2026-11-26T12:01:00Z"},
        )
        assert (answer.status_code, answer.content) == (200, b"")
        default = await api.client.post("/messaging/v1/conversion", json={"requestId": request_id})
        assert default.status_code == 200
        conversions = api.sandbox.state.messages[request_id].conversions
    assert conversions == [
        {"delivered": False, "timestamp": "2026-11-26T12:01:00Z"},
        {"delivered": True, "timestamp": START.isoformat()},
    ]


async def test_a_message_keeps_its_latest_100_conversions_and_counts_all() -> None:
    async with sandbox_api() as api:
        request_id = (await api.send()).json()["requestId"]
        for n in range(105):
            stamp = f"2026-11-26T12:{n // 60:02d}:{n % 60:02d}Z"
            await api.client.post(
                "/messaging/v1/conversion", json={"requestId": request_id, "timestamp": stamp}
            )
        [listed] = (await api.client.get("/_sandbox/messages")).json()["messages"]
    assert listed["conversionCount"] == 105
    assert len(listed["conversions"]) == 100
    assert listed["conversions"][0]["timestamp"] == "2026-11-26T12:00:05Z"


async def test_a_conversion_for_an_unknown_request_id_is_a_404_problem() -> None:
    async with sandbox_api() as api:
        answer = await api.client.post("/messaging/v1/conversion", json={"requestId": "nope"})
    assert answer.status_code == 404
    assert answer.json()["status"] == 404


async def test_beyond_max_messages_the_oldest_finished_one_is_forgotten(sink: Sink) -> None:
    async with sandbox_api(max_messages=2) as api:
        first = (await api.send(callbackUrl=sink.url())).json()["requestId"]
        second = (await api.send(callbackUrl=sink.url())).json()["requestId"]
        await api.sandbox.scheduler.idle()
        third = (await api.send()).json()["requestId"]
        assert list(api.sandbox.state.messages) == [second, third]
        assert {c.subject for c in api.sandbox.state.callbacks.values()} == {second}
        gone = await api.client.get(f"/messaging/v1/messages/{first}")
        assert gone.status_code == 404


async def test_when_every_kept_message_is_under_way_a_send_is_a_503_problem() -> None:
    async with sandbox_api(clock=SteppedClock(START), max_messages=2) as api:
        await api.send()
        await api.send()
        answer = await api.send()
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "1"
        assert answer.json()["type"].endswith("sandbox-full")
        assert len(api.sandbox.state.messages) == 2
