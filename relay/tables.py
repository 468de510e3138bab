"""SQLModel tables of the relay side."""

from __future__ import annotations

from sqlmodel import Field, SQLModel


class InstanceSetting(SQLModel, table=True):
    """A value this installation generated for itself and keeps across restarts."""

    __tablename__ = "relay_instance_settings"

    key: str = Field(primary_key=True, max_length=64)
    value: str = Field(max_length=1000)
