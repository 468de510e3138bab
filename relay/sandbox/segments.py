"""How an SMS text is cut into parts, as the platform's limits say.

GSM-7: 160 characters in a single message, 152 per part of a concatenated one; a character of
the extension table (``{ } [ ] ~ \\ | ^ €`` and form feed) takes two. UCS-2: 70 single, 66 per
part; a character outside the Basic Multilingual Plane (most emoji) takes two code units. A part
never splits an escape pair or a surrogate pair. AUTO picks UCS-2 when the text has a character
GSM-7 cannot carry; GSM7 forced on such a text replaces those characters with ``?`` (what a
transcoder without ``trate``/``mrate`` leeway sends).
"""

from __future__ import annotations

from dataclasses import dataclass

GSM7_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
GSM7_EXTENSION = frozenset("\f^{}\\[~]|€")
ENCODINGS = ("AUTO", "GSM7", "UNICODE")
"""The values of the ``encoding`` parameter (compared case-insensitively)."""

LIMITS = {"GSM7": (160, 152), "UNICODE": (70, 66)}
"""Per encoding: (units in a single message, units per part of a concatenated one)."""


@dataclass(frozen=True)
class Segmented:
    """A text as it goes on the air: its encoding (GSM7 or UNICODE) and its parts."""

    encoding: str
    parts: tuple[str, ...]


def is_gsm7(text: str) -> bool:
    """Whether GSM-7 (basic table plus extension) can carry every character."""
    return all(c in GSM7_BASIC or c in GSM7_EXTENSION for c in text)


def _units(char: str, encoding: str) -> int:
    if encoding == "GSM7":
        return 2 if char in GSM7_EXTENSION else 1
    return 2 if ord(char) > 0xFFFF else 1


def units(text: str, encoding: str) -> int:
    """The length of ``text`` in septets (GSM7) or UTF-16 code units (UNICODE)."""
    return sum(_units(c, encoding) for c in text)


def segment(text: str, encoding: str = "AUTO") -> Segmented:
    """Cut ``text`` into parts; ``encoding`` is AUTO, GSM7 or UNICODE (any letter case).

    ValueError for another encoding.
    """
    wanted = encoding.upper()
    if wanted not in ENCODINGS:
        raise ValueError(f"encoding is one of {', '.join(ENCODINGS)}")
    if wanted == "AUTO":
        wanted = "GSM7" if is_gsm7(text) else "UNICODE"
    if wanted == "GSM7":
        text = "".join(c if c in GSM7_BASIC or c in GSM7_EXTENSION else "?" for c in text)
    single, per_part = LIMITS[wanted]
    if units(text, wanted) <= single:
        return Segmented(wanted, (text,))
    parts: list[str] = []
    current, used = [], 0
    for char in text:
        size = _units(char, wanted)
        if used + size > per_part:
            parts.append("".join(current))
            current, used = [], 0
        current.append(char)
        used += size
    parts.append("".join(current))
    return Segmented(wanted, tuple(parts))
