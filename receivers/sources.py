"""Per-source receiver settings: which checks a callback must pass."""

from __future__ import annotations

from ipaddress import IPv4Network, IPv6Network, ip_network
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

Network = IPv4Network | IPv6Network


class HeaderCheck(BaseModel):
    """A custom header the platform sends with every callback (Conversations)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    value: SecretStr


class SourceConfig(BaseModel):
    """How one source authenticates. Every configured check must pass."""

    model_config = ConfigDict(extra="forbid")

    token: list[SecretStr] = Field(default_factory=list)
    basic_auth: list[SecretStr] = Field(default_factory=list)
    header: HeaderCheck | None = None
    signature_secret: list[SecretStr] = Field(default_factory=list)
    signature_method: Literal["HS256", "HS512"] = "HS256"
    signature_tolerance_seconds: int = Field(default=300, ge=1)
    allow_ips: list[Network] = Field(default_factory=list)
    allow_anonymous: bool = False

    @field_validator("token", "basic_auth", "signature_secret", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        """A single secret or a list of secrets (for rotation)."""
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    @field_validator("basic_auth")
    @classmethod
    def _user_and_password(cls, value: list[SecretStr]) -> list[SecretStr]:
        for secret in value:
            if ":" not in secret.get_secret_value():
                raise ValueError('basic_auth must be "user:password"')
        return value

    @field_validator("allow_ips", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        if isinstance(value, list):
            return [_network(item) if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _has_a_check(self) -> SourceConfig:
        if not self.has_checks() and not self.allow_anonymous:
            raise ValueError(
                "this source has no check (token, basic_auth, header, signature_secret, "
                "allow_ips): configure one, or set allow_anonymous = true to accept "
                "callbacks from anyone"
            )
        return self

    def has_checks(self) -> bool:
        """Whether any authentication check is configured."""
        return bool(
            self.token or self.basic_auth or self.header or self.signature_secret or self.allow_ips
        )


def _network(text: str) -> Network:
    return ip_network(text.strip(), strict=False)
