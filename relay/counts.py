"""Whole numbers in settings: an integer (TOML) or its decimal digits as text (environment)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

DIGITS = re.compile(r"\s*[0-9]{1,18}\s*")
SHOWN = 24
"""How much of a refused value its error message repeats."""


def parse_count(value: Any) -> int:
    """An ``int`` as it is; text of ASCII digits as their number. Anything else (``true``,
    ``1.5``, ``"1e2"``, ``"1_0"``, ``"0x10"``, the empty text) is refused rather than read as a
    number it only looks like."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and DIGITS.fullmatch(value):
        return int(value)
    shown = repr(value)
    if len(shown) > SHOWN:
        shown = shown[:SHOWN] + "..."
    raise ValueError(f"expected a whole number in digits, such as 50; got {shown}")


Count = Annotated[int, BeforeValidator(parse_count)]
"""A pydantic field type for the settings' whole numbers (bounds go in ``Field``)."""
