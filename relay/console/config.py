"""The ``[console]`` section of the settings."""

from __future__ import annotations

import re
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from relay.durations import Duration

USER_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")
SHORTEST_PASSWORD = 12
LONGEST_PASSWORD = 1024


class ConsoleConfig(BaseModel):
    """Who may use the console, and how long a login lasts.

    Without ``users``, `relay serve` generates a password for the user ``admin`` on first
    start, keeps it in the database and prints it next to the callback URLs."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    users: dict[str, SecretStr] = Field(default_factory=dict)
    """User name -> password (at least 12 characters); never a callback token."""
    session_lifetime: Duration = timedelta(hours=12)
    """How long a login lasts (its session's expiry in the database)."""
    secure_cookie: bool = False
    """Send the console's cookies only over https (set it when a TLS proxy is in front; it is
    always set when the request itself came over https)."""

    @field_validator("users")
    @classmethod
    def _users_are_sane(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, password in value.items():
            if not USER_NAME.fullmatch(name):
                raise ValueError(
                    f"console user names are 1-64 letters, digits or . _ @ - (not {name[:16]!r})"
                )
            if not SHORTEST_PASSWORD <= len(password.get_secret_value()) <= LONGEST_PASSWORD:
                raise ValueError(
                    f"console user {name!r}: the password must be {SHORTEST_PASSWORD} to "
                    f"{LONGEST_PASSWORD} characters"
                )
        return value

    @field_validator("session_lifetime")
    @classmethod
    def _lifetime_in_range(cls, value: timedelta) -> timedelta:
        if not timedelta(minutes=1) <= value <= timedelta(days=30):
            raise ValueError(f"must be between 1m and 30d, not {value.total_seconds():g}s")
        return value
