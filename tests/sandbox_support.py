"""Support for the sandbox's tests: a sandbox app in-process (httpx ASGITransport, lifespan
running) on a virtual or stepped clock, and the fields of a valid send request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from relay.sandbox.app import build_app
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.settings import SandboxSettings
from relay.simulator.clocks import Clock, VirtualClock
from tests.support import Sink

START = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
API_KEY = "sandbox-key-for-the-tests"
BASE = "http://sandbox.test"


@dataclass
class Api:
    """A client of one sandbox (the apikey header set) and the sandbox itself."""

    client: httpx.AsyncClient
    sandbox: Sandbox

    async def send(self, **fields: Any) -> httpx.Response:
        """POST /messaging/v1/sms with a valid body changed by ``fields``."""
        return await self.client.post("/messaging/v1/sms", json=sms_fields(**fields))


@asynccontextmanager
async def sandbox_api(clock: Clock | None = None, **settings: Any) -> AsyncIterator[Api]:
    """A sandbox app with its lifespan running, and a client for it."""
    sandbox = Sandbox(
        SandboxSettings(api_key=API_KEY, **settings),
        clock=clock or VirtualClock(START),
        base_url=BASE,
    )
    app = build_app(sandbox)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=BASE, headers={"apikey": API_KEY}) as c,
    ):
        yield Api(c, sandbox)


def sms_fields(**changes: Any) -> dict[str, Any]:
    """A valid SmsMessage body; a change to None removes the field."""
    fields = {"to": "+4915112345678", "from": "ACME", "message": "Your code is 1234"}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


def reports(sink: Sink, path: str = "/hook") -> list[dict[str, Any]]:
    """The JSON bodies the sink received at ``path``."""
    return [json.loads(body) for body in sink.bodies(path)]


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app (its lifespan on) with uvicorn on a free port of 127.0.0.1 in this
    event loop; its base URL."""
    import asyncio
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()
