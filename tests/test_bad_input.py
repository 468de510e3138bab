"""Every row of the bad-input table: a clear problem+json answer, quarantine, never a 500."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import SourceConfig
from receivers.store import queries
from receivers.store.engine import create_engine
from relay.simulator import factories
from tests.conftest import TOKEN, ClientFactory, running_client

PROBLEM = "application/problem+json"


def assert_problem(answer: httpx.Response, status: int) -> dict[str, object]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    document = answer.json()
    assert document["status"] == status
    assert document["type"].startswith("urn:callback-relay:problem:")
    assert document["title"] and document["detail"]
    return document


@pytest.mark.slow
async def test_unauthenticated_is_401_and_not_stored(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    assert_problem(await client.post("/hooks/sms/inbound", json=factories.sms_inbound()), 401)
    assert await queries.count_events(engine) == 0
    assert await queries.list_rejected(engine) == []
    registry = client.app.state.metrics.registry  # type: ignore[attr-defined]
    labels = {"source": "default", "reason": "bad-token"}
    assert registry.get_sample_value("relay_auth_failures_total", labels) == 1


@pytest.mark.slow
async def test_address_not_allowed_is_403(make_client: ClientFactory, engine: AsyncEngine) -> None:
    source = SourceConfig(token=TOKEN, allow_ips=["203.0.113.0/24"])
    async with make_client({"default": source}, client_ip="198.51.100.7") as client:
        answer = await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=factories.sms_dlr())
    assert_problem(answer, 403)
    assert await queries.count_events(engine) == 0


@pytest.mark.slow
async def test_body_over_the_limit_is_413(make_client: ClientFactory, engine: AsyncEngine) -> None:
    body = factories.sms_inbound({"message": "x" * 5000})
    async with make_client(max_body_bytes=2048) as client:
        declared = await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
            raw = json.dumps(body).encode()
            for start in range(0, len(raw), 512):
                yield raw[start : start + 512]

        streamed = await client.post(f"/hooks/sms/inbound?token={TOKEN}", content=chunks())
    assert_problem(declared, 413)
    assert_problem(streamed, 413)
    assert await queries.count_events(engine) == 0
    assert await queries.list_rejected(engine) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"this is not json", "not JSON"),
        (b"", "empty"),
        (b'{"from": "+4915112345678", "to": ', "not JSON"),
        (b'{"message": "\xff\xfe caf\xe9"}', "not UTF-8"),
        (b"[" * 100 + b"]" * 100, "nested deeper"),
        (b"[" * 5000 + b"]" * 5000, "more than 2048 objects and arrays"),
        (
            b'{"requestId": "r", "status": "DELIVERED", "parts": [' + b"{}," * 3000 + b"{}]}",
            "more than 2048 objects and arrays",
        ),
    ],
)
async def test_undecodable_body_is_400_and_quarantined_raw(
    client: httpx.AsyncClient, engine: AsyncEngine, raw: bytes, why: str
) -> None:
    answer = await client.post(f"/hooks/sms/inbound?token={TOKEN}", content=raw)

    document = assert_problem(answer, 400)
    assert why in str(document["detail"])
    [rejected] = await queries.list_rejected(engine)
    assert rejected.raw_body == raw and rejected.status == 400 and rejected.count == 1
    assert await queries.count_events(engine) == 0


@pytest.mark.slow
async def test_invalid_payload_is_422_naming_the_fields_and_quarantined_once(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.sms_inbound()
    del body["requestId"]
    body["contentList"][0]["sequenceNumber"] = "first"
    raw = json.dumps(body).encode()
    first = await client.post(f"/hooks/sms/inbound?token={TOKEN}", content=raw)
    second = await client.post(f"/hooks/sms/inbound?token={TOKEN}", content=raw)

    document = assert_problem(first, 422)
    fields = {error["field"] for error in document["errors"]}  # type: ignore[union-attr]
    assert fields == {"requestId", "contentList.0.sequenceNumber"}
    assert "requestId" in str(document["detail"])
    assert second.json() == document
    [rejected] = await queries.list_rejected(engine)
    assert rejected.raw_body == raw
    assert rejected.count == 2
    assert rejected.kind == "sms.inbound"
    assert {e["field"] for e in rejected.errors} == fields
    assert await queries.count_events(engine) == 0


@pytest.mark.slow
@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"42", b"null"])
async def test_json_that_is_not_an_object_is_422(
    client: httpx.AsyncClient, engine: AsyncEngine, raw: bytes
) -> None:
    assert_problem(await client.post(f"/hooks/numinfo/gnp?token={TOKEN}", content=raw), 422)
    assert len(await queries.list_rejected(engine)) == 1


async def test_conversations_event_without_event_name_is_422(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.conversations_status()
    del body["event"]
    document = assert_problem(
        await client.post(f"/hooks/conversations?token={TOKEN}", json=body), 422
    )
    assert "event" in str(document["detail"])


async def test_unknown_path_and_method_are_problems(client: httpx.AsyncClient) -> None:
    assert_problem(await client.post(f"/hooks/sms/outbound?token={TOKEN}", json={}), 404)
    assert_problem(await client.get(f"/hooks/numinfo/gnp?token={TOKEN}"), 405)
    assert_problem(await client.delete(f"/hooks/sms/inbound?token={TOKEN}"), 405)


@pytest.mark.slow
async def test_duplicate_answer_is_200_like_the_first(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.sms_inbound()
    first = await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)
    again = await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)
    assert first.status_code == again.status_code == 200
    assert first.content == again.content


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_database_unavailable_is_503_with_retry_after(backend: str, tmp_path: Path) -> None:
    url = {
        "sqlite": f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'relay.db'}",
        "postgresql": "postgresql+asyncpg://postgres@127.0.0.1:1/test",
    }[backend]
    engine = create_engine(url)
    try:
        async with running_client(engine) as client:
            answers = [
                await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=factories.sms_inbound())
                for _ in range(2)
            ]
            bad = await client.post(f"/hooks/sms/inbound?token={TOKEN}", content=b"nope")
            ready = await client.get("/readyz")
    finally:
        await engine.dispose()
    for answer in [*answers, bad, ready]:
        assert_problem(answer, 503)
        assert answer.headers["retry-after"].isdigit()


HUGE_NUMBER = "9" * 5000  # beyond Python's 4300-digit limit on int <-> str conversions


@pytest.mark.slow
@pytest.mark.parametrize("where", ["known field", "unknown field", "nested"])
async def test_numbers_too_long_for_python_are_a_problem_not_a_500(
    client: httpx.AsyncClient, engine: AsyncEngine, where: str
) -> None:
    body = factories.sms_dlr()
    text = json.dumps(body)
    field = {"known field": '"status"', "unknown field": '"extra"', "nested": '"x"'}[where]
    value = HUGE_NUMBER if where != "nested" else '{"y": [' + HUGE_NUMBER + "]}"
    raw = ("{" + field + ": " + value + ", " + text[1:]).encode()
    answer = await client.post(f"/hooks/sms/dlr?token={TOKEN}", content=raw)
    document = assert_problem(answer, answer.status_code)
    assert answer.status_code in (400, 422), document
    [rejected] = await queries.list_rejected(engine)
    assert rejected.raw_body == raw
    assert await queries.count_events(engine) == 0


@pytest.mark.slow
async def test_a_get_callback_with_a_number_too_long_is_a_problem_not_a_500(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    payload = factories.sms_inbound()
    query = {k: v for k, v in payload.items() if not isinstance(v, list | bool)}
    query["contentList"] = "[" + HUGE_NUMBER + "]"
    answer = await client.get("/hooks/sms/inbound", params={"token": TOKEN, **query})
    assert answer.status_code < 500, answer.text
    assert await queries.count_events(engine) + len(await queries.list_rejected(engine)) == 1


async def test_a_number_too_large_for_a_float_is_stored_or_refused_never_a_5xx(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.sms_dlr()
    raw = ('{"extra": 1e999, ' + json.dumps(body)[1:]).encode()
    answer = await client.post(f"/hooks/sms/dlr?token={TOKEN}", content=raw)
    assert answer.status_code < 500, answer.text
    stored, rejected = await queries.count_events(engine), await queries.list_rejected(engine)
    assert (stored, len(rejected)) in ((1, 0), (0, 1))


BASE_QUERY = "from=%2B4915112345678&to=%2B4915730000001&message=hi&requestId=get-1"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "why"),
    [
        (BASE_QUERY.replace("message=hi", "message=%ff%fe"), "not UTF-8"),
        (BASE_QUERY.replace("message=hi", "message=%C3%28"), "not UTF-8"),
        (BASE_QUERY + "&from=%2B1", "'from' is given more than once"),
        (BASE_QUERY + "&requestId=get-2", "'requestId' is given more than once"),
    ],
)
async def test_a_get_callback_that_would_lose_data_is_400_and_quarantined(
    client: httpx.AsyncClient, engine: AsyncEngine, query: str, why: str
) -> None:
    """A query that is not UTF-8, or repeats a parameter, is refused like a POST body that is
    not UTF-8: silently replacing bytes or keeping one of two values would store a guess."""
    answer = await client.get(f"/hooks/sms/inbound?token={TOKEN}&{query}")
    document = assert_problem(answer, 400)
    assert why in str(document["detail"])
    assert await queries.count_events(engine) == 0
    assert len(await queries.list_rejected(engine)) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "first", "second"),
    [
        ("/hooks/conversations", '"messageId": 1e400', '"messageId": 7e999'),
        ("/hooks/tts/events", '"callId": 1e400', '"callId": 2e400'),
        ("/hooks/sms/dlr", '"requestId": 9007199254740993.0', '"requestId": 9007199254740992.0'),
        ("/hooks/sms/dlr", '"requestId": NaN', '"requestId": "nan"'),
    ],
)
async def test_distinct_callbacks_never_share_a_dedup_key(
    client: httpx.AsyncClient, engine: AsyncEngine, path: str, first: str, second: str
) -> None:
    """An id written as a fraction or past a float's range loses digits when decoded: such a
    key field does not fit (422), so two different callbacks are never merged into one."""
    template = {
        "/hooks/conversations": '{"event": "MoMessage", %s, "content": {"text": "%s"}}',
        "/hooks/tts/events": '{%s, "status": "completed", "to": "%s"}',
        "/hooks/sms/dlr": '{%s, "status": "DELIVERED", "reference": "%s"}',
    }[path]
    answers = [
        await client.post(f"{path}?token={TOKEN}", content=(template % (key, text)).encode())
        for key, text in ((first, "first"), (second, "second"))
    ]
    accepted = [answer.json()["id"] for answer in answers if answer.status_code == 200]
    assert len(set(accepted)) == len(accepted)  # no second callback answered as a duplicate
    assert answers[0].status_code == 422
    assert await queries.count_events(engine) == len(accepted)
