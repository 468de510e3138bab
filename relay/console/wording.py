"""How the console words numbers and outcomes: plural forms that read right ("1 attempt",
"2 attempts", "1 delivery"), and what an attempt's outcome was when it has no HTTP status
(a broker's publish)."""

from __future__ import annotations

from typing import Any

DELIVERED = "delivered"
"""A delivery's outcome without an HTTP status: the destination (a broker) took it."""
FAILED = "failed"


def plural(singular: str) -> str:
    """The plural of an English noun of the console ("delivery" -> "deliveries")."""
    if singular.endswith("y") and singular[-2:-1] not in ("a", "e", "o", "u"):
        return singular[:-1] + "ies"
    return singular + "s"


def count_text(number: int, singular: str, many: str | None = None) -> str:
    """``number`` things in words: "1 attempt", "0 attempts", "1,200 deliveries"."""
    if number == 1:
        return f"1 {singular}"
    return f"{number:,} {many or plural(singular)}"


def backlog_text(count: int, cap: int = 1_000) -> str:
    """A bounded count as the console shows it: exact up to ``cap``, then "1,000+"."""
    return f"{cap:,}+" if count > cap else f"{count:,}"


def attempt_outcome(status_code: int | None, error: str | None) -> str:
    """What an attempt's status column shows: its HTTP status, or (a broker's attempt, which
    has none) whether it was delivered or failed."""
    if status_code is not None:
        return str(status_code)
    return FAILED if error else DELIVERED


def last_answer(delivery: Any) -> str:
    """A delivery's last answer in a list: its last HTTP status or error; "delivered" for a
    delivery that succeeded without an HTTP status; nothing before its first attempt."""
    if delivery.last_status_code is not None:
        return str(delivery.last_status_code)
    if delivery.last_error:
        return str(delivery.last_error)
    return DELIVERED if delivery.status == "succeeded" and delivery.attempts else ""
