"""Per-source receiver settings: which checks a callback must pass.

A secret that an attacker could guess or leave out is refused here, at start-up: empty or short
tokens, passwords, header values and HMAC keys, and allowlists that allow every address.
"""

from __future__ import annotations

import re
from ipaddress import IPv4Network, IPv6Network, collapse_addresses, ip_network
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

Network = IPv4Network | IPv6Network

MIN_SECRET_LENGTH = 16
"""The fewest characters of a configured token, password, header value or signature secret
(the generated token has 43)."""
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP field name (RFC 9110 token)."""
GENERATE_COMMAND = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
MIN_DISTINCT_CHARACTERS = 8
"""The fewest different characters of a configured secret (``aaaaaaaaaaaaaaaa`` is no secret)."""
RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "connection",
        "content-length",
        "content-type",
        "expect",
        "forwarded",
        "host",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "x-forwarded-for",
        "x-request-timestamp",
        "x-signature",
        "x-signature-version",
    }
)
"""Headers that HTTP, a proxy or another check gives a meaning (and that may be stored, such as
Content-Type): a secret of the custom header check may not travel in one of them."""


class HeaderCheck(BaseModel):
    """A custom header the platform sends with every callback (Conversations)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    value: SecretStr

    @field_validator("name")
    @classmethod
    def _field_name(cls, value: str) -> str:
        if not HEADER_NAME.fullmatch(value):
            raise ValueError(f"{value[:32]!r} is not an HTTP header name")
        if value.lower() in RESERVED_HEADERS:
            raise ValueError(
                f"{value} has a meaning of its own in HTTP or another check; choose a header "
                "name of your own, such as X-Callback-Key"
            )
        return value

    @field_validator("value")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        check_secret(value.get_secret_value(), "header value")
        return value


class SourceConfig(BaseModel):
    """How one source authenticates. Every configured check must pass."""

    model_config = ConfigDict(extra="forbid")

    token: list[SecretStr] = Field(default_factory=list)
    basic_auth: list[SecretStr] = Field(default_factory=list)
    header: HeaderCheck | None = None
    signature_secret: list[SecretStr] = Field(default_factory=list)
    signature_method: Literal["HS256", "HS512"] = "HS256"
    signature_tolerance_seconds: StrictInt = Field(default=300, ge=1)
    allow_ips: list[Network] = Field(default_factory=list)
    allow_anonymous: bool = False

    @field_validator("token", "basic_auth", "signature_secret", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        """A single secret or a list of secrets (for rotation)."""
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    @field_validator("token", "signature_secret")
    @classmethod
    def _long_enough(cls, value: list[SecretStr], info: ValidationInfo) -> list[SecretStr]:
        for secret in value:
            check_secret(secret.get_secret_value(), str(info.field_name))
        return value

    @field_validator("basic_auth")
    @classmethod
    def _user_and_password(cls, value: list[SecretStr]) -> list[SecretStr]:
        for secret in value:
            user, colon, password = secret.get_secret_value().partition(":")
            if not colon or not user.strip():
                raise ValueError('basic_auth must be "user:password" with a user name')
            check_secret(password, "basic_auth password")
        return value

    @field_validator("allow_ips", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        if isinstance(value, list):
            return [_network(item) if isinstance(item, str) else item for item in value]
        return value

    @field_validator("allow_ips")
    @classmethod
    def _not_everyone(cls, value: list[Network]) -> list[Network]:
        check_not_everyone(value, "allow_ips")
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


def check_secret(secret: str, what: str) -> None:
    """ValueError unless ``secret`` is at least :data:`MIN_SECRET_LENGTH` characters and not
    padded with spaces (a copy-and-paste slip the platform would not send). The message never
    holds the secret."""
    if not secret.strip():
        raise ValueError(f"{what} is empty")
    if secret != secret.strip():
        raise ValueError(f"{what} starts or ends with white space")
    if not secret.isprintable():
        raise ValueError(f"{what} holds invisible or control characters")
    advice = f"make it long and random, e.g. `{GENERATE_COMMAND}`"
    if len(secret) < MIN_SECRET_LENGTH:
        raise ValueError(f"{what} is shorter than {MIN_SECRET_LENGTH} characters ({advice})")
    if len(set(secret)) < MIN_DISTINCT_CHARACTERS:
        raise ValueError(
            f"{what} has fewer than {MIN_DISTINCT_CHARACTERS} different characters ({advice})"
        )


def check_not_everyone(networks: list[Network] | tuple[Network, ...], what: str) -> None:
    """ValueError when ``networks`` span every address of IPv4 or IPv6 (``0.0.0.0/0``, ``::/0``,
    or ranges that add up to it, such as ``0.0.0.0/1`` and ``128.0.0.0/1``)."""
    for version in (4, 6):
        same = [network for network in networks if network.version == version]
        for network in collapse_addresses(same):  # type: ignore[type-var]
            if network.prefixlen == 0:
                raise ValueError(f"{what} holds {network} (all of it), which is every address")


def _network(text: str) -> Network:
    """A network in CIDR form; host bits set (``1.2.3.4/1``) are refused, not masked away,
    since they point to a typing mistake that would widen the range."""
    try:
        return ip_network(text.strip())
    except ValueError as exc:
        raise ValueError(f"{text.strip()!r} is not a network address ({exc})") from None
