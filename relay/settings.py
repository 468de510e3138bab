"""Settings: a TOML file (``--config`` or ``RELAY_CONFIG``), overridden by ``RELAY_*`` env vars."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as EnvParseError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from receivers.config import DEFAULT_MAX_BODY_BYTES, check_source_name, check_storable_name
from receivers.sources import Network, SourceConfig, check_not_everyone
from relay.console.config import ConsoleConfig
from relay.counts import Count
from relay.delivery.policies import Policy, PolicyConfigs, resolve_policies
from relay.destinations.registry import DestinationConfig
from relay.durations import Duration
from relay.outbox.router import PLATFORM_POLICY
from relay.store.retention import platform_retry_window, shortest_retention

ENV_PREFIX = "RELAY_"
"""``RELAY_<KEY>`` overrides a top-level key of the file."""
CONFIG_ENV = "RELAY_CONFIG"
LOCAL_CONFIG = "relay.toml"
"""The config file a command reads from its working directory when neither ``--config`` nor
``RELAY_CONFIG`` names one."""
DEFAULT_DATABASE_URL = "sqlite:///relay.db"
NAME_LENGTH = 64
"""The longest destination or policy name (the width of the deliveries' columns)."""
SHORTEST_EDGE_TIMEOUT = timedelta(milliseconds=100)
LONGEST_EDGE_TIMEOUT = timedelta(hours=1)
SHORTEST_REFRESH_INTERVAL = timedelta(seconds=1)
LONGEST_REFRESH_INTERVAL = timedelta(hours=1)
SHOWN_HOST = 40
"""How much of a refused host an error message repeats."""


class SettingsError(Exception):
    """The configuration is unusable; the message says why, without any secret."""


class Settings(BaseSettings):
    """Everything `relay` is configured with; ``RELAY_<KEY>`` overrides a top-level key."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    database_url: str = DEFAULT_DATABASE_URL
    max_body_bytes: Count = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    trusted_proxies: Annotated[list[Network], NoDecode] = Field(default_factory=list)
    sources: dict[str, SourceConfig] = Field(default_factory=dict)
    redis_url: str | None = None
    """Real Redis for the relay's queue (scaled mode); empty or absent: dispatched in process."""
    destinations: dict[str, DestinationConfig] = Field(default_factory=dict)
    policies: PolicyConfigs = Field(default_factory=dict)
    sweep_interval: Duration = timedelta(seconds=5)
    worker_concurrency: Count = Field(default=50, ge=1, le=1000)
    lease_margin: Duration = timedelta(seconds=10)
    """Added to the longest destination timeout: how long a claimed delivery stays leased."""
    max_header_bytes: Count = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    """The most bytes a request's head (request line and header fields) may take (else 431)."""
    max_headers: Count = Field(default=100, ge=8, le=10_000)
    """The most header fields a request may have (else 431)."""
    header_timeout: Duration = timedelta(seconds=10)
    """How long a request's head may take to arrive, from the connection's start or from the
    first byte of the next request on a keep-alive connection (else 408)."""
    body_timeout: Duration = timedelta(seconds=30)
    """How long a request's body may take to arrive after its head (else 408, or a close)."""
    max_connections: Count | None = Field(default=None, ge=16, le=1_000_000)
    """Client connections served at once; unset: derived from the open-files limit."""
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    """The operator console at ``/console`` (users, session lifetime)."""
    writer_process: bool = True
    """A SQLite file's events are written by a process of its own (a speed trick; off: by the
    server's own process, as for PostgreSQL)."""
    retention: Duration | None = None
    """How long events and quarantined bodies are kept (see :mod:`relay.store.retention`); None
    (the default, or empty): for ever."""
    metrics_refresh_interval: Duration = timedelta(seconds=5)
    """The store's gauges on ``/metrics`` are read from the database at most this often."""
    admin_port: Count | None = Field(default=None, ge=1, le=65535)
    """`relay serve` serves ``/console``, ``/metrics`` and ``/openapi.json`` on this port of its
    own (on ``admin_host``), and only the receivers and health checks on the public one."""
    admin_host: str = "127.0.0.1"
    """The interface of ``admin_port``."""

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        check_database_url(value)
        return value

    @field_validator("sources")
    @classmethod
    def _source_names(cls, value: dict[str, SourceConfig]) -> dict[str, SourceConfig]:
        for name in value:
            check_source_name(name)
        return value

    @field_validator("destinations", "policies")
    @classmethod
    def _names_fit_the_store(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        what = {"destinations": "destination", "policies": "policy"}[info.field_name or ""]
        for name in value:
            check_storable_name(what, name)
            if len(name) > NAME_LENGTH:
                raise ValueError(
                    f"{what} name {name[:16]!r}... is longer than {NAME_LENGTH} characters"
                )
        return value

    @field_validator("header_timeout", "body_timeout")
    @classmethod
    def _edge_timeout_in_range(cls, value: timedelta) -> timedelta:
        if not SHORTEST_EDGE_TIMEOUT <= value <= LONGEST_EDGE_TIMEOUT:
            raise ValueError(f"must be between 100ms and 1h, not {value.total_seconds():g}s")
        return value

    @field_validator("metrics_refresh_interval")
    @classmethod
    def _refresh_interval_in_range(cls, value: timedelta) -> timedelta:
        if not SHORTEST_REFRESH_INTERVAL <= value <= LONGEST_REFRESH_INTERVAL:
            raise ValueError(f"must be between 1s and 1h, not {value.total_seconds():g}s")
        return value

    @field_validator("admin_host")
    @classmethod
    def _admin_host(cls, value: str) -> str:
        return check_host(value)

    @model_validator(mode="after")
    def _admin_host_needs_its_port(self) -> Settings:
        if "admin_host" in self.model_fields_set and self.admin_port is None:
            raise ValueError("admin_host is set but admin_port is not: set both, or neither")
        return self

    @field_validator("max_connections", "retention", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("retention")
    @classmethod
    def _outlives_the_platform_retries(cls, value: timedelta | None) -> timedelta | None:
        shortest = shortest_retention()
        if value is not None and value < shortest:
            raise ValueError(
                f"must be at least {_days(shortest)}, or left out to keep everything: the "
                f"platform sends a callback again for up to {_days(platform_retry_window())}, "
                "and a retry of a removed event would be stored and relayed again as a new "
                f"one (got {_days(value)})"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _empty_is_embedded(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @model_validator(mode="after")
    def _policies_exist(self) -> Settings:
        known = set(resolve_policies(self.policies)) | {PLATFORM_POLICY}
        for name, destination in self.destinations.items():
            if destination.policy not in known:
                raise ValueError(
                    f"destination {name!r} uses policy {destination.policy!r}, which is not "
                    f"defined (known: {', '.join(sorted(known))})"
                )
        return self

    def resolved_policies(self) -> Mapping[str, Policy]:
        """Built-in and custom retry policies by name."""
        return resolve_policies(self.policies)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _not_everyone(cls, value: list[Network]) -> list[Network]:
        check_not_everyone(value, "trusted_proxies")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment variables win over the file's values (given as init arguments)."""
        return env_settings, init_settings


def _days(duration: timedelta) -> str:
    return f"{duration.total_seconds() / 86400:g} days"


DATABASE_DRIVERS = ("sqlite", "sqlite+aiosqlite", "postgresql", "postgres", "postgresql+asyncpg")


def check_database_url(value: str) -> None:
    """Refuse what the store cannot open durably: a URL that is not one, a database other than
    SQLite or PostgreSQL (through asyncpg), or SQLite without a file (in memory, every event
    would be lost at the stop)."""
    try:
        url = make_url(value)
    except ArgumentError:
        raise ValueError(
            "not a database URL: sqlite:///relay.db, sqlite:////abs/path.db or "
            "postgresql://user@host/db"
        ) from None
    if url.drivername not in DATABASE_DRIVERS:
        raise ValueError(
            f"{url.drivername}:// is not supported: sqlite:/// or postgresql:// (asyncpg)"
        )
    if url.get_backend_name() == "sqlite":
        if url.host:
            raise ValueError(
                "a SQLite URL has three slashes before a relative path (sqlite:///relay.db), "
                "four before an absolute one"
            )
        if not url.database or url.database == ":memory:":
            raise ValueError("SQLite needs a file: in memory, the events would be lost at stop")


HOST_LENGTH = 253
"""The longest host name DNS allows."""
HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def check_host(value: str) -> str:
    """``value`` if it can name an interface to listen on: an IP address or a host name (DNS
    labels of letters, digits and hyphens); whether it resolves is known only when bound."""
    if len(value) <= HOST_LENGTH:
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(value)
            return value
        if all(HOST_LABEL.fullmatch(label) for label in value.split(".")):
            return value
    shown = repr(value) if len(value) <= SHOWN_HOST else repr(value[:SHOWN_HOST]) + "..."
    raise ValueError(f"not an IP address or a host name: {shown}")


def config_path(
    given: str | os.PathLike[str] | None,
    environ: Mapping[str, str],
    directory: Path | None = None,
) -> Path | None:
    """The config file: ``--config``, else ``RELAY_CONFIG``, else :data:`LOCAL_CONFIG` in
    ``directory`` (the working directory by default) when there is one, else none."""
    chosen = given or environ.get(CONFIG_ENV)
    if chosen:
        return Path(chosen)
    local = (directory or Path.cwd()) / LOCAL_CONFIG
    return local if local.is_file() else None


def load_settings(path: Path | None) -> Settings:
    """Read the TOML file (if any) and apply the environment on top."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"config file {path} does not exist") from None
        except UnicodeDecodeError:
            raise SettingsError(f"config file {path} is not UTF-8 text") from None
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise SettingsError(f"config file {path} cannot be read: {reason}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, path)) from None
    except EnvParseError as exc:
        raise SettingsError(_unparsed(exc)) from None


def _describe(
    exc: ValidationError, path: Path | None, environ: Mapping[str, str] = os.environ
) -> str:
    """One line per error, naming the ``RELAY_*`` variable where the value came from one (it
    wins over the file), and the file in the first line where any came from it."""
    variables = {name.upper(): name for name in environ}  # pydantic-settings ignores case
    lines, from_file = [], False
    for error in exc.errors(include_url=False, include_input=False):
        location = ".".join(str(part) for part in error["loc"]) or "(top level)"
        variable = variables.get(f"{ENV_PREFIX}{error['loc'][0]}".upper()) if error["loc"] else None
        holds, tag = (
            (False, None) if variable is None else _given_by(environ[variable], error["loc"][1:])
        )
        if holds:
            lines.append(f"  {location} (from {variable}): {error['msg']}")
        elif tag is not None:
            from_file = True  # the file's setting, refused for the type the variable gave
            lines.append(f"  {location} (type {tag!r} from {variable}): {error['msg']}")
        else:
            from_file = True
            lines.append(f"  {location}: {error['msg']}")
    where = f" in {path}" if path and from_file else ""
    return "\n".join([f"invalid configuration{where}:", *lines])


def _given_by(value: str, location: Sequence[int | str]) -> tuple[bool, str | None]:
    """What a variable's value gives of the setting at ``location`` (below its own key):
    whether it holds the setting, and the ``type`` its JSON table gives on the way (pydantic
    puts a union's tag in the location). A table given as JSON is merged with the file's, so
    the setting may be the file's, refused for the type the variable gave its table."""
    if not location:
        return True, None
    try:
        node: Any = json.loads(value)
    except ValueError:
        return True, None  # not JSON: the value itself is what was refused
    found, tag = False, None
    for part in location:
        found = isinstance(node, dict | list) and part in (
            node if isinstance(node, dict) else range(len(node))
        )
        if found:
            node = node[part]
        elif isinstance(node, dict) and node.get("type") == part:
            tag = str(part)
    return found, tag


def _unparsed(exc: EnvParseError, environ: Mapping[str, str] = os.environ) -> str:
    """Which ``RELAY_*`` variable holds a table that is not JSON, and why."""
    for name, value in environ.items():
        field = name.upper().removeprefix(ENV_PREFIX).lower()
        if not name.upper().startswith(ENV_PREFIX) or field not in Settings.model_fields:
            continue
        if f'field "{field}"' not in str(exc):
            continue
        try:
            json.loads(value)
        except ValueError as error:
            return f"{name} is not valid JSON (a table is given as a JSON object): {error}"
    return f"invalid environment setting: {exc}"
