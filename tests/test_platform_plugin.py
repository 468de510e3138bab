"""The `platform` fixture, used the way a customer uses it on their own webhook handler.

This module is the example of README's "Job 3: simulate the platform in tests"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def make_app() -> Starlette:
    """A customer's handler: opts a number out on STOP; can be told to fail a few times."""

    async def inbound(request: Request) -> Response:
        if request.query_params.get("token") != "t":
            return Response(status_code=401)
        request.app.state.seen.append(datetime.now(UTC))
        if request.app.state.failures_left > 0:
            request.app.state.failures_left -= 1
            return Response(status_code=503)
        message = await request.json()
        if message["message"].strip().upper() == "STOP":
            request.app.state.opted_out.add(message["from"])
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/hooks/sms/inbound", inbound, methods=["POST"])])
    app.state.seen = []
    app.state.opted_out = set()
    app.state.failures_left = 0
    return app


@pytest.fixture
def my_app() -> Starlette:
    return make_app()


def test_my_handler(platform, my_app):  # type: ignore[no-untyped-def]
    platform.target(my_app, token="t")
    result = platform.sms_inbound({"from": "+4915112345678"}, message="STOP")
    assert result.answers == [200]
    assert my_app.state.opted_out == {"+4915112345678"}


def test_wrong_token_is_retried_until_the_platform_gives_up(platform, my_app):  # type: ignore[no-untyped-def]
    platform.target(my_app, token="wrong")
    platform.retry = False
    result = platform.sms_inbound(message="hello")
    assert result.answers == [401]
    assert result.given_up


def test_retries_follow_the_documented_schedule(platform, my_app):  # type: ignore[no-untyped-def]
    my_app.state.failures_left = 2  # the app fails twice, then succeeds
    platform.target(my_app, token="t")
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    with freeze_time(start) as frozen:
        platform.follow(frozen)
        result = platform.sms_inbound(message="hello")

    assert result.answers == [503, 503, 200]
    every_10_s = [start, start + timedelta(seconds=10), start + timedelta(seconds=20)]
    assert [attempt.sent_at for attempt in result.attempts] == every_10_s
    assert my_app.state.seen == every_10_s  # the app saw the same clock


def test_number_lookups_retry_after_1_then_5_minutes(platform, my_app):  # type: ignore[no-untyped-def]
    async def lookup(request: Request) -> Response:
        request.app.state.seen.append(datetime.now(UTC))
        return Response(status_code=200 if len(request.app.state.seen) == 3 else 500)

    my_app.router.routes.append(Route("/hooks/numinfo/gnp", lookup, methods=["POST"]))
    platform.target(my_app)
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    with freeze_time(start) as frozen:
        platform.follow(frozen)
        result = platform.numinfo_gnp()
    offsets = [a.sent_at - start for a in result.attempts]
    assert offsets == [timedelta(0), timedelta(minutes=1), timedelta(minutes=6)]
