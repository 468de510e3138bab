"""Schema migrations (Alembic), run on the app's own async engine."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import CONNECT_TIMEOUT_SECONDS
from relay.settings import SettingsError

log = logging.getLogger("relay.migrate")  # stable: users filter on it

MIGRATIONS = Path(__file__).parent.parent / "migrations"
MIGRATION_LOCK = 0x72656C6179  # "relay": PostgreSQL's advisory lock key for migrations
SQLITE_LOCK_TRIES = 24
"""How many times SQLite's busy timeout is waited out for the write lock to migrate."""


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The revision this code expects."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def current_revision(engine: AsyncEngine) -> str | None:
    """The database's revision (``None`` for an empty database)."""
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )


def is_known(revision: str) -> bool:
    """Whether ``revision`` is one of this version's migrations."""
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


def unknown_revision(revision: str) -> SettingsError:
    """The error for a database whose revision this version does not know."""
    return SettingsError(
        f"the database schema is at revision {revision}, which this version does not know "
        "(written by a newer release?): run that release, or restore a backup"
    )


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database up to ``revision``, one process at a time: processes started
    together on a new database (a Procfile's server and worker) migrate in turn, and the later
    ones find it current. A database already current is left alone without waiting for the
    lock; one at a revision this version does not know is a :class:`SettingsError`."""
    current = await current_revision(engine)
    if current is not None and not is_known(current):
        raise unknown_revision(current)
    if revision == "head" and current == head_revision():
        return
    async with engine.begin() as conn:
        await conn.run_sync(lambda sync: _upgrade(sync, revision))


def _upgrade(connection: Connection, revision: str) -> None:
    lock_for_migration(connection)
    try:
        command.upgrade(alembic_config(connection), revision)
    except CommandError as exc:  # a revision written meanwhile by a newer release
        raise SettingsError(f"cannot migrate the database: {exc}") from None


def lock_for_migration(connection: Connection) -> None:
    """Take the database's lock for migrations, held until the transaction ends: SQLite's
    write lock (``BEGIN IMMEDIATE``, waiting up to two minutes for it), PostgreSQL's advisory
    lock :data:`MIGRATION_LOCK`."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        return
    if connection.dialect.name != "sqlite":
        return
    for tried in range(1, SQLITE_LOCK_TRIES + 1):
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            return
        except OperationalError as exc:
            if "locked" not in str(exc.orig):
                raise
            if tried == 1:
                log.warning("waiting for the database's write lock to migrate it")
    waited = SQLITE_LOCK_TRIES * CONNECT_TIMEOUT_SECONDS
    raise SettingsError(
        f"cannot migrate the database: its write lock stayed taken for {waited} s "
        "(another process writing to it?)"
    )
