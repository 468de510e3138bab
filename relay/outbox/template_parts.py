"""Templates in ``str.format`` syntax, read into literal text and field names: the one parser
of the broker destinations' names (:mod:`relay.destinations.templates`) and of order keys
(:mod:`relay.outbox.order_keys`), which differ only in the fields they know."""

from __future__ import annotations

from collections.abc import Callable
from string import Formatter


def template_parts(
    text: str, known: Callable[[str], bool], allowed: str
) -> list[tuple[str, str | None]]:
    """``text`` as ``str.format`` reads it: (literal text, field name or None) pairs. A
    :class:`ValueError` for empty text, unbalanced braces, a format spec or conversion, or a
    field that is not ``known`` (``allowed``, the fields to name in that message)."""
    if not text:
        raise ValueError("cannot be empty")
    try:
        parsed = list(Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(
            f"{text!r} is not a valid template ({exc}; write {{{{ for a brace)"
        ) from None
    parts: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        if field is not None and (spec or conversion):
            raise ValueError(f"{text!r}: formats and conversions are not supported")
        if field is not None and not known(field):
            raise ValueError(f"{{{field}}} is not a template field (known: {allowed})")
        parts.append((literal, field))
    return parts
