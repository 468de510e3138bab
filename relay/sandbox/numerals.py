"""Numbers written as text (query parameters, string fields, options), read strictly: ASCII
digits only, with an optional sign and, for decimals, one decimal point. Python's ``int`` and
``float`` also take ``1_0``, surrounding spaces, other scripts' digits, ``nan`` and ``1e9``,
which no client means."""

from __future__ import annotations

import re

WHOLE = re.compile(r"[+-]?[0-9]{1,18}")
DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})")


def whole(text: str) -> int:
    """A whole number of at most 18 digits; ValueError otherwise."""
    if not WHOLE.fullmatch(text):
        raise ValueError(f"not a whole number: {text[:40]!r}")
    return int(text)


def decimal(text: str) -> float:
    """A decimal number (``0.5``, ``1``, ``.5``) of at most 18 digits each side of the point;
    ValueError otherwise."""
    if not DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal number: {text[:40]!r}")
    return float(text)
