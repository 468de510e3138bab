"""Whatever anybody may ask without credentials costs the database the same however many ask at
once: callers without credentials hold at most one connection of the pool the callbacks need
(the store's figures of `/metrics` are read in the background, `/readyz` shares one ping), and
a failing database is a log line per change, not per caller."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route

from receivers.readiness import DatabasePing
from receivers.store import create_engine, utc_now
from relay.server.runtime import start
from relay.settings import Settings
from tests.conftest import TOKEN
from tests.relay_support import Clock
from tests.store_support import eventually

CALLERS = 32


class ConnectionsHeld:
    """How many connections of an engine's pool are checked out, now and at most."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._pool = engine.sync_engine.pool
        self.most = 0
        event.listen(self._pool, "checkout", self._checked_out)

    @property
    def now(self) -> int:
        return int(self._pool.checkedout())  # type: ignore[attr-defined]

    def _checked_out(self, *args: Any) -> None:
        self.most = max(self.most, self.now)


def route_paths(routes: list[BaseRoute], prefix: str = "") -> Iterator[str]:
    """Every path of the app's routes, a path parameter filled in."""
    for route in routes:
        if isinstance(route, Mount):
            yield from route_paths(route.routes, prefix + route.path)
        elif isinstance(route, Route):
            yield re.sub(r"\{[^}]*\}", "x", prefix + route.path)


@pytest.fixture
async def app(database_url: str, engine: AsyncEngine) -> AsyncIterator[Starlette]:
    settings = Settings(
        database_url=database_url,
        sources={"default": {"token": TOKEN}},
        console={"users": {"admin": "a-console-password-for-tests"}},
        sweep_interval="1h",  # the sweeper's one sweep at the start, then quiet
    )
    runtime = await start(settings)
    app = runtime.app(clock=Clock(utc_now()))
    app.state.engine = runtime.engine
    try:
        async with app.router.lifespan_context(app):
            yield app
    finally:
        await runtime.engine.dispose()


async def test_callers_without_credentials_hold_one_database_connection_at_most(
    app: Starlette,
) -> None:
    held = ConnectionsHeld(app.state.engine)
    paths = sorted(set(route_paths(app.routes)))
    assert {"/metrics", "/readyz", "/healthz", "/openapi.json", "/console/events"} <= set(paths)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client:
        for path in paths:
            for method in ("GET", "POST"):
                await eventually(lambda: held.now == 0)  # what went before has finished
                held.most = 0
                answers = await asyncio.gather(
                    *(client.request(method, path, content=b"{}") for _ in range(CALLERS))
                )
                await eventually(lambda: held.now == 0)  # what they started meanwhile too
                assert held.most <= 1, (method, path, held.most)
                assert all(answer.status_code < 500 for answer in answers), (method, path)


async def test_concurrent_readiness_checks_share_one_ping(engine: AsyncEngine) -> None:
    ping = DatabasePing(engine, timeout=30)
    pings: list[str] = []

    def seen(*args: Any) -> None:
        if str(args[2]) == "SELECT 1":
            pings.append(str(args[2]))

    event.listen(engine.sync_engine, "before_cursor_execute", seen)
    try:
        await asyncio.gather(*(ping() for _ in range(CALLERS)))
        assert len(pings) == 1
        await ping()  # a later check pings again: readiness is never a stale answer
        assert len(pings) == 2
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", seen)


async def test_a_failing_database_is_one_line_when_pings_fail_and_one_when_they_succeed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "not-yet"
    engine = create_engine(f"sqlite:///{directory / 'relay.db'}")
    ping = DatabasePing(engine, timeout=30)
    caplog.set_level(logging.INFO, logger="receivers.readiness")
    try:
        for _ in range(3):
            with pytest.raises(OperationalError):
                await ping()
        directory.mkdir()
        await ping()
        await ping()
    finally:
        await engine.dispose()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "readiness check failed: OperationalError"),
        (logging.INFO, "readiness check: the database answers again"),
    ]
