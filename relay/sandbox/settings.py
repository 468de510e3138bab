"""A sandbox's settings: where it listens, its API key, its time scale, where inbound SMS go,
and its chaos. Read from a TOML file (``--config``) with the command line's options on top."""

from __future__ import annotations

import re
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from relay.durations import Duration

INTERNATIONAL = re.compile(r"\+[1-9][0-9]{6,14}")
"""A number in international format: ``+``, then 7 to 15 digits, no leading 0."""
CHAOS_NAMES = ("api-429", "api-500", "duplicate", "out-of-order", "slow")
"""The kinds of chaos, as named in the ``X-Sandbox-Chaos`` header and ``--chaos``."""
API_CHAOS = frozenset({"api-429", "api-500"})
MIN_TIME_SCALE = 1e-6
"""The fastest platform time: a million times real time (48 h in 0.17 s); faster ones would
run past the year 9999 within days (and 1e-300 overflows at once)."""
MAX_TIME_SCALE = 1000.0
MAX_VALIDITY = timedelta(days=30)
MAX_CONFIG_BYTES = 1024 * 1024


class ChaosSettings(BaseModel):
    """Per run: the share (0 to 1) of API requests or messages that get each kind of chaos."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_429: float = Field(default=0.0, ge=0, le=1, alias="api-429")
    api_500: float = Field(default=0.0, ge=0, le=1, alias="api-500")
    duplicate: float = Field(default=0.0, ge=0, le=1)
    out_of_order: float = Field(default=0.0, ge=0, le=1, alias="out-of-order")
    slow: float = Field(default=0.0, ge=0, le=1)
    slow_delay: Duration = timedelta(minutes=1)
    """How late a slow callback is sent (platform time)."""
    retry_after: int = Field(default=1, ge=0, le=3600)
    """The Retry-After (seconds) of an api-429 answer."""

    def rate(self, name: str) -> float:
        """The share for a chaos name of :data:`CHAOS_NAMES`."""
        return float(getattr(self, name.replace("-", "_")))


def http_url(value: str | None) -> str | None:
    """An absolute http(s) URL with a host that the sandbox's HTTP client can send to (no
    control character or space, a port from 1 to 65535), or None; ValueError otherwise."""
    if value is None:
        return None
    if not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError("must be an http(s) URL with a host (no space or control character)")
    try:
        url = httpx.URL(value)
        port = urlsplit(value).port
    except (httpx.InvalidURL, ValueError):
        raise ValueError("must be an http(s) URL with a host and a port from 1 to 65535") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("must be an http(s) URL with a host")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("must be an http(s) URL with a host and a port from 1 to 65535")
    return value


class SandboxSettings(BaseModel):
    """One sandbox's settings (keys of the ``--config`` TOML file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=0, le=65535)
    api_key: SecretStr | None = None
    """The key the app sends in the ``apikey`` header; generated at start when not given."""
    time_scale: float = Field(
        default=1.0, ge=MIN_TIME_SCALE, le=MAX_TIME_SCALE, allow_inf_nan=False
    )
    """Platform time runs ``1 / time_scale`` times faster (0.001: 48 h in ~3 min)."""
    inbound_url: str | None = None
    """Where inbound SMS (a magic number's reply, the control API's) are sent; none: they are
    not sent."""
    inbound_number: str = "+99955500000"
    """The sandbox's provisioned number: the ``to`` of an inbound SMS sent on request without
    one (made up: +999 is no country's code)."""
    validity: Duration = timedelta(hours=48)
    """How long an SMS without ``validity`` stays deliverable (an assumption: not published)."""
    max_messages: int = Field(default=10_000, ge=1, le=1_000_000)
    """How many messages are kept: beyond it, the oldest finished ones are forgotten."""
    seed: int | None = None
    """Seeds the chaos draws (reproducible runs)."""
    chaos: ChaosSettings = ChaosSettings()

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty (0.0.0.0 listens on every interface)")
        return value

    @field_validator("inbound_url")
    @classmethod
    def _inbound_url(cls, value: str | None) -> str | None:
        return http_url(value)

    @field_validator("inbound_number")
    @classmethod
    def _inbound_number(cls, value: str) -> str:
        if not INTERNATIONAL.fullmatch(value):
            raise ValueError("must be a number in international format (+ and 7 to 15 digits)")
        return value

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        key = value.get_secret_value()
        if not key.strip():
            raise ValueError("must not be empty")
        if not all(" " < c < "\x7f" for c in key):
            raise ValueError(
                "must be visible ASCII characters (an HTTP header cannot carry the others)"
            )
        return value

    @field_validator("validity", mode="before")
    @classmethod
    def _validity_text(cls, value: Any) -> Any:
        if not isinstance(value, str | timedelta):
            raise ValueError('must be a duration with its unit, e.g. "48h" or "30m"')
        return value

    @field_validator("validity")
    @classmethod
    def _validity_positive(cls, value: timedelta) -> timedelta:
        if not timedelta(0) < value <= MAX_VALIDITY:
            raise ValueError("must be more than 0 and at most 30 days")
        return value


def _names(chaos: dict[str, Any]) -> dict[str, Any]:
    """Chaos keys one way (``api-429`` and ``api_429`` are the same setting)."""
    return {key.replace("-", "_"): value for key, value in chaos.items()}


class SandboxSettingsError(ValueError):
    """Settings that cannot be used; the message says which and why (never a key's value)."""


def _read_config(path: Path) -> str:
    """A config file's text: a regular file (not a device or a pipe, which may never end) of
    at most :data:`MAX_CONFIG_BYTES`."""
    if path.exists() and not path.is_file():
        raise SandboxSettingsError(f"config file {path} is not a regular file")
    with path.open("rb") as file:
        data = file.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise SandboxSettingsError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    return data.decode("utf-8")


def load_sandbox_settings(path: Path | None, overrides: dict[str, Any]) -> SandboxSettings:
    """The TOML file's settings (if any) with ``overrides`` (non-None values) on top."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(_read_config(path))
        except FileNotFoundError:
            raise SandboxSettingsError(f"config file {path} does not exist") from None
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SandboxSettingsError(f"config file {path} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise SandboxSettingsError(f"config file {path} cannot be read: {exc}") from None
    overrides = dict(overrides)
    chaos = overrides.pop("chaos", None) or {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if chaos:
        given = data.get("chaos", {})
        data["chaos"] = {**_names(given), **_names(chaos)} if isinstance(given, dict) else given
    try:
        return SandboxSettings(**data)
    except ValidationError as exc:
        lines = [
            f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)
        ]
        raise SandboxSettingsError("invalid sandbox settings:\n" + "\n".join(lines)) from None
