"""SMS segmenting as the platform's limits say: GSM-7 160 / 152, UCS-2 70 / 66, AUTO."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.sandbox.segments import segment, units


@pytest.mark.parametrize(
    ("text", "encoding", "parts"),
    [
        ("a" * 160, "AUTO", 1),
        ("a" * 161, "AUTO", 2),
        ("a" * 304, "GSM7", 2),
        ("a" * 305, "GSM7", 3),
        ("ä" * 70, "AUTO", 1),  # ä is in the GSM-7 table: still one part
        ("Ж" * 70, "AUTO", 1),
        ("Ж" * 71, "AUTO", 2),
        ("Ж" * 132, "UNICODE", 2),
        ("Ж" * 133, "UNICODE", 3),
        ("€" * 80, "AUTO", 1),  # an extension character takes two septets
        ("€" * 81, "AUTO", 2),
    ],
)
def test_the_number_of_parts(text: str, encoding: str, parts: int) -> None:
    assert len(segment(text, encoding).parts) == parts


def test_auto_picks_unicode_only_when_the_text_needs_it() -> None:
    assert segment("Hello {world} €", "auto").encoding == "GSM7"
    assert segment("Hello 👋", "AUTO").encoding == "UNICODE"


def test_unicode_can_be_forced_on_a_gsm_text() -> None:
    assert segment("a" * 71, "unicode").encoding == "UNICODE"
    assert len(segment("a" * 71, "UNICODE").parts) == 2


def test_gsm7_forced_replaces_what_it_cannot_carry() -> None:
    assert segment("Привет", "GSM7").parts == ("??????",)


def test_an_unknown_encoding_is_refused() -> None:
    with pytest.raises(ValueError, match="AUTO, GSM7, UNICODE"):
        segment("hi", "UTF8")


def test_no_part_splits_an_escape_or_a_surrogate_pair() -> None:
    gsm = segment("a" + "€" * 200, "GSM7")
    assert all(units(p, "GSM7") <= 152 for p in gsm.parts)
    emoji = segment("a" + "👋" * 40, "UNICODE")
    assert all(units(p, "UNICODE") <= 66 for p in emoji.parts)
    assert "".join(emoji.parts) == "a" + "👋" * 40


@given(st.text(max_size=800), st.sampled_from(["AUTO", "UNICODE"]))
def test_the_parts_join_to_the_text_and_fit(text: str, encoding: str) -> None:
    result = segment(text, encoding)
    assert "".join(result.parts) == text
    limit = 160 if result.encoding == "GSM7" else 70
    per_part = 152 if result.encoding == "GSM7" else 66
    if len(result.parts) == 1:
        assert units(result.parts[0], result.encoding) <= limit
    else:
        assert all(0 < units(p, result.encoding) <= per_part for p in result.parts)
