"""Support for console tests: console replicas in-process, and browsers logged in to them."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from ipaddress import ip_network
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Mount

from relay.console.access import console_access
from relay.console.app import console_app
from relay.console.config import ConsoleConfig
from relay.console.users import Users
from relay.outbox import Due
from relay.settings import Settings
from tests.relay_support import Clock

USER = "alice"
PASSWORD = "correct horse battery staple"
KEY = "a-console-signing-key-for-the-tests"
SESSION_LIFETIME = timedelta(hours=1)
CSRF = re.compile(r'name="csrf" value="([^"]*)"')
LOGIN_TOKEN = re.compile(r'name="token" value="([^"]*)"')


@dataclass
class ConsoleClient:
    """A client of an in-process console, and what its actions handed to the queue."""

    http: httpx.AsyncClient
    enqueued: list[Due] = field(default_factory=list)
    csrf: str = ""

    async def login(self, user: str = USER, password: str = PASSWORD) -> httpx.Response:
        form = await self.http.get("/console/login")
        token = LOGIN_TOKEN.search(form.text)
        assert token is not None
        answer = await self.http.post(
            "/console/login",
            data={"token": token[1], "user": user, "password": password, "next": ""},
        )
        if answer.status_code == 303:
            page = await self.http.get("/console/events")
            found = CSRF.search(page.text)
            assert found is not None
            self.csrf = found[1]
        return answer

    async def act(self, path: str, **fields: str) -> httpx.Response:
        """POST a console form with this session's CSRF token."""
        return await self.http.post(path, data={"csrf": self.csrf, **fields})


@dataclass
class Replica:
    """One replica's console app (its own throttle and sessions objects, as a `relay serve`
    process has), and what its actions handed to the queue."""

    app: Starlette
    enqueued: list[Due] = field(default_factory=list)

    @asynccontextmanager
    async def browser(self, address: str = "127.0.0.1") -> AsyncIterator[ConsoleClient]:
        """A browser (its own cookies) talking to this replica from ``address``."""
        transport = httpx.ASGITransport(app=self.app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://relay.test") as http:
            yield ConsoleClient(http, self.enqueued)


def replica(
    engine: AsyncEngine,
    clock: Clock,
    destinations: Sequence[str] = (),
    *,
    users: dict[str, str] | None = None,
    key: str = KEY,
    targets: dict[str, str] | None = None,
    trusted_proxies: Sequence[str] = (),
) -> Replica:
    """A console over ``engine`` mounted at /console, talked to in-process."""
    enqueued: list[Due] = []

    async def enqueue(due: list[Due]) -> None:
        enqueued.extend(due)

    app = Starlette(
        routes=[
            Mount(
                "/console",
                console_app(
                    engine,
                    Users(key, users or {USER: PASSWORD}),
                    key,
                    enqueue,
                    sources=["default"],
                    destinations=list(destinations),
                    clock=clock,
                    session_lifetime=SESSION_LIFETIME,
                    targets=targets,
                    trusted_proxies=[ip_network(proxy) for proxy in trusted_proxies],
                ),
            )
        ]
    )
    return Replica(app, enqueued)


@asynccontextmanager
async def console_client(
    engine: AsyncEngine, clock: Clock, destinations: Sequence[str], **options: Any
) -> AsyncIterator[ConsoleClient]:
    """A browser of a console of its own over ``engine`` (``options``: :func:`replica`'s)."""
    async with replica(engine, clock, destinations, **options).browser() as client:
        yield client


async def start_replica(
    engine: AsyncEngine, clock: Clock, users: dict[str, str] | None = None
) -> Replica:
    """A replica started as `relay serve` starts its console (which ends the sessions of
    changed passwords and removed users), with the installation's key from the database."""
    users = users or {USER: PASSWORD}
    settings = Settings(console=ConsoleConfig(users=users))
    access = await console_access(settings, engine, clock)
    assert access is not None
    return replica(engine, clock, users=access.users, key=access.key)
