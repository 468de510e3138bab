"""What every destination table shares: filters, retry policy, timeout, and signing secrets.

Filters (all must pass):

- ``kinds``: globs on kind names (``"sms.*"``, ``"conversations.status"``); each must match a
  known kind, to catch typos.
- ``events``: globs on the Conversations ``event`` field, without letter case
  (``"messagestatus::*"``). An event without a text ``event`` field is rejected.
- ``channels``: globs on the Conversations ``channel`` field, without letter case. An event
  without a text ``channel`` field is rejected.
- ``sources``: source names, exactly.

``ordering = "per-key"`` delivers the events of one order key (``order_key``, see
:mod:`relay.outbox.order_keys`) one at a time, in the order they arrived
(:mod:`relay.outbox.ordering`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from receivers.config import check_storable_name
from receivers.kinds import KINDS_BY_NAME, kinds_matching
from relay.destinations.signing import secret_key
from relay.durations import Duration
from relay.outbox.order_keys import DEFAULT_ORDER_KEY, OrderKey


def _one_or_many(value: object) -> object:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _whsec(value: list[SecretStr]) -> list[SecretStr]:
    for secret in value:
        secret_key(secret.get_secret_value())
    return value


Secrets = Annotated[list[SecretStr], BeforeValidator(_one_or_many), AfterValidator(_whsec)]
"""``whsec_...`` signing secrets: one string or a list (several during a rotation)."""


class DestinationBase(BaseModel):
    """Filters, retry policy and timeout shared by every destination type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kinds: list[str] = Field(default_factory=lambda: ["*"])
    events: list[str] | None = None
    channels: list[str] | None = None
    sources: list[str] | None = None
    policy: str = Field(default="platform", min_length=1)
    """``platform``: the kind's platform retry policy; otherwise a named policy."""
    timeout: Duration = timedelta(seconds=5)
    ordering: Literal["none", "per-key"] = "none"
    """``per-key``: one delivery at a time per order key, in arrival order."""
    order_key: str | None = Field(default=None, max_length=500)
    """The order key template (``per-key`` only); default ``{platform_id}``."""
    _order_key: OrderKey | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _parse_order_key(self) -> DestinationBase:
        if self.order_key is not None and self.ordering != "per-key":
            raise ValueError('order_key needs ordering = "per-key"')
        if self.ordering == "per-key":
            try:
                self._order_key = OrderKey(
                    DEFAULT_ORDER_KEY if self.order_key is None else self.order_key
                )
            except ValueError as exc:
                raise ValueError(f"order_key: {exc}") from None
        return self

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError('kinds cannot be empty (omit it, or use ["*"], to relay every kind)')
        for pattern in value:
            if not kinds_matching(pattern):
                raise ValueError(
                    f"kinds pattern {pattern!r} matches no kind (known: {', '.join(KINDS_BY_NAME)})"
                )
        return value

    @field_validator("events", "channels", "sources")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(item.strip() for item in value)):
            raise ValueError("cannot be empty or hold empty names (omit it to accept any)")
        return value

    @field_validator("sources")
    @classmethod
    def _source_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            check_storable_name("source", name)
        return value

    @field_validator("events", "channels")
    @classmethod
    def _lower(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [item.lower() for item in value]

    @field_validator("timeout")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("timeout must be more than zero")
        return value

    def target(self) -> str:
        """Where this destination sends, for operators: addresses without credentials."""
        raise NotImplementedError

    @property
    def timeout_seconds(self) -> float:
        """``timeout`` in seconds, as ``Destination.deliver`` takes it."""
        return self.timeout.total_seconds()

    def order_key_of(self, kind: str, source: str, payload: Mapping[str, Any]) -> str | None:
        """The order key of an event here: None without per-key ordering, or when the event
        lacks a field of the template (it then waits for no other)."""
        return None if self._order_key is None else self._order_key.key(kind, source, payload)

    def wants(self, kind: str, source: str, payload: Mapping[str, Any]) -> bool:
        """Whether an event passes every filter of this destination."""
        if not any(fnmatchcase(kind, pattern) for pattern in self.kinds):
            return False
        if self.sources is not None and source not in self.sources:
            return False
        return _field_matches(payload, "event", self.events) and _field_matches(
            payload, "channel", self.channels
        )


def _field_matches(payload: Mapping[str, Any], field: str, patterns: list[str] | None) -> bool:
    if patterns is None:
        return True
    value = payload.get(field)
    if not isinstance(value, str):
        return False
    value = value.lower()
    return any(fnmatchcase(value, pattern) for pattern in patterns)
