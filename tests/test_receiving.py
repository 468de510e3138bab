"""Every kind, POST and GET, lands in the store with its raw body, payload and dedup key."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import SourceConfig
from receivers.store import queries
from relay.simulator import factories
from tests.conftest import TOKEN, ClientFactory

CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("/hooks/sms/inbound", "sms.inbound", factories.sms_inbound(), "requestId"),
    ("/hooks/sms/inbound", "sms.inbound", factories.sms_inbound(parts=3), "requestId"),
    (
        "/hooks/sms/inbound",
        "sms.inbound",
        factories.sms_inbound(parts=3, missing_part=True),
        "requestId",
    ),
    ("/hooks/sms/dlr", "sms.dlr", factories.sms_dlr(status="BUFFERED"), "requestId"),
    ("/hooks/sms/dlr", "sms.dlr", factories.sms_dlr(status="UNDELIVERABLE", parts=2), "requestId"),
    ("/hooks/numinfo/gnp", "numinfo.gnp", factories.numinfo_gnp(), "requestId"),
    ("/hooks/numinfo/gnv", "numinfo.gnv", factories.numinfo_gnv(), "requestId"),
    ("/hooks/conversations", "conversations.status", factories.conversations_status(), "messageId"),
    (
        "/hooks/conversations",
        "conversations.status",
        factories.conversations_status(event="MessageStatus::channelFailed"),
        "messageId",
    ),
    (
        "/hooks/chat-api",
        "conversations.status",
        factories.conversations_status(v2=True),
        "messageId",
    ),
    (
        "/hooks/conversations",
        "conversations.inbound",
        factories.conversations_inbound(),
        "messageId",
    ),
    (
        "/hooks/conversations",
        "conversations.inbound",
        factories.conversations_inbound(kind="media"),
        "messageId",
    ),
    (
        "/hooks/conversations",
        "conversations.inbound",
        factories.conversations_inbound(kind="postback"),
        "messageId",
    ),
    (
        "/hooks/chat-api",
        "conversations.inbound",
        factories.conversations_inbound(kind="order"),
        "messageId",
    ),
    (
        "/hooks/conversations",
        "conversations.inbound",
        factories.conversations_inbound(kind="sms", channel="sms"),
        "messageId",
    ),
    ("/hooks/conversations", "conversations.event", factories.conversations_event(), None),
    ("/hooks/tts/events", "tts.event", factories.tts_event(), "callId"),
    ("/hooks/tts/events", "tts.event", factories.tts_event(status="ringing"), "callId"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "kind", "payload", "id_field"), CASES)
async def test_every_kind_is_stored_byte_for_byte(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    path: str,
    kind: str,
    payload: dict[str, Any],
    id_field: str | None,
) -> None:
    raw = json.dumps(payload, indent=1).encode()  # whitespace the parser would not keep
    answer = await client.post(
        f"{path}?token={TOKEN}", content=raw, headers={"content-type": "application/json"}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["kind"] == kind
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None
    assert stored.kind == kind and stored.source == "default"
    assert stored.raw_body == raw
    assert stored.content_type == "application/json"
    assert stored.method == "POST"
    assert_same_fields(stored.payload, payload)
    assert stored.duplicates == 0
    if id_field is not None:
        assert payload[id_field] in stored.dedup_key
    else:
        assert stored.dedup_key.startswith("sha256:")


def assert_same_fields(stored: Any, sent: Any) -> None:
    """Every field sent is stored; numbers sent for text fields are kept as their text."""
    if isinstance(sent, dict):
        assert set(stored) == set(sent)
        for key, value in sent.items():
            assert_same_fields(stored[key], value)
    elif isinstance(sent, list):
        assert len(stored) == len(sent)
        for stored_item, sent_item in zip(stored, sent, strict=True):
            assert_same_fields(stored_item, sent_item)
    elif isinstance(stored, str) and not isinstance(sent, str):
        assert stored == str(sent)
    else:
        assert stored == sent


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "kind", "payload"),
    [
        ("/hooks/sms/inbound", "sms.inbound", factories.sms_inbound()),
        ("/hooks/sms/dlr", "sms.dlr", factories.sms_dlr()),
    ],
)
async def test_get_variant_stores_query_parameters(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    path: str,
    kind: str,
    payload: dict[str, Any],
) -> None:
    flat = {k: v for k, v in payload.items() if not isinstance(v, list | dict)}
    query = urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in flat.items()})
    answer = await client.get(f"{path}?token={TOKEN}&{query}")

    assert answer.status_code == 200, answer.text
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None and stored.kind == kind and stored.method == "GET"
    assert stored.raw_body == query.encode()  # the query string as sent, less the token
    assert b"token" not in stored.raw_body
    assert stored.payload["requestId"] == payload["requestId"]
    assert stored.dedup_key.startswith(payload["requestId"])


async def test_get_inbound_with_content_list_as_json(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    payload = factories.sms_inbound(parts=2)
    query = {k: v for k, v in payload.items() if not isinstance(v, list | bool)}
    query["contentList"] = json.dumps(payload["contentList"])
    answer = await client.get("/hooks/sms/inbound", params={"token": TOKEN, **query})

    assert answer.status_code == 200, answer.text
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None
    assert [p["msgId"] for p in stored.payload["contentList"]] == [
        p["msgId"] for p in payload["contentList"]
    ]


async def test_tolerant_variants_are_accepted_and_unknown_fields_kept(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    gnp = factories.numinfo_gnp()
    gnp["ttId"] = str(gnp.pop("ttid"))
    gnp["timeZone"] = gnp.pop("timezone")
    gnp["requestId"] = 424242
    gnp["price"] = "0.01"
    gnp["brandNewField"] = {"nested": [1, 2]}
    answer = await client.post(f"/hooks/numinfo/gnp?token={TOKEN}", json=gnp)

    assert answer.status_code == 200, answer.text
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None
    assert stored.payload["ttid"] == gnp["ttId"]  # a string in the platform's schema
    assert stored.payload["timezone"] == gnp["timeZone"]
    assert stored.payload["requestId"] == "424242"
    assert stored.payload["price"] == 0.01
    assert stored.payload["brandNewField"] == {"nested": [1, 2]}
    assert stored.dedup_key == "424242"


async def test_nan_and_infinity_are_null_in_the_stored_payload_of_unknown_fields(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    # JSON has no NaN or Infinity, but json.dumps writes them; the payload column holds
    # standard JSON on every backend (PostgreSQL refuses those tokens), the raw body keeps them.
    text = json.dumps(factories.numinfo_gnp())
    raw = (text[:-1] + ', "score": NaN, "band": [-Infinity, 1.5, 1e400]}').encode()
    answer = await client.post(
        f"/hooks/numinfo/gnp?token={TOKEN}",
        content=raw,
        headers={"content-type": "application/json"},
    )

    assert answer.status_code == 200, answer.text
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None
    assert stored.raw_body == raw
    assert (stored.payload["score"], stored.payload["band"]) == (None, [None, 1.5, None])


async def test_overlong_content_type_and_forwarded_address_are_cut_to_their_columns(
    make_client: ClientFactory, engine: AsyncEngine
) -> None:
    # PostgreSQL refuses text wider than its column: uncut, such a callback would get 503 on
    # every retry there (SQLite keeps any length, so the same width is kept on both).
    content_type = "application/json; charset=utf-8; note=" + "x" * 300
    zoned = "fe80::1%" + "z" * 100  # an IPv6 address with a zone id, behind a trusted proxy
    headers = {"content-type": content_type, "x-forwarded-for": zoned}
    async with make_client(client_ip="10.0.0.2", trusted_proxies=("10.0.0.0/8",)) as client:
        accepted = await client.post(
            f"/hooks/sms/inbound?token={TOKEN}",
            content=json.dumps(factories.sms_inbound()).encode(),
            headers=headers,
        )
        refused = await client.post(
            f"/hooks/sms/inbound?token={TOKEN}", content=b"not json", headers=headers
        )

    assert (accepted.status_code, refused.status_code) == (200, 400), accepted.text
    stored = await queries.get_event(engine, accepted.json()["id"])
    [rejected] = await queries.list_rejected(engine)
    for row in (stored, rejected):
        assert row is not None
        assert row.content_type == content_type[:255]  # the columns' widths
        assert row.remote_addr == zoned[:64]


@pytest.mark.slow
@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e400", '"inf"', '"nan"'])
async def test_a_number_field_refuses_nan_and_infinity(
    client: httpx.AsyncClient, engine: AsyncEngine, value: str
) -> None:
    text = json.dumps(factories.numinfo_gnp())
    raw = (text[:-1] + f', "price": {value}}}').encode()
    answer = await client.post(
        f"/hooks/numinfo/gnp?token={TOKEN}",
        content=raw,
        headers={"content-type": "application/json"},
    )

    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == ["price"]
    rejected = await queries.list_rejected(engine)
    assert [r.raw_body for r in rejected] == [raw]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ("MoMessage::PostBack", "conversations.inbound"),
        ("momessage::postback", "conversations.inbound"),
        ("MessageStatus::Seen", "conversations.status"),
        ("WhatsAppGroupEvent::created", "conversations.event"),
        ("CallStatus::Ringing", "conversations.event"),
    ],
)
async def test_conversations_dispatch_on_event_ignores_case_and_stores_as_received(
    client: httpx.AsyncClient, engine: AsyncEngine, event: str, kind: str
) -> None:
    body = factories.conversations_status()
    body["event"] = event
    answer = await client.post(f"/hooks/conversations?token={TOKEN}", json=body)

    assert answer.status_code == 200, answer.text
    assert answer.json()["kind"] == kind
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None and stored.payload["event"] == event


async def test_v2_and_v3_copies_of_one_event_are_one_event(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = factories.conversations_status(event="MessageStatus::delivered")
    first = await client.post(f"/hooks/conversations?token={TOKEN}", json=body)
    body["event"] = "MessageStatus::Delivered"
    second = await client.post(f"/hooks/chat-api?token={TOKEN}", json=body)

    assert first.json() == second.json()
    assert await queries.count_events(engine) == 1


async def test_named_sources_are_served_under_their_prefix(
    make_client: ClientFactory, engine: AsyncEngine
) -> None:
    sources = {
        "default": SourceConfig(token="a-token-0123456789"),
        "eu": SourceConfig(token="eu-token-0123456789"),
    }
    async with make_client(sources) as client:
        named = await client.post(
            "/hooks/eu/sms/dlr?token=eu-token-0123456789", json=factories.sms_dlr()
        )
        wrong_token = await client.post(
            "/hooks/eu/sms/dlr?token=a-token-0123456789", json=factories.sms_dlr()
        )
        unknown = await client.post(
            "/hooks/us/sms/dlr?token=a-token-0123456789", json=factories.sms_dlr()
        )

    assert named.status_code == 200
    stored = await queries.get_event(engine, named.json()["id"])
    assert stored is not None and stored.source == "eu"
    assert wrong_token.status_code == 401
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}
