"""The direct lane to the receiver URLs answers exactly as Starlette's routing does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from receivers import ReceiverConfig, SourceConfig, create_app
from relay.simulator import factories
from tests.conftest import TOKEN

INBOUND = factories.sms_inbound()
BODY = json.dumps(INBOUND).encode()
QUERY = {k: v for k, v in INBOUND.items() if not isinstance(v, list | bool)}
REQUESTS: list[tuple[str, str, dict[str, str], bytes]] = [
    ("POST", "/hooks/sms/inbound", {"token": TOKEN}, BODY),
    ("POST", "/hooks/sms/inbound", {"token": TOKEN}, BODY),  # a duplicate
    ("GET", "/hooks/sms/inbound", {"token": TOKEN, **QUERY}, b""),
    ("POST", "/hooks/sms/dlr", {"token": TOKEN}, b"{not json"),
    ("POST", "/hooks/sms/dlr", {"token": TOKEN}, b'{"status": "DELIVERED"}'),
    ("POST", "/hooks/sms/dlr", {"token": TOKEN}, b"[1, 2]"),
    ("POST", "/hooks/sms/dlr", {"token": "wrong"}, BODY),
    ("POST", "/hooks/numinfo/gnp", {"token": TOKEN}, b"x" * 2000),
    ("POST", "/hooks/numinfo/gnp/", {"token": TOKEN}, BODY),
    ("PUT", "/hooks/numinfo/gnp", {"token": TOKEN}, BODY),
    ("HEAD", "/hooks/sms/inbound", {"token": TOKEN}, b""),
    ("GET", "/hooks/tts/events", {"token": TOKEN}, b""),
]


class Passthrough:
    """A middleware that changes nothing (its presence sends requests Starlette's way)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


@asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client,
    ):
        yield client


async def answers(app: Starlette) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    async with serving(app) as client:
        result = []
        for method, path, params, body in REQUESTS:
            answer = await client.request(method, path, params=params, content=body or None)
            result.append((answer.status_code, answer.headers.multi_items(), answer.content))
        return result


@pytest.mark.slow
async def test_both_lanes_give_the_same_answers(engine: AsyncEngine) -> None:
    config = ReceiverConfig(sources={"default": SourceConfig(token=TOKEN)}, max_body_bytes=1000)
    direct = await answers(create_app(config, engine))
    routed_app = create_app(config, engine)
    routed_app.add_middleware(Passthrough)
    routed = await answers(routed_app)
    statuses = [status for status, _, _ in direct]
    # a trailing slash is served (the platform follows no redirect); HEAD is not a callback
    assert statuses == [200, 200, 200, 400, 422, 422, 401, 413, 200, 405, 405, 405]
    assert direct == routed  # same store: the events are duplicates, answered with the same ids


async def test_an_unexpected_error_is_a_logged_500_problem(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_clock() -> datetime:
        raise RuntimeError("no time")

    sources = {"default": SourceConfig(signature_secret="s-0123456789abcdef")}
    app = create_app(ReceiverConfig(sources=sources), engine, clock=broken_clock)
    async with serving(app) as client:
        answer = await client.post("/hooks/sms/inbound", content=BODY)
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"] == "urn:callback-relay:problem:internal-error"
    assert "unexpected error on POST /hooks/sms/inbound" in caplog.text


async def test_an_unknown_path_is_a_404_problem_never_a_redirect(engine: AsyncEngine) -> None:
    """Starlette would answer a doubled slash with a 307 whose Location comes from the
    caller's Host header; the platform follows no redirect."""
    config = ReceiverConfig(sources={"default": SourceConfig(token=TOKEN)})
    async with serving(create_app(config, engine)) as client:
        for path in ("/hooks/sms/inbound//", "/healthz/", "/metrics/", "/hooks//sms/inbound"):
            answer = await client.post(
                path, params={"token": TOKEN}, content=BODY, headers={"host": "evil.example"}
            )
            assert answer.status_code in (404, 405), path
            assert "location" not in answer.headers
            assert answer.headers["content-type"] == "application/problem+json"
