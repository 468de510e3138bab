"""The sandbox's memory: what the app sent (messages, lookups, calls) and every callback the
sandbox made about them, each attempt with the receiver's answer and duration.

Records are plain dataclasses; :class:`State` holds them for one sandbox and tells waiters
(the control API's long-poll) that something changed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

FINISHED = frozenset({"delivered", "given-up", "cancelled"})
"""Callback states after which nothing more happens."""
ANSWER_EXCERPT = 500
"""How much of a receiver's answer body an attempt keeps (characters)."""
CONVERSIONS_KEPT = 100
"""Conversions kept per message: the latest."""
ATTEMPTS_LISTED = 100
"""Attempts of one callback in the control API's answers: the first and the latest 99 (a
callback failing for 48 h on the platform-sms schedule has 17,000)."""


@dataclass
class CallbackAttempt:
    """One request the sandbox made to a callback URL."""

    number: int
    scheduled_at: datetime
    sent_at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float
    answer: str = ""
    """The start of the receiver's answer body (at most :data:`ANSWER_EXCERPT` characters)."""
    duplicate: bool = False
    resent: bool = False
    """Sent on request (control API), not by the schedule."""


@dataclass
class Callback:
    """One callback the sandbox owes the app: where, how, what, on which schedule.

    Product-neutral: an SMS delivery report, a number lookup result, a call event or an
    inbound SMS are all a URL, a method, a body (JSON, or query parameters for GET) and the
    name of the platform's retry policy.
    """

    id: str
    subject: str
    """The record it is about (a message's requestId, a call's callId, ...): one subject's
    callbacks are sent one after the other, in order."""
    kind: str
    label: str
    url: str
    method: str
    body: dict[str, Any]
    policy: str
    due_at: datetime
    state: str = "scheduled"
    """scheduled, sending, delivered, given-up or cancelled."""
    attempts: list[CallbackAttempt] = field(default_factory=list)
    next_attempt_at: datetime | None = None
    duplicate: bool = False
    """Chaos: once accepted, sent a second time (as the platform may)."""

    def as_json(self, limit: int = ATTEMPTS_LISTED) -> dict[str, Any]:
        """The callback for the control API: at most ``limit`` attempts, the first and the
        latest, with ``attemptCount`` (all of them) and ``attemptsOmitted`` (left out)."""
        shown = listed_attempts(self.attempts, limit)
        return {
            "id": self.id,
            "subject": self.subject,
            "kind": self.kind,
            "label": self.label,
            "url": self.url,
            "method": self.method,
            "body": self.body,
            "policy": self.policy,
            "dueAt": iso(self.due_at),
            "state": self.state,
            "nextAttemptAt": iso(self.next_attempt_at),
            "duplicate": self.duplicate,
            "attempts": [
                {
                    "number": a.number,
                    "scheduledAt": iso(a.scheduled_at),
                    "sentAt": iso(a.sent_at),
                    "statusCode": a.status_code,
                    "error": a.error,
                    "durationMs": round(a.duration_ms, 3),
                    "answer": a.answer,
                    "duplicate": a.duplicate,
                    "resent": a.resent,
                }
                for a in shown
            ],
            "attemptCount": len(self.attempts),
            "attemptsOmitted": len(self.attempts) - len(shown),
        }


def listed_attempts(attempts: list[CallbackAttempt], limit: int) -> list[CallbackAttempt]:
    """At most ``limit`` (at least 2) of ``attempts``: the first and the latest."""
    if len(attempts) <= limit:
        return attempts
    return [attempts[0], *attempts[len(attempts) - (limit - 1) :]]


@dataclass
class Message:
    """One SMS the app sent, and where its delivery stands."""

    request_id: str
    to: str
    sender: str
    text: str
    encoding: str
    parts: list[str]
    submitted_at: datetime
    send_at: datetime
    expires_at: datetime | None
    reference: str | None = None
    callback_url: str | None = None
    callback_method: str = "POST"
    status: str = "ACCEPTED"
    done_at: datetime | None = None
    error_code: str | None = None
    error_reason: str | None = None
    outcome: str = "delivered"
    """The magic number's outcome that drives this message."""
    chaos: frozenset[str] = frozenset()
    history: list[tuple[str, datetime]] = field(default_factory=list)
    conversions: list[dict[str, Any]] = field(default_factory=list)
    """The latest :data:`CONVERSIONS_KEPT` conversions reported (an app may report without end)."""
    conversion_count: int = 0
    """All conversions reported, kept or not."""
    callbacks: list[str] = field(default_factory=list)
    """Ids of this message's callbacks, in the order they were scheduled."""
    part_ids: list[str] = field(default_factory=list)
    held: list[Callback] = field(default_factory=list)
    """Chaos out-of-order: reports kept back until the final one has gone."""


@dataclass
class State:
    """Everything one sandbox remembers; :meth:`changed` wakes whoever waits for news."""

    messages: dict[str, Message] = field(default_factory=dict)
    lookups: dict[str, Any] = field(default_factory=dict)
    calls: dict[str, Any] = field(default_factory=dict)
    inbound: dict[str, Any] = field(default_factory=dict)
    """Inbound SMS sent on request (control API, page), by requestId."""
    callbacks: dict[str, Callback] = field(default_factory=dict)
    _news: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def changed(self) -> None:
        """Something was added or moved on: wake the waiters."""
        self._news.set()
        self._news = asyncio.Event()

    async def wait_for_change(self, timeout: float) -> bool:
        """Wait until :meth:`changed` is called or ``timeout`` seconds pass; whether it was."""
        news = self._news
        try:
            await asyncio.wait_for(news.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def clear(self) -> None:
        """Forget everything (the control API's reset)."""
        self.messages.clear()
        self.lookups.clear()
        self.calls.clear()
        self.inbound.clear()
        self.callbacks.clear()
        self.changed()

    def forget_finished(self, keep: int) -> bool:
        """Forget the oldest finished messages (final state, callbacks all done) and their
        callbacks until fewer than ``keep`` remain; whether there is room now."""
        if len(self.messages) < keep:
            return True
        for request_id, message in list(self.messages.items()):
            if len(self.messages) < keep:
                break
            callbacks = [self.callbacks.get(c) for c in message.callbacks]
            done = all(c is None or c.state in FINISHED for c in callbacks)
            if message.done_at is not None and done and not message.held:
                del self.messages[request_id]
                for callback_id in message.callbacks:
                    self.callbacks.pop(callback_id, None)
        return len(self.messages) < keep

    def callbacks_of(self, subject: str) -> list[Callback]:
        """The callbacks about one record, in the order they were scheduled."""
        return [c for c in self.callbacks.values() if c.subject == subject]


def iso(moment: datetime | None) -> str | None:
    """A time as the platform writes it: ISO 8601, milliseconds, Z for UTC."""
    if moment is None:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
