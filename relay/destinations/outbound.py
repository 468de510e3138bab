"""What is relayed: one received event on one delivery attempt, and the bodies sent for it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from sqlalchemy.engine import Row

    from receivers.store import ReceivedEvent

BodyFormat = Literal["envelope", "raw"]
"""``envelope``: the relay's JSON envelope; ``raw``: the platform's body as received."""

JSON_CONTENT_TYPE = "application/json"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Outbound:
    """One event to deliver. ``received_at`` must be timezone-aware; it is kept in UTC.

    ``method`` is how the platform sent it: for ``GET`` callbacks ``raw_body`` is the query string.
    ``attempt`` counts delivery attempts to this destination, from 1.
    """

    event_id: str
    kind: str
    source: str
    received_at: datetime
    payload: dict[str, Any]
    raw_body: bytes
    content_type: str | None
    method: str
    attempt: int = 1

    def __post_init__(self) -> None:
        if self.received_at.tzinfo is None:
            raise ValueError("received_at must be timezone-aware")
        object.__setattr__(self, "received_at", self.received_at.astimezone(UTC))
        object.__setattr__(self, "method", self.method.upper())

    @classmethod
    def from_event(cls, event: ReceivedEvent | Row[Any], *, attempt: int = 1) -> Outbound:
        """The outbound form of a stored ``received_events`` row (model or Core row)."""
        return cls(
            event_id=event.id,
            kind=event.kind,
            source=event.source,
            received_at=event.received_at,
            payload=dict(event.payload),
            raw_body=bytes(event.raw_body),
            content_type=event.content_type,
            method=event.method,
            attempt=attempt,
        )


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with microseconds and a ``Z``: ``2024-05-01T12:00:00.000000Z``."""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def envelope(outbound: Outbound) -> dict[str, Any]:
    """The relay's envelope: ``id``, ``kind``, ``source``, ``received_at`` and ``payload``."""
    return {
        "id": outbound.event_id,
        "kind": outbound.kind,
        "source": outbound.source,
        "received_at": iso_utc(outbound.received_at),
        "payload": outbound.payload,
    }


def envelope_bytes(outbound: Outbound) -> bytes:
    """The envelope as compact UTF-8 JSON.

    Text UTF-8 cannot encode (a lone surrogate, as a concatenated SMS with a missing part may
    hold) is written as JSON escapes instead (``\\ud83d``): valid JSON that parses back to the
    very same string. Only such envelopes pay for the second rendering."""
    text = json.dumps(envelope(outbound), ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(envelope(outbound), separators=(",", ":")).encode()


def raw_content_type(outbound: Outbound) -> str | None:
    """The content type of the raw body: form-encoded for GET callbacks, else as received."""
    return FORM_CONTENT_TYPE if outbound.method == "GET" else outbound.content_type


def render(outbound: Outbound, body_format: BodyFormat) -> tuple[bytes, str | None]:
    """The body and content type to send in ``body_format``."""
    if body_format == "raw":
        return outbound.raw_body, raw_content_type(outbound)
    return envelope_bytes(outbound), JSON_CONTENT_TYPE
