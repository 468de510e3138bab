"""A destination's health: consecutive failures, a breaker pause, and 410 Gone.

Pure values and transitions, applied on top of a delivery's policy. The pause parameters ride with
the policy of the delivery whose attempt failed (``Policy.pause_after`` / ``Policy.pause_for``):
for ``platform-sms``, after every 100 consecutive failures the destination gets no attempts for
10 minutes. A delivery that comes due meanwhile is *held* until the pause ends
(:func:`hold_until`); it is not attempted, so it is not counted as failed.

Only failures that say the destination is down count (:func:`after_outcome`, reading
``Outcome.down``): no connection, a timeout, an answer of overload or unavailability. A failure
of one message alone (a 500 or a 4xx answered to it while others succeed, a broker refusing
that message) neither counts nor resets the count: it follows the message's own schedule.
Otherwise whoever can make the consumer refuse their messages (an SMS whose text it chokes on)
could pause the destination for everyone's messages, again and again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Protocol


class PauseRule(Protocol):
    """The part of a policy the breaker reads (:class:`relay.delivery.policies.Policy` has it)."""

    @property
    def pause_after(self) -> int | None: ...

    @property
    def pause_for(self) -> timedelta | None: ...


class Judged(Protocol):
    """What the breaker reads of an attempt's outcome (:class:`relay.destinations.Outcome`)."""

    @property
    def ok(self) -> bool: ...

    @property
    def gone(self) -> bool: ...

    @property
    def down(self) -> bool: ...


@dataclass(frozen=True)
class DestinationHealth:
    """What the relay knows about one destination."""

    consecutive_failures: int = 0
    paused_until: datetime | None = None
    disabled: bool = False


def after_success(health: DestinationHealth) -> DestinationHealth:
    """A delivery succeeded: the failure count restarts and any pause ends."""
    return replace(health, consecutive_failures=0, paused_until=None)


def after_failure(health: DestinationHealth, policy: PauseRule, now: datetime) -> DestinationHealth:
    """An attempt failed at ``now`` in a way that says the destination is down: count it;
    every ``pause_after``-th such failure pauses."""
    failures = health.consecutive_failures + 1
    paused_until = health.paused_until
    if policy.pause_after and policy.pause_for and failures % policy.pause_after == 0:
        paused_until = now + policy.pause_for
    return replace(health, consecutive_failures=failures, paused_until=paused_until)


def after_outcome(
    health: DestinationHealth, outcome: Judged, policy: PauseRule, now: datetime
) -> DestinationHealth:
    """The health after an attempt that ended at ``now``: a success resets it, a 410 disables
    the destination, a failure that says the destination is down counts (and may pause it). A
    failure of this message alone changes nothing: it does not count (one sender must not
    pause everyone's deliveries) and does not reset (a destination that refuses one message
    may still be down for the others: the count of its downs goes on)."""
    if outcome.ok:
        return after_success(health)
    if outcome.gone:
        return after_gone(health)
    if outcome.down:
        return after_failure(health, policy, now)
    return health


def after_gone(health: DestinationHealth) -> DestinationHealth:
    """The destination answered 410 Gone: disabled until an operator enables it."""
    return replace(health, disabled=True)


def enabled(health: DestinationHealth) -> DestinationHealth:
    """An operator enabled the destination again: a fresh start (no failures, no pause)."""
    return DestinationHealth()


def hold_until(health: DestinationHealth, now: datetime) -> datetime | None:
    """When a delivery due at ``now`` may be attempted, if it must wait for a pause; else None.

    Holding is not failing: the caller re-schedules the delivery without counting an attempt.
    ``health.disabled`` is not reflected here; the caller checks it separately.
    """
    if health.paused_until is not None and health.paused_until > now:
        return health.paused_until
    return None


class BreakerState(IntEnum):
    """A destination's state as a number (the ``relay_destination_breaker_state`` gauge)."""

    CLOSED = 0
    """Attempts are made."""
    PAUSED = 1
    """The breaker is open: no attempts until ``paused_until``."""
    DISABLED = 2
    """A 410 Gone switched the destination off until an operator enables it."""


def breaker_state(health: DestinationHealth, now: datetime) -> BreakerState:
    """What the destination's health means at ``now``; disabled wins over a pause."""
    if health.disabled:
        return BreakerState.DISABLED
    if health.paused_until is not None and health.paused_until > now:
        return BreakerState.PAUSED
    return BreakerState.CLOSED
