"""The headers of a message published to a broker.

A broker message carries what an HTTP request carries, so one consumer library verifies both:
``webhook-id`` (the event id, the same on every attempt: dedupe on it),
``webhook-timestamp``, ``webhook-signature`` (when secrets are configured; Standard Webhooks,
over the message body), and ``content-type``; plus ``kind``, ``source`` and, when the platform
gave one, ``event`` (the event name, lower-cased), to route or filter without parsing the body.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from receivers.dedup import platform_refs_of
from relay.destinations.outbound import Outbound
from relay.destinations.signing import Signer


class MessageHeaders:
    """Builds each message's headers, signing with ``secrets`` when there are any."""

    def __init__(self, secrets: Sequence[str], *, clock: Callable[[], float] = time.time) -> None:
        self._signer = Signer(secrets) if secrets else None
        self._clock = clock

    def for_message(
        self, outbound: Outbound, body: bytes, content_type: str | None
    ) -> dict[str, str]:
        """The headers of one publish of ``outbound`` with ``body``."""
        timestamp = int(self._clock())
        headers = {
            "webhook-id": outbound.event_id,
            "webhook-timestamp": str(timestamp),
            "kind": outbound.kind,
            "source": header_text(outbound.source),
        }
        if content_type:
            headers["content-type"] = header_text(content_type)
        event = platform_refs_of(outbound.kind, outbound.payload)[1]
        if event:
            headers["event"] = header_text(event)
        if self._signer is not None:
            headers["webhook-signature"] = self._signer.signature(
                outbound.event_id, timestamp, body
            )
        return headers


def header_text(value: str) -> str:
    """``value`` on one printable line (brokers' header formats refuse CR, LF and NUL)."""
    return value if value.isprintable() else "".join(c if c.isprintable() else "_" for c in value)
