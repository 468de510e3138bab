"""Wiring: settings -> database -> receivers app (and later the relay worker)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from receivers import DEFAULT_SOURCE, create_app
from receivers.app import utc_now
from receivers.config import ReceiverConfig
from receivers.store.engine import create_engine
from relay import migrate
from relay.bootstrap import generated_token, token_source
from relay.settings import Settings, SettingsError


@dataclass
class Runtime:
    """What a running `relay serve` is made of."""

    settings: Settings
    engine: AsyncEngine
    receiver_config: ReceiverConfig
    generated_token: str | None

    def app(self, clock: Callable[[], datetime] = utc_now) -> Starlette:
        """The ASGI app to serve."""
        return create_app(self.receiver_config, self.engine, clock=clock)


async def prepare_database(engine: AsyncEngine) -> None:
    """SQLite is migrated in place; other databases must have been upgraded by an operator."""
    if engine.dialect.name == "sqlite":
        await migrate.upgrade(engine)
        return
    current, head = await migrate.current_revision(engine), migrate.head_revision()
    if current != head:
        raise SettingsError(
            f"the database schema is at revision {current or 'none'}, this version needs {head}: "
            "run `relay db upgrade` first"
        )


async def start(settings: Settings) -> Runtime:
    """Open the database, bring it up to date and resolve the sources."""
    engine = create_engine(settings.database_url)
    try:
        await prepare_database(engine)
        token = None
        sources = dict(settings.sources)
        if not sources:
            token = await generated_token(engine)
            sources = {DEFAULT_SOURCE: token_source(token)}
        config = ReceiverConfig(
            sources=sources,
            max_body_bytes=settings.max_body_bytes,
            trusted_proxies=tuple(settings.trusted_proxies),
        )
    except BaseException:
        await engine.dispose()
        raise
    return Runtime(settings, engine, config, token)
