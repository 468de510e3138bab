"""The whole auth matrix: every mechanism alone and in every combination, at every receiver
URL, with every method. A request is stored only when every configured check verified it; a
check that cannot apply to a request (a signature on a GET) refuses it."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from freezegun import freeze_time
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import HeaderCheck, ReceiverConfig, SourceConfig, create_app
from receivers.auth import sign
from receivers.store import queries
from relay.simulator import factories

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
TOKEN = "matrix-token-0123456789"
BASIC = "platform:matrix-password-0123"
HEADER = ("X-Callback-Key", "matrix-header-0123456789")
SECRET = "matrix-hmac-secret-0123456789"
ALLOWED_IP, OTHER_IP = "203.0.113.7", "198.51.100.1"
MECHANISMS = ("token", "basic", "header", "signature", "allow_ips")
PAYLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    "/sms/inbound": factories.sms_inbound,
    "/sms/dlr": factories.sms_dlr,
    "/numinfo/gnp": factories.numinfo_gnp,
    "/numinfo/gnv": factories.numinfo_gnv,
    "/conversations": factories.conversations_status,
    "/chat-api": factories.conversations_inbound,
    "/tts/events": factories.tts_event,
}
"""Every receiver path with a payload of a kind it takes."""
GET_PATHS = frozenset({"/sms/inbound", "/sms/dlr"})
METHODS = ("POST", "GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")


def source_config(mechanisms: tuple[str, ...]) -> SourceConfig:
    settings: dict[str, Any] = {}
    if "token" in mechanisms:
        settings["token"] = TOKEN
    if "basic" in mechanisms:
        settings["basic_auth"] = BASIC
    if "header" in mechanisms:
        settings["header"] = HeaderCheck(name=HEADER[0], value=HEADER[1])
    if "signature" in mechanisms:
        settings["signature_secret"] = SECRET
    if "allow_ips" in mechanisms:
        settings["allow_ips"] = ["203.0.113.0/24"]
    return SourceConfig(**settings)


COMBINATIONS = [
    combo
    for size in range(1, len(MECHANISMS) + 1)
    for combo in itertools.combinations(MECHANISMS, size)
]
SOURCES = {"m-" + "-".join(combo): source_config(combo) for combo in COMBINATIONS}


@dataclass(frozen=True)
class Call:
    """One request of the matrix and the answer it must get."""

    source: str
    path: str
    method: str
    sent: frozenset[str]
    """The mechanisms whose credentials the request carries."""


def request_parts(call: Call) -> tuple[dict[str, str], dict[str, str], bytes, str]:
    """Query, headers, body and caller address for a call, with the credentials it carries."""
    payload = PAYLOADS[call.path]()
    query: dict[str, str] = {}
    headers: dict[str, str] = {}
    body = b""
    if call.method == "GET":
        query.update({k: str(v) for k, v in payload.items() if not isinstance(v, list | dict)})
    elif call.method != "HEAD":
        body = json.dumps(payload).encode()
        headers["content-type"] = "application/json"
    if "token" in call.sent:
        query["token"] = TOKEN
    if "basic" in call.sent:
        headers["authorization"] = "Basic " + base64.b64encode(BASIC.encode()).decode()
    if "header" in call.sent:
        headers[HEADER[0]] = HEADER[1]
    if "signature" in call.sent:
        stamp = str(int(NOW.timestamp()))  # the best a caller can do: sign what it sends
        headers.update({"x-request-timestamp": stamp, "x-signature": sign(SECRET, stamp, body)})
    address = ALLOWED_IP if "allow_ips" in call.sent else OTHER_IP
    return query, headers, body, address


def expected(call: Call, configured: tuple[str, ...]) -> int:
    allowed_methods = {"POST", "GET"} if call.path in GET_PATHS else {"POST"}
    if call.method not in allowed_methods:
        return 405
    if "allow_ips" in configured and "allow_ips" not in call.sent:
        return 403
    if "signature" in configured and call.method != "POST":
        return 401  # nothing in a GET can be verified against the signature secret
    if not set(configured) <= call.sent:
        return 401
    return 200


def matrix() -> list[tuple[Call, int]]:
    calls: list[tuple[Call, int]] = []
    for combo in COMBINATIONS:
        source = "m-" + "-".join(combo)
        for path in PAYLOADS:
            for method in METHODS:
                # all credentials, none, and each configured one left out
                variants = [frozenset(MECHANISMS), frozenset()]
                variants += [frozenset(MECHANISMS) - {left_out} for left_out in combo]
                if method not in ("POST", "GET"):
                    variants = variants[:1]
                for sent in variants:
                    call = Call(source, path, method, sent)
                    calls.append((call, expected(call, combo)))
    return calls


@pytest.fixture
async def clients(sqlite_engine: AsyncEngine) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """One receiver of every combination, seen from an allowed and a not-allowed address."""
    app = create_app(ReceiverConfig(sources=SOURCES), sqlite_engine, clock=lambda: NOW)
    async with app.router.lifespan_context(app):
        by_address = {}
        for address in (ALLOWED_IP, OTHER_IP):
            transport = httpx.ASGITransport(app=app, client=(address, 40000))
            by_address[address] = httpx.AsyncClient(transport=transport, base_url="http://t")
        try:
            yield by_address
        finally:
            for client in by_address.values():
                await client.aclose()


@pytest.mark.slow
async def test_every_mechanism_and_combination_at_every_url_and_method(
    clients: dict[str, httpx.AsyncClient], sqlite_engine: AsyncEngine
) -> None:
    mismatches: list[str] = []
    accepted = 0
    with freeze_time(NOW):
        for call, status in matrix():
            query, headers, body, address = request_parts(call)
            url = f"/hooks/{call.source}{call.path}"
            answer = await clients[address].request(
                call.method, url, params=query, headers=headers, content=body or None
            )
            if answer.status_code != status:
                mismatches.append(f"{call} -> {answer.status_code}, expected {status}")
            elif status != 200 and call.method != "HEAD":
                assert answer.headers["content-type"] == "application/problem+json"
            accepted += status == 200
    assert mismatches == [], f"{len(mismatches)} mismatches, e.g. {mismatches[:5]}"
    assert len(await queries.list_events(sqlite_engine, limit=100_000)) == accepted
    assert await queries.list_rejected(sqlite_engine) == []  # refusals are never quarantined


async def test_unsigned_get_on_a_signature_only_source_is_refused(
    clients: dict[str, httpx.AsyncClient], sqlite_engine: AsyncEngine
) -> None:
    """The reported bypass: a forged inbound SMS by GET, without any signature."""
    answer = await clients[OTHER_IP].get(
        "/hooks/m-signature/sms/inbound",
        params={"from": "+1", "to": "+2", "message": "FORGED", "requestId": "f1"},
    )
    assert answer.status_code == 401
    assert answer.json()["type"] == "urn:callback-relay:problem:unsigned-method"
    assert await queries.list_events(sqlite_engine) == []
