"""The default source's generated token: the URLs printed for the platform at the first start keep
working when other sources are configured, until `[sources.default]` replaces them or
`relay sources forget-default` deletes the token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.bootstrap import DEFAULT_TOKEN_KEY, SETTINGS, generated_token, kept_token
from relay.runtime import start
from relay.settings import Settings, SettingsError
from relay.simulator import factories
from tests.conftest import TOKEN, running_client
from tests.console_support import ConsoleClient

SIGNATURE_SECRET = "a-chat-signature-secret-0123456789"
CHAT = {"signature_secret": SIGNATURE_SECRET}
OWN_TOKEN = "our-own-default-token-0123456789"
CONSOLE_USER, CONSOLE_PASSWORD = "alice", "correct horse battery staple"

BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "/sms/inbound": factories.sms_inbound,
    "/sms/dlr": factories.sms_dlr,
    "/numinfo/gnp": factories.numinfo_gnp,
    "/numinfo/gnv": factories.numinfo_gnv,
    "/conversations": factories.conversations_status,
    "/chat-api": lambda: factories.conversations_status(v2=True),
    "/tts/events": factories.tts_event,
}
"""A valid callback for every receiver path (a new path fails here until it gets one)."""


# --- which sources `relay serve` serves, for every configuration -------------------------------

CONFIGURATIONS = {
    "nothing": {},
    "chat": {"chat": CHAT},
    "chat and eu": {"chat": CHAT, "eu": {"token": TOKEN}},
    "default": {"default": {"token": OWN_TOKEN}},
    "default and chat": {"default": {"token": OWN_TOKEN}, "chat": CHAT},
}


@pytest.mark.parametrize("configured", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
async def test_a_kept_generated_token_serves_the_default_source_until_it_is_configured(
    engine: AsyncEngine, database_url: str, configured: dict[str, Any]
) -> None:
    kept = await generated_token(engine)  # as a first start without any source left it
    runtime = await start(Settings(database_url=database_url, sources=configured))
    try:
        async with running_client(runtime.engine, dict(runtime.receiver_config.sources)) as client:
            answers = {
                path: (await client.post(f"/hooks{path}?token={kept}", json=body())).status_code
                for path, body in BODIES.items()
            }
        assert await kept_token(runtime.engine) == kept  # never replaced nor deleted by a start
    finally:
        await runtime.engine.dispose()
    configured_default = "default" in configured
    assert answers == dict.fromkeys(BODIES, 401 if configured_default else 200)
    assert set(runtime.receiver_config.sources) == {*configured, "default"}
    assert runtime.generated is not None and runtime.generated.token == kept
    assert runtime.generated.served is not configured_default


@pytest.mark.parametrize(
    "configured", [c for c in CONFIGURATIONS.values() if c], ids=[k for k in CONFIGURATIONS][1:]
)
async def test_configured_sources_never_generate_a_token(
    engine: AsyncEngine, database_url: str, configured: dict[str, Any]
) -> None:
    runtime = await start(Settings(database_url=database_url, sources=configured))
    try:
        assert await kept_token(runtime.engine) is None
    finally:
        await runtime.engine.dispose()
    assert dict(runtime.receiver_config.sources).keys() == configured.keys()
    assert runtime.generated is None


async def test_the_console_filters_by_the_default_source_its_generated_token_serves(
    engine: AsyncEngine, database_url: str
) -> None:
    kept = await generated_token(engine)
    settings = Settings(
        database_url=database_url,
        sources={"chat": CHAT},
        console={"users": {CONSOLE_USER: CONSOLE_PASSWORD}},
    )
    runtime = await start(settings)
    app = runtime.app()
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://relay.test") as http,
        ):
            stored = await http.post(
                f"/hooks/sms/inbound?token={kept}", json=BODIES["/sms/inbound"]()
            )
            assert stored.status_code == 200
            console = ConsoleClient(http)
            assert (await console.login(CONSOLE_USER, CONSOLE_PASSWORD)).status_code == 303
            page = await http.get("/console/events", params={"source": "default"})
    finally:
        await runtime.engine.dispose()
    assert page.status_code == 200
    assert stored.json()["id"] in page.text


async def test_a_kept_value_that_is_no_usable_token_is_one_clear_refusal(
    engine: AsyncEngine, database_url: str
) -> None:
    await generated_token(engine)
    async with engine.begin() as conn:
        await conn.execute(
            update(SETTINGS).where(SETTINGS.c.key == DEFAULT_TOKEN_KEY).values(value="xyz")
        )
    with pytest.raises(SettingsError) as refused:
        await start(Settings(database_url=database_url, sources={"chat": CHAT}))
    assert "generated token kept in the database is unusable" in str(refused.value)
    assert "forget-default" in str(refused.value) and "xyz" not in str(refused.value)
