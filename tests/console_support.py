"""Support for console tests: the console app in-process, logged in, with its CSRF token."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Mount

from relay.console.app import console_app
from relay.console.sessions import Sessions
from relay.outbox import Due
from tests.relay_support import Clock

USER = "alice"
PASSWORD = "correct horse battery staple"
KEY = "a-console-signing-key-for-the-tests"
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


@asynccontextmanager
async def console_client(
    engine: AsyncEngine,
    clock: Clock,
    destinations: list[str],
    *,
    users: dict[str, str] | None = None,
    key: str = KEY,
    targets: dict[str, str] | None = None,
) -> AsyncIterator[ConsoleClient]:
    """A console over ``engine`` mounted at /console, talked to in-process."""
    enqueued: list[Due] = []

    async def enqueue(due: list[Due]) -> None:
        enqueued.extend(due)

    sessions = Sessions(key, users or {USER: PASSWORD}, timedelta(hours=1))
    app = Starlette(
        routes=[
            Mount(
                "/console",
                console_app(
                    engine,
                    sessions,
                    enqueue,
                    sources=["default"],
                    destinations=destinations,
                    clock=clock,
                    targets=targets,
                ),
            )
        ]
    )
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://relay.test") as http:
        yield ConsoleClient(http, enqueued)
