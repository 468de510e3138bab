"""A per-key line drains within one job: each end lets the next go in the same call, on SQLite
and PostgreSQL, with every rule of the line kept."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from receivers import SourceConfig
from relay import outbox
from relay.delivery.deliverer import LINE_DRAIN
from relay.outbox.tables import PENDING, SUCCEEDED
from relay.store import inspect
from tests.conftest import TOKEN, running_client
from tests.relay_support import Clock, Relay
from tests.support import Answer, Sink, serving
from tests.test_ordering import QUICK, dlr, seen

SECOND = timedelta(seconds=1)
LINE = 12


@pytest.fixture
def clock() -> Clock:
    return Clock()


def relay_to(
    engine: AsyncEngine, sink: Sink, clock: Clock, *, line_drain: int = LINE_DRAIN
) -> Relay:
    """One per-key HTTP destination, ``crm`` (timeout 5 s), retrying every 10 s for a
    minute; a lease of 60 s."""
    table = {"type": "http", "url": sink.url(), "policy": "quick", "ordering": "per-key"}
    return Relay(engine, {"crm": table}, clock, QUICK, lease=60 * SECOND, line_drain=line_drain)


async def store_lines(engine: AsyncEngine, clock: Clock, keys: list[str], length: int) -> None:
    """``length`` callbacks of each key, interleaved, a millisecond apart (their arrival order)."""
    sources = {"default": SourceConfig(token=TOKEN)}
    async with running_client(engine, sources, clock=clock) as client:
        for step in range(length):
            for key in keys:
                path, body = dlr(key, f"STEP{step}")
                assert (await client.post(f"{path}?token={TOKEN}", json=body)).status_code == 200
                clock.advance(timedelta(milliseconds=1))


def steps(sink: Sink, key: str) -> list[int]:
    return [int(status[4:]) for request_id, status in seen(sink) if request_id == key]


async def test_a_line_drains_in_one_call_in_order_beside_another_key(
    engine: AsyncEngine, clock: Clock, sink: Sink
) -> None:
    await store_lines(engine, clock, ["m1", "m2"], LINE)
    relay = relay_to(engine, sink, clock)
    try:
        due = await relay.route_all()
        assert await relay.deliverer.attempt_many([d.id for d in due]) == []
    finally:
        await relay.aclose()
    assert steps(sink, "m1") == steps(sink, "m2") == list(range(LINE))
    assert await outbox.delivery_counts(engine) == {SUCCEEDED: 2 * LINE}


async def test_a_failing_delivery_stops_the_drain_and_waits_for_its_retry(
    engine: AsyncEngine, clock: Clock, sink: Sink
) -> None:
    await store_lines(engine, clock, ["m1"], LINE)
    sink.script["/hook"] = [Answer(200)] * 3 + [Answer(503)]
    relay = relay_to(engine, sink, clock)
    try:
        due = await relay.route_all()
        [retry] = await relay.deliverer.attempt_many([due[0].id])
        assert steps(sink, "m1") == [0, 1, 2, 3]  # the fourth failed; none went after it
        assert (retry.id, retry.attempts, retry.at) == (due[3].id, 1, clock() + 10 * SECOND)
        assert await outbox.due_deliveries(engine, clock(), 100) == []  # the line waits
        clock.to(retry.at)
        assert await relay.deliverer.attempt_many([retry.id]) == []  # then drains to the end
    finally:
        await relay.aclose()
    assert steps(sink, "m1") == [0, 1, 2, 3, *range(3, LINE)]
    assert await outbox.delivery_counts(engine) == {SUCCEEDED: LINE}


async def test_a_line_longer_than_the_bound_hands_the_rest_back_as_a_job(
    engine: AsyncEngine, clock: Clock, sink: Sink
) -> None:
    await store_lines(engine, clock, ["m1"], LINE)
    relay = relay_to(engine, sink, clock, line_drain=4)
    try:
        due = await relay.route_all()
        [rest] = await relay.deliverer.attempt_many([due[0].id])
        assert steps(sink, "m1") == [0, 1, 2, 3, 4]  # the first and four more
        # the next one's job, due when it was (ahead of newer jobs), not claimed meanwhile
        assert (rest.id, rest.attempts, rest.at) == (due[5].id, 0, due[5].at)
        assert [d.id for d in await outbox.due_deliveries(engine, clock(), 100)] == [rest.id]
        assert await relay.deliverer.attempt_many([rest.id]) == [
            outbox.Due(due[10].id, 0, due[10].at)
        ]
    finally:
        await relay.aclose()
    assert steps(sink, "m1") == list(range(10))


class ClockedSink(Sink):
    """A sink whose every request takes ``step`` of the injected clock."""

    def __init__(self, clock: Clock, step: timedelta) -> None:
        super().__init__()
        self.clock, self.step = clock, step

    async def _endpoint(self, request: Request) -> Response:
        self.clock.advance(self.step)
        return await super()._endpoint(request)


async def test_the_drain_stops_where_the_job_could_outlive_its_lease(
    engine: AsyncEngine, clock: Clock
) -> None:
    """The lease is 60 s and the destination's timeout 5 s: the job starts no attempt later
    than half the 55 s margin after it began. Each attempt takes 10 s here."""
    async with serving(ClockedSink(clock, 10 * SECOND)) as sink:
        await store_lines(engine, clock, ["m1"], LINE)
        relay = relay_to(engine, sink, clock)
        try:
            due = await relay.route_all()
            [rest] = await relay.deliverer.attempt_many([due[0].id])
        finally:
            await relay.aclose()
        assert steps(sink, "m1") == [0, 1, 2]  # begun at 0, 10 and 20 s; at 30 s the window shut
        assert (rest.id, rest.attempts) == (due[3].id, 0)
        rows = {r["id"]: r for r in await inspect.list_deliveries(engine, limit=100)}
        assert rows[rest.id]["status"] == PENDING and rows[rest.id]["attempts"] == 0
        assert await outbox.delivery_counts(engine) == {SUCCEEDED: 3, PENDING: LINE - 3}
