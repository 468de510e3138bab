"""Retry policies: the platform's documented schedules, and custom ones.

A policy is pure: :meth:`Policy.next_attempt` maps (attempts made so far, first attempt time, time
the last one failed) to the next attempt time, or None to give up. No sleeping, no I/O; jitter comes
from a ``random.Random`` the caller passes in. The destination's breaker
(:mod:`relay.delivery.breaker`) is applied on top; :func:`attempt_times` walks a whole schedule
with both.

Reading of the schedules: "retries after 1, 5, 10 ... minutes" means the *delay between successive
attempts*, counted from the failure of the previous one (so ``platform-numinfo`` attempts at 0, 1,
6, 16, 36, 66, 126, 186, ... minutes). The other reading, offsets from the first attempt, is a
custom ``delays`` policy with the differences (``delays = ["1m", "4m", "5m", "10m", ...]``).

Give-up: a policy gives up when the next attempt would fall after ``first_attempt_at +
give_up_after`` (an attempt exactly at that time is still made) or when ``max_attempts`` attempts
have been made. A delivery held by the breaker past that time is given up too.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    Tag,
    model_validator,
)

from relay.delivery.breaker import DestinationHealth, after_failure, hold_until
from relay.durations import Duration

TICK = timedelta(microseconds=1)


class PolicyError(ValueError):
    """A policy that cannot be built; ``reason`` says why."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"policy {name!r}: {reason}")
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class Policy(ABC):
    """A retry schedule, what counts as success, and the breaker parameters that ride with it.

    ``jitter`` is a fraction: 0.1 spreads each delay uniformly over ±10 %. ``pause_after`` /
    ``pause_for``: after every ``pause_after`` consecutive failures at a destination that say it
    is down (:func:`relay.delivery.breaker.after_outcome`), no attempts to it for ``pause_for``.
    """

    name: str
    give_up_after: timedelta | None = None
    max_attempts: int | None = None
    jitter: float = 0.0
    answer_budget: timedelta | None = None
    success_codes: Literal["2xx"] | frozenset[int] = "2xx"
    pause_after: int | None = None
    pause_for: timedelta | None = None

    def __post_init__(self) -> None:
        def fail(reason: str) -> None:
            raise PolicyError(self.name, reason)

        if not 0 <= self.jitter < 1:
            fail(f"jitter is a fraction in [0, 1), not {self.jitter!r}")
        if self.jitter and self.name.startswith("platform-"):
            fail("the platform's schedules take no jitter")
        if self.max_attempts is not None and self.max_attempts < 1:
            fail("max_attempts must be at least 1")
        if self.give_up_after is not None and self.give_up_after < timedelta(0):
            fail("give_up_after cannot be negative")
        if (self.pause_after is None) != (self.pause_for is None):
            fail("pause_after and pause_for go together")
        if self.pause_after is not None and self.pause_after < 1:
            fail("pause_after must be at least 1")
        if self.pause_for is not None and self.pause_for <= timedelta(0):
            fail("pause_for must be positive")
        if self.repeats and self.give_up_after is None and self.max_attempts is None:
            fail("a repeating schedule needs give_up_after or max_attempts")

    @property
    @abstractmethod
    def repeats(self) -> bool:
        """Whether the schedule goes on until give_up_after / max_attempts stop it."""

    @abstractmethod
    def delay(self, attempts: int) -> timedelta | None:
        """The delay (before jitter) after ``attempts`` attempts, or None when the list ends."""

    def is_success(self, status: int) -> bool:
        """Whether an HTTP answer with this status counts as delivered."""
        if self.success_codes == "2xx":
            return 200 <= status < 300
        return status in self.success_codes

    def accepts(self, status: int | None, duration_ms: float) -> bool:
        """Whether an answer counts as delivered: a success status, within the answer budget
        when the policy has one (the platform's senders, simulated or sandboxed, judge so)."""
        if status is None or not self.is_success(status):
            return False
        budget = self.answer_budget
        return budget is None or duration_ms <= budget.total_seconds() * 1000

    def deadline(self, first_attempt_at: datetime) -> datetime | None:
        """The last time an attempt may be made, if the policy has one."""
        if self.give_up_after is None:
            return None
        return first_attempt_at + self.give_up_after

    def next_attempt(
        self,
        attempts: int,
        first_attempt_at: datetime,
        now: datetime,
        rng: random.Random | None = None,
    ) -> datetime | None:
        """When to try again after ``attempts`` (>= 1) attempts, the last failing at ``now``.

        None means give up. Jitter is drawn from ``rng``; without one there is none.
        """
        if attempts < 1:
            raise ValueError(f"attempts counts the attempts made so far (>= 1), not {attempts}")
        if self.max_attempts is not None and attempts >= self.max_attempts:
            return None
        delay = self.delay(attempts)
        if delay is None:
            return None
        try:
            if self.jitter and rng is not None:
                delay = max(delay * (1 + rng.uniform(-self.jitter, self.jitter)), TICK)
            when = now + delay
        except OverflowError:  # beyond any representable time
            return None
        deadline = self.deadline(first_attempt_at)
        if deadline is not None and when > deadline:
            return None
        return when


