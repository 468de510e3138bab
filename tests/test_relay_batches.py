"""Batched work in the relay: routing batch jobs, grouped claims and records, start windows."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from arq import func
from arq.connections import ArqRedis
from arq.worker import Worker
from redis.asyncio import Redis
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import Coalescer
from relay import outbox
from relay.delivery.deliverer import Slot, Slots
from relay.destinations.http import new_http_client
from relay.destinations.shards import ShardedTransport
from relay.dispatch.jobs import QUEUE_NAME, JobQueue, deliver_job_id
from relay.dispatch.worker import RelayWorker, not_this_job
from relay.outbox import DELIVERIES, JOB_BATCH, AttemptRecord, AttemptResult, Due
from relay.outbox.tables import SUCCEEDED
from relay.simulator import factories
from relay.store import inspect
from tests.relay_support import START, Clock, Relay, fake_arq_pool, store_events
from tests.support import Answer, Sink

EVENTS = JOB_BATCH + 5


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def relay(engine: AsyncEngine, clock: Clock, sink: Sink) -> AsyncIterator[Relay]:
    made = Relay(engine, {"crm": {"type": "http", "url": sink.url()}}, clock)
    yield made
    await made.aclose()


async def routed(engine: AsyncEngine, relay: Relay, clock: Clock, count: int) -> list[outbox.Due]:
    await store_events(
        engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(count)], clock
    )
    return await relay.route_all()


@pytest.mark.slow
async def test_first_attempts_share_batch_jobs_on_real_redis(
    engine: AsyncEngine, clock: Clock, relay: Relay, redis: Redis
) -> None:
    due = await routed(engine, relay, clock, EVENTS)
    batches: dict[str | None, list[str]] = {}
    for item in due:
        batches.setdefault(item.job, []).append(item.id)
    assert None not in batches
    assert sorted(len(ids) for ids in batches.values()) == [EVENTS - JOB_BATCH, JOB_BATCH]

    queue = JobQueue(ArqRedis(connection_pool=redis.connection_pool))
    assert await queue.enqueue(due) == 2  # one arq job per batch
    assert await queue.enqueue(due) == 0  # the same batch jobs again: refused
    jobs = await queue.pool.queued_jobs(queue_name=QUEUE_NAME)
    assert {job.job_id: job.args[0] for job in jobs} == batches
    assert await queue.without_jobs(due) == []

    gone, kept = list(batches)  # one batch job is lost (a flushed Redis)
    await redis.zrem(QUEUE_NAME, gone)
    orphans = await queue.without_jobs(due)
    assert [o.id for o in orphans] == batches[gone]
    assert all(o.job is None for o in orphans)  # re-enqueued one by one
    assert await queue.enqueue(orphans) == len(orphans)
    assert await queue.without_jobs(due) == []
    swept = await outbox.due_deliveries(engine, clock(), 1000)
    assert {d.job for d in swept} == {gone, kept}  # the rows remember their batch job


@pytest.mark.slow
async def test_concurrent_attempts_share_claim_and_record_transactions(
    engine: AsyncEngine,
    clock: Clock,
    relay: Relay,
    sink: Sink,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: dict[str, list[int]] = {"claim": [], "record": []}
    claim_on, record_on = outbox.claim_on, outbox.record_on

    async def counted_claim(conn: Any, ids: Any, *args: Any) -> Any:
        calls["claim"].append(len(ids))
        return await claim_on(conn, ids, *args)

    async def counted_record(conn: Any, records: Any) -> Any:
        calls["record"].append(len(records))
        return await record_on(conn, records)

    monkeypatch.setattr(outbox, "claim_on", counted_claim)
    monkeypatch.setattr(outbox, "record_on", counted_record)
    due = await routed(engine, relay, clock, EVENTS)

    assert await relay.deliverer.attempt_many([d.id for d in due]) == []
    assert sum(calls["claim"]) == sum(calls["record"]) == EVENTS
    assert len(calls["claim"]) <= 3  # the first alone, then all that waited behind it
    assert len(calls["record"]) < EVENTS  # answers come back spread out, yet records group
    assert sorted(r.headers["webhook-id"] for r in sink.requests) == sorted(
        row["event_id"] for row in await inspect.list_deliveries(engine, limit=100)
    )
    rows = await inspect.list_deliveries(engine, limit=100)
    assert all(r["status"] == SUCCEEDED and r["attempts"] == 1 for r in rows)


@pytest.mark.slow
async def test_attempts_without_a_slot_in_time_come_back_as_jobs_of_their_own(
    engine: AsyncEngine, clock: Clock, sink: Sink
) -> None:
    # lease 1.4 s = timeout 1 s + 0.4 s margin: a batch job starts its attempts within 0.2 s
    relay = Relay(
        engine,
        {"crm": {"type": "http", "url": sink.url(), "timeout": "1s"}},
        clock,
        lease=timedelta(seconds=1.4),
        concurrency=1,
    )
    try:
        sink.answers["/hook"] = Answer(200, delay=0.5)
        due = await routed(engine, relay, clock, 3)
        later = await relay.deliverer.attempt_many([d.id for d in due])
        assert len(sink.requests) == 1  # the only slot was busy past the window
        assert sorted(d.id for d in later) == sorted(d.id for d in due[1:])
        due_at = {d.id: d.at for d in due}
        assert all(d.job is None and d.at == due_at[d.id] for d in later)  # their place in line
        assert len({deliver_job_id(d) for d in later}) == 2
        rounds = 0
        while later:  # each job makes progress: at least one attempt gets the slot
            later = await relay.deliverer.attempt_many([d.id for d in later])
            rounds += 1
        assert rounds == 2 and len(sink.requests) == 3
    finally:
        await relay.aclose()


async def test_a_slot_is_free_once_the_answer_is_in_while_its_record_waits(
    engine: AsyncEngine, clock: Clock, sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = Relay(engine, {"crm": {"type": "http", "url": sink.url()}}, clock, concurrency=1)
    records_may_go = asyncio.Event()
    record_on = outbox.record_on

    async def held_record(conn: Any, records: Any) -> Any:
        await records_may_go.wait()
        return await record_on(conn, records)

    monkeypatch.setattr(outbox, "record_on", held_record)
    try:
        due = await routed(engine, relay, clock, 2)
        attempts = asyncio.create_task(relay.deliverer.attempt_many([d.id for d in due]))
        async with asyncio.timeout(10):
            while len(sink.requests) < 2:
                await asyncio.sleep(0.01)
        # one slot, two sends, not one record written yet: the slot went from answer to send
        assert not attempts.done()
        rows = await inspect.list_deliveries(engine, limit=10)
        assert [r["attempts"] for r in rows] == [0, 0]
        records_may_go.set()
        assert await attempts == []
        rows = await inspect.list_deliveries(engine, limit=10)
        assert [(r["status"], r["attempts"]) for r in rows] == [(SUCCEEDED, 1)] * 2
    finally:
        records_may_go.set()
        await relay.aclose()


async def _settle() -> None:
    for _ in range(5):  # enough turns of the loop for the woken waiters to run
        await asyncio.sleep(0)


async def _blocked(take: asyncio.Task[Slot]) -> bool:
    await _settle()  # a free slot is taken within these turns; one still held never is
    return not take.done()


async def test_slots_bound_the_sends_and_the_attempts_not_yet_recorded() -> None:
    slots = Slots(2)
    first, second = await slots.take(), await slots.take()
    third = asyncio.create_task(slots.take())
    assert await _blocked(third)  # two sends at once
    first.answered()
    second.answered()
    second.answered()  # once, however often
    fourth = asyncio.create_task(slots.take())
    await _settle()
    assert third.done() and fourth.done()
    fifth = asyncio.create_task(slots.take())
    assert await _blocked(fifth)  # four unrecorded: two answered, two sending
    (await third).answered()
    (await fourth).answered()
    assert await _blocked(fifth)  # no send in flight, but still four unrecorded
    first.free()
    first.free()  # once, however often
    await _settle()
    assert fifth.done()
    for slot in (second, await third, await fourth, await fifth):
        slot.free()
    assert slots.free_now()


@pytest.mark.slow
async def test_a_lost_lease_fails_only_its_own_record(
    engine: AsyncEngine, clock: Clock, relay: Relay
) -> None:
    due = await routed(engine, relay, clock, 2)
    claims = await outbox.claim_many(engine, [d.id for d in due], clock(), timedelta(minutes=1))
    first, second = (claims[d.id] for d in due)
    async with engine.begin() as conn:  # another worker took the second over
        await conn.execute(
            update(DELIVERIES).where(DELIVERIES.c.id == second.delivery.id).values(lease_token="x")
        )
    result = AttemptResult(clock(), 12.0, 200, None, "ok")
    records = [AttemptRecord(c, result, SUCCEEDED, None) for c in (first, second)]
    assert await outbox.record_attempts(engine, records) == [True, False]
    shown = {d["id"]: d for d in await inspect.list_deliveries(engine, limit=10)}
    assert shown[first.delivery.id]["status"] == SUCCEEDED
    assert shown[second.delivery.id]["attempts"] == 0


async def test_coalescer_groups_calls_made_while_a_group_runs() -> None:
    groups: list[list[int]] = []

    async def run(items: list[int]) -> list[int | BaseException]:
        groups.append(items)
        await asyncio.sleep(0.01)
        return [ValueError(i) if i == 3 else i * 10 for i in items]

    coalescer: Coalescer[int, int] = Coalescer(run)
    first = coalescer.put(0)
    await asyncio.sleep(0)  # its group starts, with it alone
    rest = [coalescer.put(i) for i in range(1, 6)]
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert groups == [[0], [1, 2, 3, 4, 5]]
    assert results[:3] == [0, 10, 20] and results[4:] == [40, 50]
    assert isinstance(results[3], ValueError)


async def test_coalescer_fails_every_caller_of_a_failed_group() -> None:
    async def run(items: list[int]) -> list[int | BaseException]:
        raise ConnectionError("database gone")

    coalescer: Coalescer[int, int] = Coalescer(run)
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert await asyncio.gather(coalescer.submit(1), return_exceptions=True)  # still usable


async def test_sharded_pools_keep_the_overall_limits_and_reuse_connections(sink: Sink) -> None:
    transport = ShardedTransport(httpx.Limits(max_connections=16, max_keepalive_connections=16))
    assert transport.shards == 2  # at most 8 connections each
    sink.answers["/hook"] = Answer(200, delay=0.1)
    async with httpx.AsyncClient(transport=transport) as client:
        first = await asyncio.gather(*(client.post(sink.url(), content=b"{}") for _ in range(24)))
        peers = {r.peer for r in sink.requests}
        assert len(peers) == 16  # 24 at once, never more than the overall limit
        second = await asyncio.gather(*(client.post(sink.url(), content=b"{}") for _ in range(16)))
    assert [a.status_code for a in first + second] == [200] * 40
    assert {r.peer for r in sink.requests} == peers  # kept alive and used again


def test_sharded_pools_load_the_ca_store_once_and_verify_certificates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[ssl.SSLContext] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(context: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loaded.append(context)
        load(context, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    transport = ShardedTransport(httpx.Limits(max_connections=200))
    assert transport.shards == 25
    assert len(loaded) == 1  # not once per pool
    context = loaded[0]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


async def test_a_worker_does_not_ask_redis_again_about_the_jobs_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[bytes]] = []

    async def start_jobs(self: Worker, job_ids: list[bytes]) -> None:
        asked.append(job_ids)

    async def deliver(ctx: dict[str, Any], delivery_id: str) -> None:
        return None

    monkeypatch.setattr(Worker, "start_jobs", start_jobs)
    pool = fake_arq_pool()
    worker = RelayWorker(
        functions=[func(deliver, name="deliver")], redis_pool=pool, handle_signals=False
    )
    running = asyncio.get_running_loop().create_future()
    worker.tasks["relay:deliver-batch:a"] = running  # type: ignore[assignment]
    await worker.start_jobs([b"relay:deliver-batch:a", b"relay:deliver-batch:b"])
    assert asked == [[b"relay:deliver-batch:b"]]
    worker.tasks.pop("relay:deliver-batch:a")
    running.cancel()
    await worker.close()
    await pool.aclose()


def test_a_single_job_handing_its_delivery_back_does_not_reuse_its_own_id() -> None:
    own = Due("d1", 2, START)
    other = Due("d2", 0, START)
    moved, kept = not_this_job([own, other], deliver_job_id(own))
    assert kept == other
    assert moved.id == "d1" and moved.at == START + timedelta(microseconds=1)
    assert deliver_job_id(moved) != deliver_job_id(own)


async def test_the_relay_client_keeps_and_sends_no_cookies(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(200, headers={"set-cookie": "session=abc; Path=/"})
    async with new_http_client() as client:
        first = await client.post(sink.url(), content=b"{}")
        second = await client.post(sink.url(), content=b"{}")
        assert first.headers["set-cookie"] == "session=abc; Path=/"  # it was offered
        assert second.status_code == 200 and len(client.cookies) == 0
        with pytest.raises(TypeError):
            client.cookies = {"a": "b"}  # type: ignore[assignment]
    assert all("cookie" not in request.headers for request in sink.requests)
