"""Durations in settings: "500ms", "5s", "1m", "2h", "14d", or a number of seconds."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
LONGEST = timedelta(days=3650)
"""No setting needs more than ten years; beyond, dates computed from it would overflow."""
PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.ASCII)


def parse_duration(value: Any) -> timedelta:
    """A duration from text with a unit (bare numbers are seconds) or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {value!r}")
        return _bounded(float(value))
    if isinstance(value, str):
        match = PATTERN.match(value)
        if match:
            number, unit = match.groups()
            return _bounded(float(number) * UNITS[unit or "s"])
    raise ValueError(f'not a duration: {value!r} (use e.g. "500ms", "5s", "1m", "2h", "14d")')


def _bounded(seconds: float) -> timedelta:
    if not seconds <= LONGEST.total_seconds():  # also NaN and infinity
        raise ValueError(f"a duration cannot exceed {LONGEST.days} days")
    return timedelta(seconds=seconds)


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
"""A pydantic field type accepting the duration syntax above."""
