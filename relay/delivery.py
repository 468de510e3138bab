"""One attempt of one delivery: claim it, ask the destination, record what happened, decide next.

The decision is pure policy (:mod:`relay.policies`) plus the destination's health
(:mod:`relay.breaker`); this module only sequences it around the I/O.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.breaker import DestinationHealth, after_failure, after_gone, after_success, hold_until
from relay.destinations import Destination, Outbound, Outcome
from relay.outbox import AttemptResult, Claim, Due
from relay.policies import Policy, retry_after_bounded
from relay.tables import DEAD, HELD, PENDING, SUCCEEDED

log = logging.getLogger(__name__)

FALLBACK_POLICY = "standard"


@dataclass(frozen=True)
class Target:
    """A configured destination: the sender and its timeout."""

    destination: Destination
    timeout: timedelta


def attempt_lease(timeouts: Iterable[timedelta], margin: timedelta) -> timedelta:
    """How long a claimed delivery stays leased: the longest timeout plus a margin."""
    return max(timeouts, default=timedelta(0)) + margin


class Deliverer:
    """Attempts deliveries; shared by every job of one worker. ``lease`` must outlast any
    attempt (the longest destination timeout plus a margin): see :func:`attempt_lease`."""

    def __init__(
        self,
        engine: AsyncEngine,
        targets: Mapping[str, Target],
        policies: Mapping[str, Policy],
        *,
        clock: Callable[[], datetime],
        lease: timedelta,
        rng: random.Random | None = None,
    ) -> None:
        self._engine = engine
        self._targets = targets
        self._policies = policies
        self._clock = clock
        self._rng = rng or random.Random()
        self._lease = lease

    async def attempt(self, delivery_id: str) -> Due | None:
        """Attempt the delivery if it is due and free; returns its next job, if it needs one."""
        claimed = await outbox.claim(self._engine, delivery_id, self._clock(), self._lease)
        if claimed is None:
            return None
        now = self._clock()
        delivery = claimed.delivery
        target = self._targets.get(delivery.destination)
        if target is None:
            await outbox.release(
                self._engine,
                claimed,
                status=HELD,
                next_attempt_at=None,
                error=f"destination {delivery.destination!r} is not configured",
            )
            return None
        health = _health(claimed.health)
        if health.disabled:
            await outbox.release(
                self._engine,
                claimed,
                status=HELD,
                next_attempt_at=None,
                error="destination disabled after 410 Gone; `relay destinations enable` resumes",
            )
            return None
        wait = hold_until(health, now)
        if wait is not None:
            if await outbox.release(self._engine, claimed, status=PENDING, next_attempt_at=wait):
                return Due(delivery.id, delivery.attempts, wait)
            return None
        policy = self._policies.get(delivery.policy) or self._policies[FALLBACK_POLICY]
        outcome = await self._send(claimed, target, policy)
        return await self._record(claimed, policy, outcome)

    async def _send(
        self, claimed: Claim, target: Target, policy: Policy
    ) -> tuple[datetime, Outcome]:
        timeout = target.timeout
        if policy.answer_budget is not None:
            timeout = min(timeout, policy.answer_budget)
        started = self._clock()
        outcome = await target.destination.deliver(
            _outbound(claimed), timeout=timeout.total_seconds()
        )
        return started, outcome

    async def _record(
        self, claimed: Claim, policy: Policy, sent: tuple[datetime, Outcome]
    ) -> Due | None:
        started, outcome = sent
        delivery = claimed.delivery
        finished = max(self._clock(), started)
        change: Callable[[DestinationHealth], DestinationHealth] | None
        next_at: datetime | None = None
        if outcome.ok:
            status = SUCCEEDED
            change = after_success if claimed.health and _unhealthy(claimed.health) else None
        elif outcome.gone:
            status, change = HELD, after_gone
        else:
            schedule_attempts = delivery.attempts + 1 - delivery.schedule_base
            first = delivery.first_attempt_at or started
            next_at = policy.next_attempt(schedule_attempts, first, finished, self._rng)
            if next_at is not None and outcome.retry_after is not None:
                next_at = retry_after_bounded(next_at, finished, outcome.retry_after)
                deadline = policy.deadline(first)
                if deadline is not None and next_at > deadline:
                    next_at = None
            status = PENDING if next_at is not None else DEAD

            def change(health: DestinationHealth) -> DestinationHealth:
                return after_failure(health, policy, finished)

        result = AttemptResult(
            started_at=started,
            duration_ms=outcome.duration_ms,
            status_code=outcome.status_code,
            error=outcome.error,
            response_excerpt=outcome.response_excerpt,
        )
        recorded = await outbox.record_attempt(
            self._engine,
            claimed,
            result,
            status=status,
            next_attempt_at=next_at,
            health_change=_on_rows(change) if change else None,
        )
        if not recorded:
            log.warning("lease of delivery %s expired during its attempt", delivery.id)
            return None
        if status == DEAD:
            log.warning(
                "delivery %s to %s is dead after %d attempts",
                delivery.id,
                delivery.destination,
                delivery.attempts + 1,
            )
        return Due(delivery.id, delivery.attempts + 1, next_at) if next_at else None


def _outbound(claimed: Claim) -> Outbound:
    event = claimed.event
    return Outbound(
        event_id=event.id,
        kind=event.kind,
        source=event.source,
        received_at=event.received_at,
        payload=event.payload,
        raw_body=event.raw_body,
        content_type=event.content_type,
        method=event.method,
        attempt=claimed.delivery.attempts + 1,
    )


def _health(row: Any) -> DestinationHealth:
    if row is None:
        return DestinationHealth()
    return DestinationHealth(row.consecutive_failures, row.paused_until, row.disabled)


def _unhealthy(row: Any) -> bool:
    return bool(row.consecutive_failures or row.paused_until or row.disabled)


def _on_rows(
    change: Callable[[DestinationHealth], DestinationHealth],
) -> outbox.HealthChange:
    def apply(row: Mapping[str, Any]) -> Mapping[str, Any]:
        current = DestinationHealth(
            row["consecutive_failures"], row["paused_until"], row["disabled"]
        )
        new = change(current)
        reason = "410 Gone" if new.disabled and not current.disabled else row.get("disabled_reason")
        return {
            "consecutive_failures": new.consecutive_failures,
            "paused_until": new.paused_until,
            "disabled": new.disabled,
            "disabled_reason": reason if new.disabled else None,
        }

    return apply