@dataclass(frozen=True, kw_only=True)
class DelaysPolicy(Policy):
    """Wait ``delays[0]``, ``delays[1]``, ... between attempts, then ``then`` forever (if set)."""

    delays: tuple[timedelta, ...] = ()
    then: timedelta | None = None

    def __post_init__(self) -> None:
        if not self.delays and self.then is None:
            raise PolicyError(self.name, "give delays, then, or both")
        if any(delay <= timedelta(0) for delay in (*self.delays, self.then or TICK)):
            raise PolicyError(self.name, "delays must be positive")
        super().__post_init__()

    @property
    def repeats(self) -> bool:
        return self.then is not None

    def delay(self, attempts: int) -> timedelta | None:
        if attempts <= len(self.delays):
            return self.delays[attempts - 1]
        return self.then


@dataclass(frozen=True, kw_only=True)
class ExponentialPolicy(Policy):
    """Wait ``first``, ``first * factor``, ``first * factor**2``, ... capped at ``max_delay``."""

    first: timedelta
    factor: float = 2.0
    max_delay: timedelta | None = None

    def __post_init__(self) -> None:
        if self.first <= timedelta(0):
            raise PolicyError(self.name, "first must be positive")
        if self.factor < 1:
            raise PolicyError(self.name, "factor must be at least 1")
        if self.max_delay is not None and self.max_delay < self.first:
            raise PolicyError(self.name, "max_delay must be at least first")
        super().__post_init__()

    @property
    def repeats(self) -> bool:
        return True

    def delay(self, attempts: int) -> timedelta | None:
        try:
            delay = self.first * self.factor ** (attempts - 1)
        except OverflowError:
            delay = timedelta.max
        return delay if self.max_delay is None else min(delay, self.max_delay)


SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)

PLATFORM_SMS = DelaysPolicy(
    name="platform-sms",
    then=10 * SECOND,
    give_up_after=48 * HOUR,
    pause_after=100,
    pause_for=10 * MINUTE,
)
PLATFORM_NUMINFO = DelaysPolicy(
    name="platform-numinfo",
    delays=tuple(n * MINUTE for n in (1, 5, 10, 20, 30, 60)),
    then=60 * MINUTE,
    give_up_after=48 * HOUR,
    answer_budget=2 * SECOND,
    success_codes=frozenset({200}),
)
PLATFORM_STATUS = DelaysPolicy(name="platform-status", delays=(30 * SECOND, 2 * MINUTE))
"""Two more attempts after a non-2xx, 3 in all; the delays can be configured."""
PLATFORM_APPA = ExponentialPolicy(
    name="platform-appa", first=MINUTE, factor=2, max_delay=6 * HOUR, give_up_after=14 * DAY
)
"""The platform documents "decreasing frequency for up to 14 days"; we choose 1 min doubling up to
6 h between attempts: 0, 1, 3, 7, 15, ... 511 min, then every 6 h until 14 days (64 attempts)."""
STANDARD = DelaysPolicy(
    name="standard",
    delays=(5 * SECOND, 5 * MINUTE, 30 * MINUTE, 2 * HOUR, 5 * HOUR, 10 * HOUR, 10 * HOUR),
)
"""Immediately, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h apart: 8 attempts in all."""

BUILTIN_POLICIES: Mapping[str, Policy] = MappingProxyType(
    {p.name: p for p in (PLATFORM_SMS, PLATFORM_NUMINFO, PLATFORM_STATUS, PLATFORM_APPA, STANDARD)}
)


# --- configuration: the [policies.NAME] tables ---------------------------------------------------


class _CustomConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    give_up_after: Duration | None = None
    max_attempts: StrictInt | None = Field(default=None, ge=1)
    jitter: float = Field(default=0.0, ge=0, lt=1)
    pause_after: StrictInt | None = Field(default=None, ge=1)
    pause_for: Duration | None = None

    def to_policy(self, name: str) -> Policy:
        raise NotImplementedError

    @model_validator(mode="after")
    def _builds(self) -> _CustomConfig:
        try:
            self.to_policy("custom")
        except PolicyError as error:
            raise ValueError(error.reason) from None
        return self


class DelaysConfig(_CustomConfig):
    """``type = "delays"``: ``delays = ["1s", "2s", "5s"]``, optionally ``then = "5s"``."""

    type: Literal["delays"]
    delays: list[Duration] = Field(default_factory=list)
    then: Duration | None = None

    def to_policy(self, name: str) -> DelaysPolicy:
        fields = self.model_dump(exclude={"type", "delays"})
        return DelaysPolicy(name=name, delays=tuple(self.delays), **fields)


