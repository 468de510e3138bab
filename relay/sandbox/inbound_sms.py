"""Inbound SMS sent on request (``POST /_sandbox/inbound``, the page's form): checked field by
field, recorded, and sent to the inbound URL on the platform's ``platform-sms`` schedule.

A text is cut into concatenated parts as the platform's limits say (GSM-7 152 characters a
part, UCS-2 66, a single message up to 160 or 70), or into ``parts`` parts of near-equal
length. ``missing`` part numbers never arrive: the platform waits 10 minutes for them, then
sends the text with ``<...>`` in their place and ``missingParts: true``.
"""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from receivers.kinds import KINDS_BY_NAME
from receivers.problems import Problem
from relay.sandbox.inbound import inbound_message
from relay.sandbox.room import make_room
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.segments import segment
from relay.sandbox.settings import INTERNATIONAL
from relay.sandbox.sms_request import MAX_TEXT, invalid
from relay.sandbox.state import Callback, iso

DEFAULT_SENDER = "+99955512345"
"""The ``from`` of an inbound SMS sent without one (made up: +999 is no country's code)."""
FIELDS = ("from", "to", "message", "parts", "missing")
FORM_FIELDS = ("from", "to", "message")
"""The page's form: no parts."""
MAX_PARTS = 255
"""A concatenated SMS has at most 255 parts (the concatenation header counts them in a byte)."""
CONCATENATION_WAIT = timedelta(minutes=10)
"""How long the platform waits for the missing parts of a concatenated message (the seed)."""
ALLOWED_CONTROLS = frozenset("\n\r\t")


@dataclass(frozen=True)
class InboundRequest:
    """A checked request for an inbound SMS."""

    sender: str
    to: str
    parts: tuple[str, ...]
    missing: frozenset[int]


@dataclass
class InboundSms:
    """One inbound SMS sent on request, and its callback."""

    request_id: str
    sender: str
    to: str
    text: str
    size: int
    missing: list[int]
    submitted_at: datetime
    body: dict[str, Any]
    callbacks: list[str] = field(default_factory=list)


def no_inbound_url() -> Problem:
    """The 409 problem when the sandbox has nowhere to send an inbound SMS."""
    return Problem(
        409,
        "no-inbound-url",
        "Conflict",
        "The sandbox has no inbound URL: start it with --inbound-url URL (or set inbound_url "
        "in its --config file).",
    )


def parse_inbound(
    fields: Mapping[str, Any], provisioned: str, names: tuple[str, ...] = FIELDS
) -> InboundRequest:
    """Check a request's fields (of ``names``); raise the 400 :class:`Problem` of the first
    bad one."""
    unknown = sorted(name for name in fields if name not in names)
    if unknown:
        name = unknown[0][:40]
        raise invalid(name, f"is not a field (the fields: {', '.join(names)})")
    sender = _number(fields, "from") or DEFAULT_SENDER
    to = _number(fields, "to") or provisioned
    text = _message(fields)
    parts: tuple[str, ...] | list[str] = segment(text).parts
    needed = len(parts)
    count = _whole(fields.get("parts"), "parts")
    if count is None:
        pass
    elif not needed <= count <= min(len(text), MAX_PARTS):
        raise invalid(
            "parts",
            f"must be from {needed} (what the text needs) to {min(len(text), MAX_PARTS)} "
            "(one character a part, at most 255)",
        )
    else:
        parts = _cut(text, count)
    return InboundRequest(sender, to, tuple(parts), _missing(fields.get("missing"), len(parts)))


def _number(fields: Mapping[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid(name, "must be a string")
    if not INTERNATIONAL.fullmatch(value):
        raise invalid(name, "must be a number in international format (+ and 7 to 15 digits)")
    return value


def _message(fields: Mapping[str, Any]) -> str:
    value = fields.get("message")
    if value is None or value == "":
        raise invalid("message", "is required")
    if not isinstance(value, str):
        raise invalid("message", "must be a string")
    if len(value) > MAX_TEXT:
        raise invalid("message", f"has more than {MAX_TEXT} characters")
    if any(unicodedata.category(c) in ("Cc", "Cs") and c not in ALLOWED_CONTROLS for c in value):
        raise invalid("message", "holds a control character (only tab and line breaks are text)")
    return value


def _whole(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, "must be a whole number")
    return value


def _missing(value: Any, size: int) -> frozenset[int]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or len(value) > MAX_PARTS:
        raise invalid("missing", "must be a list of part numbers")
    numbers = [_whole(n, "missing") for n in value]
    if any(n is None or not 1 <= n <= size for n in numbers):
        raise invalid("missing", f"holds a part number that is not 1 to {size}")
    if len(set(numbers)) != len(numbers):
        raise invalid("missing", "names a part more than once")
    if len(numbers) == size:
        raise invalid("missing", "names every part: at least one must arrive")
    return frozenset(n for n in numbers if n is not None)


def _cut(text: str, count: int) -> list[str]:
    """``text`` in ``count`` parts of near-equal length (none empty)."""
    size, extra = divmod(len(text), count)
    parts, start = [], 0
    for n in range(count):
        end = start + size + (1 if n < extra else 0)
        parts.append(text[start:end])
        start = end
    return parts


def send_inbound(sandbox: Sandbox, request: InboundRequest) -> InboundSms:
    """Record an inbound SMS and schedule its callback to the inbound URL (409 without one;
    503 when ``max_messages`` are all still under way)."""
    url = sandbox.settings.inbound_url
    if url is None:
        raise no_inbound_url()
    state = sandbox.state
    keep = sandbox.settings.max_messages
    make_room(state.inbound, state.callbacks, keep, lambda record: True, "inbound SMS")
    now = sandbox.clock.now()
    body = inbound_message(request.sender, request.to, request.parts, now, missing=request.missing)
    record = InboundSms(
        request_id=str(body["requestId"]),
        sender=request.sender,
        to=request.to,
        text=str(body["message"]),
        size=len(request.parts),
        missing=sorted(request.missing),
        submitted_at=now,
        body=body,
    )
    state.inbound[record.request_id] = record
    callback = Callback(
        id=str(uuid.uuid4()),
        subject=record.request_id,
        kind="sms.inbound",
        label=f"inbound from {request.sender}",
        url=url,
        method="POST",
        body=body,
        policy=KINDS_BY_NAME["sms.inbound"].policy_for(body),
        due_at=now + (CONCATENATION_WAIT if request.missing else timedelta(0)),
    )
    record.callbacks.append(callback.id)
    sandbox.scheduler.schedule(callback)
    return record


def inbound_json(sandbox: Sandbox, record: InboundSms) -> dict[str, Any]:
    """An inbound SMS as the control API and the page show it."""
    return {
        "requestId": record.request_id,
        "from": record.sender,
        "to": record.to,
        "message": record.text,
        "size": record.size,
        "missing": record.missing,
        "submittedAt": iso(record.submitted_at),
        "body": record.body,
        "callbacks": [
            sandbox.state.callbacks[c].as_json()
            for c in record.callbacks
            if c in sandbox.state.callbacks
        ],
    }
