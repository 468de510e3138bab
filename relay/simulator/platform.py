"""The platform as a sender: one callback, its retries on the documented schedule, its idea of
success, its breaker, and the duplicates it may produce. The schedules are the relay's own
policy code (:mod:`relay.delivery.policies`, :mod:`relay.delivery.breaker`), not a copy."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

import httpx

from receivers.kinds import KINDS_BY_NAME
from relay.delivery.breaker import DestinationHealth, after_failure, after_success, hold_until
from relay.delivery.policies import BUILTIN_POLICIES, Policy
from relay.simulator.clocks import Clock
from relay.simulator.scenarios import Callback
from relay.simulator.senders import HttpxSender, NoAnswer, Sender, SendFailed
from relay.simulator.wire import Credentials, Endpoint, Prepared, attempt_headers, prepare

DEFAULT_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Attempt:
    """One request the platform made."""

    event: str
    kind: str
    label: str
    number: int
    scheduled_at: datetime
    sent_at: datetime
    status_code: int | None
    error: str | None
    latency_ms: float
    duplicate: bool = False
    next_attempt_at: datetime | None = None
    """After a failed attempt: when the platform means to try again (the schedule's next time,
    or the end of the sending pause it is in then); None: it gives up, or the attempt passed."""


@dataclass
class CallbackResult:
    """Everything that happened to one callback."""

    callback: Callback
    attempts: list[Attempt] = field(default_factory=list)
    given_up: bool = False

    @property
    def answers(self) -> list[int | None]:
        """The status code of every attempt (None: no answer)."""
        return [a.status_code for a in self.attempts]

    @property
    def delivered(self) -> bool:
        """Whether the platform considered it delivered."""
        return not self.given_up


class Platform:
    """Sends callbacks to one receiver like the platform does."""

    def __init__(
        self,
        client: httpx.AsyncClient | Sender,
        endpoint: Endpoint,
        *,
        clock: Clock,
        credentials: Credentials | None = None,
        method: str = "POST",
        retry: bool = True,
        duplicate_rate: float = 0.0,
        policies: Mapping[str, Policy] = BUILTIN_POLICIES,
        rng: random.Random | None = None,
        on_failure: Callable[[Attempt], object] | None = None,
    ) -> None:
        if not 0 <= duplicate_rate <= 1:
            raise ValueError("duplicate_rate is a probability between 0 and 1")
        self.sender: Sender = (
            HttpxSender(client, endpoint.basic_auth)
            if isinstance(client, httpx.AsyncClient)
            else client
        )
        """Puts each attempt on the wire (an httpx client is wrapped in :class:`HttpxSender`)."""
        self.endpoint = endpoint
        self.clock = clock
        self.credentials = credentials or Credentials()
        self.method = method
        self.retry = retry
        self.duplicate_rate = duplicate_rate
        self.policies = policies
        self.rng = rng or random.Random()
        self.health = DestinationHealth()
        """The platform's breaker state for this receiver (shared by every callback)."""
        self.on_failure = on_failure
        """Told of every failed attempt as it happens (e.g. to print it)."""

    def policy_for(self, callback: Callback) -> Policy:
        """The platform's retry policy for a callback (by kind, and channel for inbound)."""
        return self.policies[KINDS_BY_NAME[callback.kind].policy_for(callback.body)]

    async def deliver(self, callback: Callback) -> CallbackResult:
        """Send until the receiver accepts it or the policy gives up."""
        method = self.method if callback.kind in ("sms.inbound", "sms.dlr") else "POST"
        prepared = prepare(callback, self.endpoint, method)
        policy = self.policy_for(callback)
        result = CallbackResult(callback)
        scheduled = self.clock.now()
        first: datetime | None = None
        while True:
            await self.clock.sleep_until(scheduled)
            held = hold_until(self.health, self.clock.now())
            deadline = policy.deadline(first) if first else None
            if held is not None:
                if deadline is not None and held > deadline:
                    result.given_up = True
                    return result
                scheduled = held  # the breaker: waiting, not failing
                continue
            attempt = await self._send(
                prepared, callback, policy, len(result.attempts) + 1, scheduled
            )
            first = first or attempt.sent_at
            if policy.accepts(attempt.status_code, attempt.latency_ms):
                result.attempts.append(attempt)
                self.health = after_success(self.health)
                break
            now = self.clock.now()
            self.health = after_failure(self.health, policy, now)
            next_at = policy.next_attempt(attempt.number, first, now) if self.retry else None
            expected = None if next_at is None else hold_until(self.health, next_at) or next_at
            self._failed(result, replace(attempt, next_attempt_at=expected))
            if next_at is None:
                result.given_up = True
                return result
            scheduled = next_at
        if self.duplicate_rate and self.rng.random() < self.duplicate_rate:
            duplicate = await self._send(
                prepared,
                callback,
                policy,
                len(result.attempts) + 1,
                self.clock.now(),
                duplicate=True,
            )
            if policy.accepts(duplicate.status_code, duplicate.latency_ms):
                result.attempts.append(duplicate)
            else:
                self._failed(result, duplicate)
        return result

    def _failed(self, result: CallbackResult, attempt: Attempt) -> None:
        result.attempts.append(attempt)
        if self.on_failure is not None:
            self.on_failure(attempt)

    async def _send(
        self,
        prepared: Prepared,
        callback: Callback,
        policy: Policy,
        number: int,
        scheduled: datetime,
        *,
        duplicate: bool = False,
    ) -> Attempt:
        budget = policy.answer_budget.total_seconds() if policy.answer_budget else None
        sent = self.clock.now()
        headers = attempt_headers(prepared, self.credentials, sent.timestamp())
        started = time.perf_counter()
        status: int | None = None
        error: str | None = None
        timeout = budget or DEFAULT_TIMEOUT_SECONDS
        try:
            status = await self.sender.send(prepared, headers, timeout)
        except NoAnswer:
            error = f"no answer within {timeout:g} s"
        except SendFailed as exc:
            error = str(exc)
        latency = (time.perf_counter() - started) * 1000
        return Attempt(
            event=_event_id(callback),
            kind=callback.kind,
            label=callback.label,
            number=number,
            scheduled_at=scheduled,
            sent_at=sent,
            status_code=status,
            error=error,
            latency_ms=latency,
            duplicate=duplicate,
        )


def _event_id(callback: Callback) -> str:
    body = callback.body
    for key in ("requestId", "messageId", "callId", "msgid"):
        if body.get(key):
            return f"{body[key]}:{callback.label}"
    return callback.label
