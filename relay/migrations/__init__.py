"""Alembic migrations of every callback-relay table."""
