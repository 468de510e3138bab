"""Counted nouns that read right in what the relay prints: ``1 attempt``, ``2 attempts``."""

from __future__ import annotations


def counted(count: int, one: str, many: str | None = None) -> str:
    """``count`` and the noun in the form it takes: ``one`` for exactly 1, else ``many`` (by
    default ``one`` + ``s``, or ``ies`` for a final ``y``: ``delivery``, ``deliveries``)."""
    if count == 1:
        return f"1 {one}"
    return f"{count} {many or (one[:-1] + 'ies' if one.endswith('y') else one + 's')}"