class ExponentialConfig(_CustomConfig):
    """``type = "exponential"``: ``first``, ``factor``, ``max_delay``, ``give_up_after``, ..."""

    type: Literal["exponential"]
    first: Duration
    factor: float = Field(default=2.0, ge=1)
    max_delay: Duration | None = None

    def to_policy(self, name: str) -> ExponentialPolicy:
        return ExponentialPolicy(name=name, **self.model_dump(exclude={"type"}))


class PlatformStatusConfig(BaseModel):
    """``[policies.platform-status]`` with only ``delays = [...]``: the two delays to use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    delays: list[Duration] = Field(min_length=2, max_length=2)


def _config_tag(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return getattr(value, "type", "platform-status")
    if isinstance(value, Mapping):
        if "type" in value:
            return value["type"]
        return "platform-status" if set(value) <= {"delays"} else None
    return None


PolicyConfig = Annotated[
    Annotated[DelaysConfig, Tag("delays")]
    | Annotated[ExponentialConfig, Tag("exponential")]
    | Annotated[PlatformStatusConfig, Tag("platform-status")],
    Discriminator(
        _config_tag,
        custom_error_type="policy_type",
        custom_error_message='a policy needs type = "delays" or "exponential"',
    ),
]
"""One ``[policies.NAME]`` table (use :data:`PolicyConfigs` for the whole ``[policies]``)."""


def _name_problem(name: str, status_override: bool) -> str | None:
    if name == "platform-status" and not status_override:
        return "platform-status takes only delays = [...] (two delays; no jitter, no other keys)"
    if name.startswith("platform-") and name != "platform-status":
        return "the platform's documented schedules cannot be redefined"
    if status_override and name != "platform-status":
        return 'set type = "delays" or "exponential"'
    return None


def _check_names(value: Any) -> Any:
    if isinstance(value, Mapping):
        for name, table in value.items():
            bare = isinstance(table, PlatformStatusConfig) or (
                isinstance(table, Mapping) and set(table) <= {"delays"}
            )
            problem = _name_problem(name, bare)
            if problem:
                raise ValueError(f"policy {name!r}: {problem}")
    return value


PolicyConfigs = Annotated[dict[str, PolicyConfig], BeforeValidator(_check_names)]
"""The ``[policies]`` table: a settings field type that also checks the names."""


def resolve_policies(configs: Mapping[str, PolicyConfig]) -> Mapping[str, Policy]:
    """The built-in policies plus the configured ones (``platform-status`` may get new delays).

    A custom policy may redefine ``standard`` but no ``platform-*`` name: ValueError.
    """
    policies = dict(BUILTIN_POLICIES)
    for name, config in configs.items():
        status_override = isinstance(config, PlatformStatusConfig)
        problem = _name_problem(name, status_override)
        if problem:
            raise ValueError(f"policy {name!r}: {problem}")
        if isinstance(config, PlatformStatusConfig):
            policies[name] = replace(PLATFORM_STATUS, delays=tuple(config.delays))
        else:
            policies[name] = config.to_policy(name)
    return MappingProxyType(policies)


# --- Retry-After bounds (the header is parsed in relay.destinations) and walking a schedule ---


def retry_after_bounded(
    next_time: datetime,
    now: datetime,
    retry_after: timedelta | None,
    max_retry_after: timedelta = timedelta(hours=1),
) -> datetime:
    """The next attempt time honouring a 429/503 Retry-After within bounds.

    Never earlier than the policy's ``next_time``; the Retry-After counts up to ``now +
    max_retry_after``. (The caller has already given up if the policy said None.)
    """
    if retry_after is None:
        return next_time
    return max(next_time, now + min(retry_after, max_retry_after))


def attempt_times(
    policy: Policy,
    start: datetime,
    *,
    succeed_at: int | None = None,
    breaker: bool = True,
    rng: random.Random | None = None,
) -> Iterator[datetime]:
    """Each attempt time of one delivery, from ``start``, until it succeeds or is given up.

    Every attempt fails instantly, except attempt number ``succeed_at`` (1-based) if given. With
    ``breaker``, the policy's own pause applies, as for a destination that only this delivery uses.
    """
    health = DestinationHealth()
    deadline = policy.deadline(start)
    when, attempts = start, 0
    while True:
        if breaker:
            when = hold_until(health, when) or when
        if deadline is not None and when > deadline:
            return
        yield when
        attempts += 1
        if attempts == succeed_at:
            return
        if breaker:
            health = after_failure(health, policy, when)
        next_time = policy.next_attempt(attempts, start, when, rng)
        if next_time is None:
            return
        when = next_time
