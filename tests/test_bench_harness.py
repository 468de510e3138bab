"""The end-to-end bench's harness (``scripts/harness.py``) measures what its figures claim: the
load is open loop (due times fixed by the rate, a late answer holds back no other request, ack
latency counted from the due time) and the lag is the sink's arrival minus ``received_at``."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from freezegun import freeze_time

from scripts import harness


def test_the_schedule_depends_on_the_rate_alone() -> None:
    assert harness.schedule(10.0, 4, 3) == [10.0, 10.25, 10.5]


async def _serve(hold_first_until: int) -> tuple[asyncio.Server, list[int]]:
    """A server answering each POST (its body: the request's index) with 200; the answer to
    request 0 waits until ``hold_first_until`` requests have arrived."""
    arrived: list[int] = []
    everyone_in = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            index = int(await reader.readexactly(length))
            arrived.append(index)
            if len(arrived) >= hold_first_until:
                everyone_in.set()
            if index == 0:
                await everyone_in.wait()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    return await asyncio.start_server(handle, harness.HOST, 0), arrived


async def test_an_unanswered_request_holds_back_no_other() -> None:
    server, arrived = await _serve(hold_first_until=3)
    port = server.sockets[0].getsockname()[1]
    async with server:
        due = harness.schedule(time.monotonic(), 1000, 3)
        load = await harness.open_loop(
            port, lambda i: harness.post("/", port, str(i).encode()), due, connections=3
        )
    assert load.status == [200, 200, 200]
    assert sorted(arrived) == [0, 1, 2]
    assert load.sent[2] < load.acked[0]  # request 2 went out while request 0 was unanswered
    assert load.waited == 0


async def test_a_busy_pool_opens_one_more_connection_for_a_waiting_request() -> None:
    server, _ = await _serve(hold_first_until=2)
    port = server.sockets[0].getsockname()[1]
    async with server:
        due = [time.monotonic()] * 2
        load = await harness.open_loop(
            port, lambda i: harness.post("/", port, str(i).encode()), due, 1, max_connections=2
        )
    assert load.status == [200, 200]
    assert load.connections == 2
    assert load.sent[1] < load.acked[0]


async def test_a_request_waiting_for_a_connection_counts_its_wait() -> None:
    server, _ = await _serve(hold_first_until=1)
    port = server.sockets[0].getsockname()[1]
    async with server:
        due = [time.monotonic()] * 3  # all due at once, one connection
        load = await harness.open_loop(
            port, lambda i: harness.post("/", port, str(i).encode()), due, connections=1
        )
    assert load.waited == 2
    assert load.sent[2] >= load.acked[1]
    ack_ms = load.ack_ms()
    assert ack_ms[2] == (load.acked[2] - due[2]) * 1000
    assert ack_ms[2] > (load.acked[2] - load.sent[2]) * 1000


async def _call(
    app: harness.Asgi, method: str, path: str, body: bytes = b"", status: int = 200, **headers: str
) -> bytes:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    raw = [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": method, "path": path, "headers": raw}, receive, send)
    assert sent[0]["status"] == status
    return bytes(sent[1]["body"])


def test_the_sink_records_arrival_minus_received_at() -> None:
    sink = harness.make_sink()
    envelope = {"id": "e1", "received_at": "2026-03-01T12:00:00.250000Z", "payload": {}}

    async def play() -> tuple[list[list[Any]], dict[str, int]]:
        with freeze_time("2026-03-01 12:00:00.750"):
            await _call(sink, "POST", "/deliveries", json.dumps(envelope).encode())
        await _call(sink, "POST", "/deliveries", b"not an envelope")
        records = json.loads(await _call(sink, "GET", "/_sink/records"))
        count = json.loads(await _call(sink, "GET", "/_sink/count"))
        await _call(sink, "POST", "/_sink/reset")
        assert json.loads(await _call(sink, "GET", "/_sink/count"))["requests"] == 0
        return records, count

    records, count = asyncio.run(play())
    assert count == {"requests": 2, "distinct": 2}
    [(event_id, received_at, lag)] = records
    assert event_id == "e1"
    assert received_at == 1772366400.25
    assert abs(lag - 0.5) < 1e-6


def test_a_failing_sink_answers_500_and_keeps_the_answer_apart() -> None:
    """In mode ``fail`` a POST gets 500 and is not a record; every answer is kept, by the
    ``webhook-id`` header, with its status and the mode it met."""
    sink = harness.make_sink()
    envelope = json.dumps({"id": "e1", "received_at": "2026-03-01T12:00:00Z"}).encode()

    async def play() -> tuple[list[list[Any]], list[list[Any]]]:
        await _call(sink, "POST", "/_sink/mode", b'{"mode": "fail"}')
        await _call(sink, "POST", "/d", envelope, status=500, webhook_id="w1")
        await _call(sink, "POST", "/_sink/mode", b'{"mode": "ok"}')
        await _call(sink, "POST", "/d", envelope, webhook_id="w1")
        await _call(sink, "POST", "/_sink/mode", b'{"mode": "late"}', status=400)
        records = json.loads(await _call(sink, "GET", "/_sink/records"))
        return records, json.loads(await _call(sink, "GET", "/_sink/answers"))

    records, answers = asyncio.run(play())
    assert [row[0] for row in records] == ["w1"]
    assert [(row[0], row[2], row[3]) for row in answers] == [("w1", 500, "fail"), ("w1", 200, "ok")]


def test_a_prometheus_figure_is_summed_over_its_samples() -> None:
    text = (
        "# TYPE relay_sweeps_total counter\n"
        'relay_sweeps_total{outcome="ok"} 3.0\n'
        'relay_sweeps_total{outcome="failed"} 1.0\n'
        "relay_sweeps_created 1.7e9\n"
    )
    assert harness.metric(text, "relay_sweeps_total") == 4.0
    assert harness.metric(text, "relay_sweeps_total", outcome="ok") == 3.0
    assert harness.metric(text, "relay_missing_total") == 0.0


def test_every_report_is_a_new_event() -> None:
    first, second = (json.loads(harness.dlr_body(i)) for i in (1, 2))
    assert first["requestId"] != second["requestId"]
    assert {"requestId", "status", "parts"} <= first.keys()


def test_a_reading_between_two_samples_is_interpolated() -> None:
    samples = [(10.0, 0.0), (10.1, 0.05), (10.2, 0.15)]
    assert harness.interpolate(samples, 10.15) == pytest.approx(0.1)
    assert harness.interpolate(samples, 10.1) == 0.05
    assert harness.interpolate(samples, 9.0) == 0.0  # before the first: the first
    assert harness.interpolate(samples, 11.0) == 0.15  # after the last: the last
