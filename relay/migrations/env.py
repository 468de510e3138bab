"""Alembic environment: always run on a connection handed in by :mod:`relay.store.migrate`."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from receivers.store import tables as receiver_tables  # noqa: F401  (registers the tables)
from relay.console import tables as console_tables  # noqa: F401
from relay.outbox import tables as relay_tables  # noqa: F401

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with `relay db upgrade`, which supplies the connection")

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
