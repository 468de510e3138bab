"""Values an installation generates for itself on first start and keeps in its database: the
default source's token, the console's password and the key that signs its cookies and tokens."""

from __future__ import annotations

import secrets

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.sources import SourceConfig
from relay.outbox.tables import InstanceSetting

DEFAULT_TOKEN_KEY = "default_source_token"
CONSOLE_PASSWORD_KEY = "console_password"
CONSOLE_SESSION_KEY = "console_session_key"
SETTINGS = InstanceSetting.__table__


async def kept_secret(engine: AsyncEngine, key: str) -> str:
    """The value kept under ``key``, generated (32 random bytes, URL-safe) on first use; every
    process sharing the database gets the same one."""
    insert = (postgresql if engine.dialect.name == "postgresql" else sqlite).insert(SETTINGS)
    async with engine.begin() as conn:
        await conn.execute(
            insert.values(key=key, value=secrets.token_urlsafe(32)).on_conflict_do_nothing(
                index_elements=["key"]
            )
        )
        value = await conn.scalar(select(SETTINGS.c.value).where(SETTINGS.c.key == key))
    assert value is not None
    return str(value)


async def kept_value(engine: AsyncEngine, key: str) -> str | None:
    """The value kept under ``key``, or None: never generates one."""
    async with engine.connect() as conn:
        value = await conn.scalar(select(SETTINGS.c.value).where(SETTINGS.c.key == key))
    return None if value is None else str(value)


async def forget_value(engine: AsyncEngine, key: str) -> bool:
    """Delete the value kept under ``key``; whether there was one."""
    async with engine.begin() as conn:
        deleted = await conn.execute(delete(SETTINGS).where(SETTINGS.c.key == key))
    return bool(deleted.rowcount)


async def generated_token(engine: AsyncEngine) -> str:
    """This installation's token for the default source, generated on first use."""
    return await kept_secret(engine, DEFAULT_TOKEN_KEY)


async def kept_token(engine: AsyncEngine) -> str | None:
    """The default source's generated token if the database keeps one (never generates it)."""
    return await kept_value(engine, DEFAULT_TOKEN_KEY)


async def forget_token(engine: AsyncEngine) -> bool:
    """Delete the default source's generated token; whether there was one."""
    return await forget_value(engine, DEFAULT_TOKEN_KEY)


def token_source(token: str) -> SourceConfig:
    """The default source served with the generated token: the URL token only."""
    return SourceConfig(token=token)
