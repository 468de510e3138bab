"""First start without configuration: a generated token for the default source."""

from __future__ import annotations

import secrets

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from receivers.sources import SourceConfig
from relay.tables import InstanceSetting

DEFAULT_TOKEN_KEY = "default_source_token"


async def generated_token(engine: AsyncEngine) -> str:
    """This installation's token, created on first use and kept in the database."""
    table = InstanceSetting.__table__
    insert = (postgresql if engine.dialect.name == "postgresql" else sqlite).insert(table)
    async with engine.begin() as conn:
        await conn.execute(
            insert.values(
                key=DEFAULT_TOKEN_KEY, value=secrets.token_urlsafe(32)
            ).on_conflict_do_nothing(index_elements=["key"])
        )
    async with AsyncSession(engine) as session:
        row = (
            await session.exec(
                select(InstanceSetting).where(InstanceSetting.key == DEFAULT_TOKEN_KEY)
            )
        ).one()
        return row.value


def token_source(token: str) -> SourceConfig:
    """The default source when nothing is configured: the URL token only."""
    return SourceConfig(token=token)
