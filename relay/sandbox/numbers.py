"""The magic numbers: a destination number that forces an outcome, as test numbers do at other
providers. They use the country code +999, which no country has, so that no real phone is ever
meant. Any other number is delivered.

The platform does not publish its errorCode values; the codes here are the simulator's
illustrative ones (:mod:`relay.simulator.factories`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class MagicNumber:
    """A number and what the sandbox does when it is the destination."""

    number: str
    product: str
    """sms, gnp, gnv or tts: the API the number is meant for."""
    outcome: str
    description: str
    error_code: str | None = None
    error_reason: str | None = None
    implemented: bool = True
    """False: the number is reserved for a product the sandbox does not serve yet."""

    def as_json(self) -> dict[str, Any]:
        """The row as ``relay sandbox numbers --json`` prints it."""
        return {
            ("errorCode" if k == "error_code" else "errorReason" if k == "error_reason" else k): v
            for k, v in asdict(self).items()
        }


DELIVERED = "delivered"
UNDELIVERABLE = "undeliverable"
REJECTED = "rejected"
EXPIRED = "expired"
DELIVERED_LATE = "delivered-late"
DELIVERED_THEN_REPLY = "delivered-then-reply"

NUMBERS: tuple[MagicNumber, ...] = (
    MagicNumber("+99900000000", "sms", DELIVERED, "ACCEPTED, BUFFERED, DELIVERED within seconds."),
    MagicNumber(
        "+99900000001",
        "sms",
        UNDELIVERABLE,
        "ACCEPTED, BUFFERED, then UNDELIVERABLE: unknown subscriber.",
        "001",
        "Unknown subscriber",
    ),
    MagicNumber(
        "+99900000002",
        "sms",
        REJECTED,
        "ACCEPTED, then REJECTED by the platform: insufficient funds (no charge).",
        "102",
        "Insufficient funds",
    ),
    MagicNumber(
        "+99900000003",
        "sms",
        EXPIRED,
        "ACCEPTED, BUFFERED, then EXPIRED when the validity runs out (default 48 h).",
        "003",
        "Validity period expired",
    ),
    MagicNumber(
        "+99900000004",
        "sms",
        DELIVERED_LATE,
        "ACCEPTED, BUFFERED, DELIVERED two hours later (a handset switched off).",
    ),
    MagicNumber(
        "+99900000005",
        "sms",
        DELIVERED_THEN_REPLY,
        "Delivered, then the recipient replies: an inbound SMS to the inbound URL 30 s later.",
    ),
    MagicNumber(
        "+99900000006",
        "sms",
        UNDELIVERABLE,
        "ACCEPTED, BUFFERED, then UNDELIVERABLE: absent subscriber.",
        "027",
        "Absent subscriber",
    ),
    MagicNumber(
        "+99900000010",
        "gnp",
        "ported",
        "Portability check: ported to another operator (ported true).",
    ),
    MagicNumber(
        "+99900000011",
        "gnp",
        "not-ported",
        "Portability check: not ported (ported false), as any other number.",
    ),
    MagicNumber(
        "+99900000012",
        "gnv",
        "absent-subscriber",
        "HLR lookup: the subscriber is absent (presence false, errorCode 027).",
    ),
    MagicNumber(
        "+99900000020",
        "tts",
        "not-answered",
        "The call rings, nobody answers: started, ringing, hangup after 30 s.",
    ),
)

BY_NUMBER = {n.number: n for n in NUMBERS}
ANY_OTHER = MagicNumber("(any other)", "sms", DELIVERED, "Delivered like +99900000000.")


def sms_outcome(number: str) -> MagicNumber:
    """What happens to an SMS sent to ``number``: its magic row, else delivered."""
    row = BY_NUMBER.get(number)
    return row if row is not None and row.product == "sms" else ANY_OTHER
