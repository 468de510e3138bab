"""Text a terminal shows as it is: what the commands print of stored, caller-given values (a
rejected body, a path, a dedup key) cannot move the cursor, clear the screen, retitle the
window, reverse the text's direction or hide what follows."""

from __future__ import annotations

KEPT = "\n\t"
"""The characters shown as they are though not printable: a body's lines and tabs."""
SHOWN_VALUE = 60
"""How much of a value the user gave an error message repeats."""


def escaped(value: bytes | str, *, keep: str = "") -> str:
    """``value`` as text: bytes decoded as UTF-8, those that are not UTF-8 as ``\\xNN``; every
    character that is not printable (C0 and C1 controls, carriage return, DEL, format
    characters such as a right-to-left override, separators other than the space, unassigned
    code points, lone surrogates) as its ``\\x``, ``\\u`` or ``\\U`` escape, but for those of
    ``keep`` (e.g. :data:`KEPT`). A backslash stays as it is: for a body's exact bytes, read
    the JSON output (``raw_body``, or ``raw_body_base64``)."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
    plain = text
    for char in keep:
        plain = plain.replace(char, "")
    if plain.isprintable():
        return text
    return "".join(char if char.isprintable() or char in keep else _escape(char) for char in text)


def shown(value: str) -> str:
    """A value the user gave (an id, a glob), as an error message repeats it: escaped, cut
    after :data:`SHOWN_VALUE` characters."""
    cut = value if len(value) <= SHOWN_VALUE else value[:SHOWN_VALUE] + "..."
    return escaped(cut)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
