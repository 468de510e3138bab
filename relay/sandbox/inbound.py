"""Inbound SMS as the platform sends them to the inbound URL (InboundMessage)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from relay.sandbox.state import iso

PRICE_CURRENCY = "EUR"


def inbound_message(sender: str, to: str, text: str, now: datetime) -> dict[str, Any]:
    """A single-part InboundMessage from ``sender`` to the provisioned number ``to``."""
    return {
        "from": sender,
        "to": to,
        "message": text,
        "requestId": str(uuid.uuid4()),
        "size": 1,
        "missingParts": False,
        "totalPrice": 0.0,
        "contentList": [
            {
                "msgId": str(uuid.uuid4()),
                "sentDate": iso(now),
                "sequenceNumber": 1,
                "price": 0.0,
                "currency": PRICE_CURRENCY,
                "priceEffective": iso(
                    now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
                ),
            }
        ],
    }
