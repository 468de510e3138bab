"""Inbound SMS as the platform sends them to the inbound URL (InboundMessage): one text, merged
from its concatenated parts, each part an InboundContent record; a part that never arrived is
marked ``<...>`` in the text and sets ``missingParts``."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from relay.sandbox.state import iso

PRICE_CURRENCY = "EUR"
MISSING_MARK = "<...>"
"""The seed's mark for a missing part of a concatenated message."""


def inbound_message(
    sender: str,
    to: str,
    parts: Sequence[str] | str,
    now: datetime,
    *,
    missing: Collection[int] = (),
) -> dict[str, Any]:
    """An InboundMessage from ``sender`` to the provisioned number ``to``: ``parts`` (or one
    text) merged, the part numbers in ``missing`` (1-based) marked and left out of
    ``contentList``; ``size`` counts every part."""
    texts = [parts] if isinstance(parts, str) else list(parts)
    effective = iso(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0))
    arrived = [n for n in range(1, len(texts) + 1) if n not in missing]
    return {
        "from": sender,
        "to": to,
        "message": "".join(
            MISSING_MARK if n in missing else text for n, text in enumerate(texts, start=1)
        ),
        "requestId": str(uuid.uuid4()),
        "size": len(texts),
        "missingParts": bool(missing),
        "totalPrice": 0.0,
        "contentList": [
            {
                "msgId": str(uuid.uuid4()),
                "sentDate": iso(now),
                "sequenceNumber": n,
                "price": 0.0,
                "currency": PRICE_CURRENCY,
                "priceEffective": effective,
            }
            for n in arrived
        ],
    }
