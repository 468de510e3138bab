"""The SMS state machine: ACCEPTED, then BUFFERED, then DELIVERED, UNDELIVERABLE or EXPIRED (or
ACCEPTED then REJECTED), at realistic delays on the sandbox's clock, driven by the magic
numbers; a delivery report to callbackUrl at every step.

A message whose final state would come after its validity ends is EXPIRED at that moment.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from receivers.kinds import KINDS_BY_NAME
from receivers.problems import Problem
from relay.sandbox import numbers
from relay.sandbox.callbacks import Action
from relay.sandbox.inbound import inbound_message
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.sms_request import SmsRequest
from relay.sandbox.state import Callback, Message, iso

SECOND = timedelta(seconds=1)
TO_BUFFERED = 1 * SECOND
"""From the send time to BUFFERED (or to REJECTED)."""
TO_DELIVERED = 3 * SECOND
TO_FAILED = 5 * SECOND
TO_DELIVERED_LATE = timedelta(hours=2)
REPLY_AFTER = 30 * SECOND
REPLY_TEXT = "Thanks, got it!"
PART_PRICE = "0.0450"
CURRENCY = "EUR"
FINAL = frozenset({"DELIVERED", "UNDELIVERABLE", "REJECTED", "EXPIRED"})
ERRORS = {"EXPIRED": ("003", "Validity period expired")}


def send_sms(sandbox: Sandbox, request: SmsRequest, chaos: frozenset[str]) -> Message:
    """Accept an SMS: record it, send its ACCEPTED report and plan the rest of its life."""
    if not sandbox.state.forget_finished(sandbox.settings.max_messages):
        raise Problem(
            503,
            "sandbox-full",
            "Service Unavailable",
            f"The sandbox holds {len(sandbox.state.messages)} messages still under way "
            "(max_messages); wait, or reset it (POST /_sandbox/reset).",
            headers={"Retry-After": "1"},
        )
    now = sandbox.clock.now()
    send_at = request.send_at or now
    row = numbers.sms_outcome(request.to)
    message = Message(
        request_id=str(uuid.uuid4()),
        to=request.to,
        sender=request.sender,
        text=request.text,
        encoding=request.segmented.encoding,
        parts=list(request.segmented.parts),
        submitted_at=now,
        send_at=send_at,
        expires_at=send_at + (request.validity or sandbox.settings.validity),
        reference=request.reference,
        callback_url=request.callback_url,
        callback_method=request.callback_method,
        outcome=row.outcome,
        chaos=chaos,
        part_ids=[str(uuid.uuid4()) for _ in request.segmented.parts],
    )
    sandbox.state.messages[message.request_id] = message
    _move(sandbox, message, "ACCEPTED", now)
    for when, status in plan(row, send_at, message.expires_at):
        sandbox.scheduler.at(when, _mover(sandbox, message, status))
    return message


def plan(
    row: numbers.MagicNumber, send_at: datetime, expires_at: datetime | None
) -> list[tuple[datetime, str]]:
    """The states after ACCEPTED and when they are reached."""
    outcome = row.outcome
    if outcome == numbers.REJECTED:
        return [(send_at + TO_BUFFERED, "REJECTED")]
    steps = [(send_at + TO_BUFFERED, "BUFFERED")]
    if outcome == numbers.EXPIRED:
        final = (expires_at or send_at + TO_FAILED, "EXPIRED")
    elif outcome == numbers.UNDELIVERABLE:
        final = (send_at + TO_FAILED, "UNDELIVERABLE")
    elif outcome == numbers.DELIVERED_LATE:
        final = (send_at + TO_DELIVERED_LATE, "DELIVERED")
    else:
        final = (send_at + TO_DELIVERED, "DELIVERED")
    if expires_at is not None and final[0] > expires_at:
        final = (expires_at, "EXPIRED")
    return [*steps, final]


def _mover(sandbox: Sandbox, message: Message, status: str) -> Action:
    async def move() -> None:
        if sandbox.state.messages.get(message.request_id) is message:  # not reset meanwhile
            _move(sandbox, message, status)

    return move


def _move(sandbox: Sandbox, message: Message, status: str, now: datetime | None = None) -> None:
    now = now or sandbox.clock.now()
    message.status = status
    message.history.append((status, now))
    if status in FINAL:
        message.done_at = now
        row = numbers.sms_outcome(message.to)
        code, reason = ERRORS.get(status, (row.error_code, row.error_reason))
        if status != "DELIVERED":
            message.error_code, message.error_reason = code, reason
    if message.callback_url:
        _report(sandbox, message, status in FINAL)
    if status == "DELIVERED" and message.outcome == numbers.DELIVERED_THEN_REPLY:
        sandbox.scheduler.at(now + REPLY_AFTER, _replier(sandbox, message))
    sandbox.state.changed()


def _report(sandbox: Sandbox, message: Message, final: bool) -> None:
    body = report(message, sandbox.base_url)
    delay = sandbox.settings.chaos.slow_delay if "slow" in message.chaos else timedelta(0)
    callback = Callback(
        id=str(uuid.uuid4()),
        subject=message.request_id,
        kind="sms.dlr",
        label=str(body["status"]),
        url=str(message.callback_url),
        method=message.callback_method,
        body=body,
        policy=KINDS_BY_NAME["sms.dlr"].policy_for(body),
        due_at=sandbox.clock.now() + delay,
        duplicate="duplicate" in message.chaos,
    )
    if "out-of-order" in message.chaos and not final:
        message.held.append(callback)
        return
    for each in (callback, *message.held):
        message.callbacks.append(each.id)
        sandbox.scheduler.schedule(each)
    message.held.clear()


def _replier(sandbox: Sandbox, message: Message) -> Action:
    async def reply() -> None:
        url = sandbox.settings.inbound_url
        if url is None or sandbox.state.messages.get(message.request_id) is not message:
            return
        body = inbound_message(message.to, message.sender, REPLY_TEXT, sandbox.clock.now())
        callback = sandbox.scheduler.schedule(
            Callback(
                id=str(uuid.uuid4()),
                subject=str(body["requestId"]),
                kind="sms.inbound",
                label="inbound",
                url=url,
                method="POST",
                body=body,
                policy=KINDS_BY_NAME["sms.inbound"].policy_for(body),
                due_at=sandbox.clock.now(),
            )
        )
        message.callbacks.append(callback.id)

    return reply


def report(message: Message, base_url: str) -> dict[str, Any]:
    """The message in the RestMessageResponse shape: the API's answer and a delivery report."""
    charged = message.status != "REJECTED"
    price = PART_PRICE if charged else "0.0000"
    effective = iso(message.submitted_at.replace(day=1, hour=0, minute=0, second=0, microsecond=0))
    done = iso(message.done_at)
    body: dict[str, Any] = {
        "requestId": message.request_id,
        "from": message.sender,
        "to": message.to,
        "href": f"{base_url}/messaging/v1/messages/{message.request_id}",
        "reference": message.reference,
        "size": len(message.parts),
        "status": message.status,
        "submitDate": iso(message.submitted_at),
        "doneDate": done,
        "errorCode": message.error_code,
        "errorReason": message.error_reason,
        "overallPrice": f"{float(price) * len(message.parts):.4f}",
        "priceEffective": effective,
        "parts": [
            _present(
                {
                    "partId": part_id,
                    "deliveryState": message.status,
                    "doneDate": done,
                    "errorCode": message.error_code,
                    "statusText": message.error_reason,
                    "price": price,
                    "currency": CURRENCY,
                    "priceEffective": effective,
                }
            )
            for part_id in message.part_ids
        ],
    }
    return _present(body)


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields that have a value (the platform leaves the others out)."""
    return {k: v for k, v in fields.items() if v is not None}
