"""The sandbox's callback scheduler: callbacks at their time on the platform's schedules, in order
per subject, every attempt recorded with the receiver's answer; time is virtual or stepped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl

import httpx
import pytest

from relay.delivery.policies import PLATFORM_NUMINFO, PLATFORM_SMS, attempt_times
from relay.sandbox.callbacks import Scheduler
from relay.sandbox.state import Callback, State
from relay.sandbox.stepped_clock import SteppedClock
from relay.simulator.clocks import VirtualClock
from tests.store_support import eventually
from tests.support import Answer, Sink

START = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def callback(sink: Sink, n: int = 1, **changes: object) -> Callback:
    fields: dict[str, object] = {
        "id": f"cb-{n}",
        "subject": "msg-1",
        "kind": "sms.dlr",
        "label": f"report {n}",
        "url": sink.url(),
        "method": "POST",
        "body": {"requestId": "msg-1", "n": n},
        "policy": "platform-sms",
        "due_at": START,
    }
    return Callback(**(fields | changes))  # type: ignore[arg-type]


@pytest.fixture
async def running(sink: Sink) -> AsyncIterator[Scheduler]:
    clock = VirtualClock(START)
    async with httpx.AsyncClient() as client:
        scheduler = Scheduler(State(), clock, client)
        task = asyncio.create_task(scheduler.run())
        try:
            yield scheduler
        finally:
            task.cancel()


async def test_a_callback_is_sent_at_its_time_and_the_answer_is_recorded(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    sink.answers["/hook"] = Answer(201, body=b"got it")
    sent = scheduler.schedule(callback(sink, due_at=START + timedelta(minutes=5)))
    await scheduler.idle()
    assert sent.state == "delivered"
    [attempt] = sent.attempts
    assert (attempt.status_code, attempt.answer, attempt.error) == (201, "got it", None)
    assert attempt.sent_at == START + timedelta(minutes=5)
    assert attempt.duration_ms > 0
    assert json.loads(sink.requests[0].body) == {"requestId": "msg-1", "n": 1}
    assert sink.requests[0].headers["content-type"] == "application/json"


async def test_get_sends_the_body_as_query_parameters_kept_with_the_urls_own(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    body = {"requestId": "msg-1", "size": 2, "flash": False, "none": None}
    scheduler.schedule(callback(sink, url=sink.url() + "?token=t", method="GET", body=body))
    await scheduler.idle()
    [request] = sink.requests
    assert request.method == "GET" and request.body == b""
    assert parse_qsl(request.query) == [
        ("token", "t"),
        ("requestId", "msg-1"),
        ("size", "2"),
        ("flash", "false"),
    ]


async def test_failures_are_retried_on_the_platform_sms_schedule(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    sink.script["/hook"] = [Answer(500), Answer(503), Answer(200)]
    sent = scheduler.schedule(callback(sink))
    await scheduler.idle()
    assert [a.status_code for a in sent.attempts] == [500, 503, 200]
    expected = list(attempt_times(PLATFORM_SMS, START, succeed_at=3))
    assert [a.sent_at for a in sent.attempts] == expected
    assert sent.state == "delivered"


async def test_numinfo_counts_only_200_as_success_and_gives_up_after_48_hours(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    sink.answers["/hook"] = Answer(204)
    sent = scheduler.schedule(callback(sink, policy="platform-numinfo", kind="numinfo.gnp"))
    await scheduler.idle()
    assert sent.state == "given-up"
    assert [a.sent_at for a in sent.attempts] == list(attempt_times(PLATFORM_NUMINFO, START))
    assert sent.attempts[-1].sent_at <= START + timedelta(hours=48)


async def test_an_unreachable_receiver_is_an_attempt_with_an_error(
    running: Scheduler,
) -> None:
    scheduler = running
    sent = scheduler.schedule(
        Callback(
            "cb",
            "s",
            "tts.event",
            "started",
            "http://127.0.0.1:9/nowhere",
            "POST",
            {},
            "standard",
            START,
        )
    )
    await scheduler.idle()
    assert sent.state == "given-up"
    assert len(sent.attempts) == 8  # standard: 8 attempts in all
    assert all(a.status_code is None and a.error for a in sent.attempts)


async def test_one_subjects_callbacks_go_in_order_even_when_the_first_is_retried(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    sink.script["/hook"] = [Answer(500), Answer(500)]
    first = scheduler.schedule(callback(sink, 1))
    second = scheduler.schedule(callback(sink, 2, due_at=START + timedelta(seconds=1)))
    await scheduler.idle()
    assert [json.loads(b)["n"] for b in sink.bodies()] == [1, 1, 1, 2]
    assert first.state == second.state == "delivered"
    assert second.attempts[0].sent_at >= first.attempts[-1].sent_at


async def test_a_duplicate_is_sent_after_acceptance_and_marked(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    sent = scheduler.schedule(callback(sink, duplicate=True))
    await scheduler.idle()
    assert [(a.status_code, a.duplicate) for a in sent.attempts] == [(200, False), (200, True)]
    assert sink.bodies()[0] == sink.bodies()[1]


async def test_resend_adds_an_attempt_marked_resent(running: Scheduler, sink: Sink) -> None:
    scheduler = running
    sent = scheduler.schedule(callback(sink))
    await scheduler.idle()
    scheduler.resend(sent)
    await scheduler.idle()
    assert [a.resent for a in sent.attempts] == [False, True]
    assert len(sink.requests) == 2


async def test_reset_drops_pending_callbacks(running: Scheduler, sink: Sink) -> None:
    scheduler = running
    scheduler.state.callbacks.clear()
    scheduler.schedule(callback(sink, due_at=START + timedelta(hours=1)))
    scheduler.reset()
    scheduler.state.clear()
    await scheduler.idle()
    assert sink.requests == []


async def test_an_unknown_policy_is_refused(running: Scheduler, sink: Sink) -> None:
    scheduler = running
    with pytest.raises(ValueError, match="unknown policy"):
        scheduler.schedule(callback(sink, policy="never"))


async def test_a_stepped_clock_sends_nothing_before_the_test_moves_time(sink: Sink) -> None:
    clock = SteppedClock(START)
    async with httpx.AsyncClient() as client:
        scheduler = Scheduler(State(), clock, client)
        task = asyncio.create_task(scheduler.run())
        try:
            sent = scheduler.schedule(callback(sink, due_at=START + timedelta(seconds=30)))
            await scheduler.idle()
            assert sent.attempts == []
            clock.advance(timedelta(seconds=29))
            await scheduler.idle()
            assert sent.attempts == []
            clock.advance(timedelta(seconds=1))
            await eventually(lambda: sent.state == "delivered")
            assert sent.attempts[0].sent_at == START + timedelta(seconds=30)
        finally:
            task.cancel()


async def test_after_100_failures_in_a_row_the_sending_pauses_10_minutes(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    sink.script["/hook"] = [Answer(500)] * 101
    sent = scheduler.schedule(callback(sink))
    await scheduler.idle()
    times = [a.sent_at for a in sent.attempts]
    assert times == list(attempt_times(PLATFORM_SMS, START, succeed_at=102))
    assert times[100] - times[99] == timedelta(minutes=10)
    assert sent.state == "delivered"


class Silent:
    """A receiver on 127.0.0.1 that reads each request and never answers: counts what it saw
    and how many it held at once."""

    def __init__(self) -> None:
        self.seen = 0
        self.holding = 0
        self.most = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.seen += 1
        self.holding += 1
        self.most = max(self.most, self.holding)
        try:
            await reader.read()  # until the sender gives up and closes
        except ConnectionError:
            pass
        finally:
            self.holding -= 1
            writer.close()


async def test_a_receiver_that_never_answers_holds_only_the_sends_in_flight() -> None:
    silent = Silent()
    server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clock = SteppedClock(START)
    limits = httpx.Limits(max_connections=5)
    try:
        async with httpx.AsyncClient(limits=limits) as client:
            scheduler = Scheduler(State(), clock, client, max_in_flight=5, timeout=0.3)
            task = asyncio.create_task(scheduler.run())
            try:
                sent = [
                    scheduler.schedule(
                        Callback(
                            id=f"cb-{n}",
                            subject=f"msg-{n}",
                            kind="sms.dlr",
                            label="report",
                            url=f"http://127.0.0.1:{port}/hook",
                            method="POST",
                            body={"n": n},
                            policy="platform-sms",
                            due_at=START,
                        )
                    )
                    for n in range(20)
                ]
                await eventually(lambda: all(cb.attempts for cb in sent), timeout=30)
            finally:
                task.cancel()
    finally:
        server.close()
    attempts = [a for cb in sent for a in cb.attempts]
    assert len(attempts) == silent.seen == 20  # each recorded attempt was sent, once
    assert silent.most <= 5
    assert {a.error for a in attempts} == {"no answer within 0.3 s"}


async def test_a_callback_url_httpx_cannot_send_is_an_attempts_error(
    running: Scheduler, sink: Sink
) -> None:
    scheduler = running
    sent = scheduler.schedule(
        callback(sink, url="http://127.0.0.1:abc/hook", policy="platform-status")
    )
    await eventually(lambda: sent.attempts)
    assert sent.attempts[0].status_code is None
    assert "cannot send" in (sent.attempts[0].error or "")
