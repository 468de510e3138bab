"""Chaos, per request (the X-Sandbox-Chaos header) or per run (settings): API errors, duplicate,
out-of-order and slow callbacks."""

from __future__ import annotations

from datetime import timedelta

from relay.sandbox.settings import ChaosSettings
from tests.sandbox_support import START, reports, sandbox_api, sms_fields
from tests.support import Sink


async def test_api_429_answers_too_many_requests_with_retry_after() -> None:
    async with sandbox_api(chaos=ChaosSettings(retry_after=7)) as api:
        answer = await api.client.post(
            "/messaging/v1/sms", json=sms_fields(), headers={"X-Sandbox-Chaos": "api-429"}
        )
        assert answer.status_code == 429
        assert answer.headers["retry-after"] == "7"
        assert answer.headers["content-type"] == "application/problem+json"
        assert api.sandbox.state.messages == {}


async def test_api_500_answers_a_server_problem_and_records_nothing() -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(
            "/messaging/v1/sms", params=sms_fields(), headers={"X-Sandbox-Chaos": "API-500"}
        )
        assert answer.status_code == 500
        assert answer.json()["status"] == 500
        assert api.sandbox.state.messages == {}


async def test_a_run_with_api_429_always_refuses_and_never_without() -> None:
    async with sandbox_api(chaos=ChaosSettings(api_429=1.0)) as api:
        assert (await api.send()).status_code == 429
    async with sandbox_api(chaos=ChaosSettings(api_429=0.0)) as api:
        assert (await api.send()).status_code == 200


async def test_api_chaos_comes_after_the_key_check() -> None:
    async with sandbox_api(chaos=ChaosSettings(api_500=1.0)) as api:
        answer = await api.client.post(
            "/messaging/v1/sms", json=sms_fields(), headers={"apikey": "wrong"}
        )
    assert answer.status_code == 401


async def test_duplicate_sends_every_report_twice(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.client.post(
            "/messaging/v1/sms",
            json=sms_fields(callbackUrl=sink.url()),
            headers={"X-Sandbox-Chaos": "duplicate"},
        )
        await api.sandbox.scheduler.idle()
    statuses = [r["status"] for r in reports(sink)]
    assert statuses == ["ACCEPTED", "ACCEPTED", "BUFFERED", "BUFFERED", "DELIVERED", "DELIVERED"]


async def test_out_of_order_sends_the_final_report_first(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.client.post(
            "/messaging/v1/sms",
            json=sms_fields(callbackUrl=sink.url()),
            headers={"X-Sandbox-Chaos": "out-of-order"},
        )
        await api.sandbox.scheduler.idle()
    assert [r["status"] for r in reports(sink)] == ["DELIVERED", "ACCEPTED", "BUFFERED"]


async def test_slow_sends_each_report_late_by_the_slow_delay(sink: Sink) -> None:
    chaos = ChaosSettings(slow=1.0, slow_delay=timedelta(minutes=5))
    async with sandbox_api(chaos=chaos) as api:
        request_id = (await api.send(callbackUrl=sink.url())).json()["requestId"]
        await api.sandbox.scheduler.idle()
        callbacks = api.sandbox.state.callbacks_of(request_id)
    sent = [c.attempts[0].sent_at - START for c in callbacks]
    late = timedelta(minutes=5)
    assert sent == [late, late + timedelta(seconds=1), late + timedelta(seconds=3)]


async def test_a_run_without_chaos_sends_each_report_once_in_order(sink: Sink) -> None:
    async with sandbox_api() as api:
        for _ in range(5):
            await api.send(callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
    assert len(reports(sink)) == 15
    assert all(not c.duplicate for c in api.sandbox.state.callbacks.values())


async def test_a_run_with_a_share_of_one_gives_every_message_that_chaos(sink: Sink) -> None:
    async with sandbox_api(chaos=ChaosSettings(out_of_order=1.0), seed=1) as api:
        for _ in range(3):
            await api.send(callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
        messages = list(api.sandbox.state.messages.values())
    assert all(m.chaos == frozenset({"out-of-order"}) for m in messages)
    for message in messages:
        statuses = [r["status"] for r in reports(sink) if r["requestId"] == message.request_id]
        assert statuses == ["DELIVERED", "ACCEPTED", "BUFFERED"]
