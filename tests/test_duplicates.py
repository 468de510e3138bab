"""The platform retries: a copy of a stored event is answered alike, counted, never stored twice."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import queries
from relay.simulator import factories
from tests.conftest import TOKEN


async def test_sequential_duplicate_gets_the_same_answer_and_is_counted(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.sms_inbound()
    answers = [await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body) for _ in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert answers[0].content == answers[1].content == answers[2].content
    events = await queries.list_events(engine)
    assert len(events) == 1
    assert events[0].duplicates == 2


@pytest.mark.slow
async def test_fifty_concurrent_copies_store_one_event(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.numinfo_gnv()
    answers = await asyncio.gather(
        *(client.post(f"/hooks/numinfo/gnv?token={TOKEN}", json=body) for _ in range(50))
    )

    assert {a.status_code for a in answers} == {200}
    assert len({a.content for a in answers}) == 1
    events = await queries.list_events(engine)
    assert len(events) == 1
    assert events[0].duplicates == 49


@pytest.mark.slow
async def test_duplicates_across_two_receivers_sharing_a_store(
    make_client: object, engine: AsyncEngine
) -> None:
    body = factories.conversations_status()
    async with make_client() as first, make_client() as second:  # type: ignore[operator]
        answers = await asyncio.gather(
            *(
                client.post(f"/hooks/conversations?token={TOKEN}", json=body)
                for client in [first, second] * 10
            )
        )

    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["id"] for a in answers}) == 1
    events = await queries.list_events(engine)
    assert len(events) == 1 and events[0].duplicates == 19


@pytest.mark.slow
async def test_two_hundred_concurrent_distinct_posts_are_all_stored_once(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    bodies = [factories.sms_dlr(status="DELIVERED") for _ in range(200)]
    answers = await asyncio.gather(
        *(client.post(f"/hooks/sms/dlr?token={TOKEN}", json=body) for body in bodies)
    )

    assert {a.status_code for a in answers} == {200}
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 200
    events = await queries.list_events(engine, limit=1000)
    assert {e.id for e in events} == ids
    assert sorted(e.payload["requestId"] for e in events) == sorted(b["requestId"] for b in bodies)
    assert all(e.duplicates == 0 for e in events)


async def test_dlr_status_is_part_of_the_key(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    buffered = factories.sms_dlr(status="BUFFERED")
    delivered = dict(buffered, status="DELIVERED")
    delivered_again = dict(buffered, status="delivered")
    for body in (buffered, delivered, delivered_again):
        assert (await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=body)).status_code == 200

    events = sorted(await queries.list_events(engine), key=lambda e: e.payload["status"])
    assert [e.payload["status"] for e in events] == ["BUFFERED", "DELIVERED"]
    assert [e.duplicates for e in events] == [0, 1]


async def test_kind_without_its_key_fields_falls_back_to_the_body_hash(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.tts_event()
    del body["callId"]
    first = await client.post(f"/hooks/tts/events?token={TOKEN}", json=body)
    again = await client.post(f"/hooks/tts/events?token={TOKEN}", json=body)
    other = await client.post(f"/hooks/tts/events?token={TOKEN}", json=dict(body, price="9.99"))

    assert first.json() == again.json() != other.json()
    events = await queries.list_events(engine)
    assert len(events) == 2
    assert all(e.dedup_key.startswith("sha256:") for e in events)
