"""decode_json answers exactly as json.loads would (it parses with jiter, json.loads decides
whatever jiter refuses)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receivers.body import MAX_JSON_DEPTH, Undecodable, decode_json


def reference(raw: bytes) -> tuple[str, Any]:
    """What the json module makes of a body that passed the UTF-8 and depth checks."""
    try:
        return "value", json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        return "undecodable", f"The body is not JSON: {exc.msg}."


def decoded(raw: bytes) -> tuple[str, Any]:
    try:
        return "value", decode_json(raw)
    except Undecodable as problem:
        return "undecodable", problem.detail


def same_as_json(raw: bytes) -> None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return  # refused before any parser runs
    if not raw.strip() or raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        return
    expected, got = reference(raw), decoded(raw)
    assert got[0] == expected[0]
    assert repr(got[1]) == repr(expected[1])  # types, float bits, key order, NaN alike
    if got[0] == "value":
        assert type(got[1]) is type(expected[1])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=15,
)
JSON_BYTES = list(
    b'{}[]",:0123456789.eE+-\\u tfnalrsNIiy\x00\x01\t\n\r \x0b\x7f\xc3\xa9\xed\xa0\x80'
)


@pytest.mark.parametrize(
    "raw",
    [
        b'"\\ud800"',
        b'{"a": "\\udc00x"}',
        b'"\\ud83d\\ude00"',
        b"[NaN, Infinity, -Infinity]",
        b"[1e400, -1e400, 1e-400, -0, -0.0, 5e-324]",
        b'{"a": 1, "a": 2, "b": 3}',
        b"[0.30000000000000004441, 1.7976931348623157e308]",
        b"123456789012345678901234567890",
        b'"\x01"',
        b"[1,]",
        b"\xef\xbb\xbf{}",
        b"01",
        b"[1] x",
    ],
)
def test_edge_cases(raw: bytes) -> None:
    same_as_json(raw)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, ascii_only=st.booleans())
def test_valid_json(value: Any, ascii_only: bool) -> None:
    same_as_json(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, at=st.integers(0, 200), inserted=st.binary(max_size=3))
def test_damaged_json(value: Any, at: int, inserted: bytes) -> None:
    raw = json.dumps(value).encode("utf-8", "surrogatepass")
    at %= len(raw) + 1
    same_as_json(raw[:at] + inserted + raw[at + 1 :])


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(st.sampled_from(JSON_BYTES), max_size=30).map(bytes))
def test_garbage(raw: bytes) -> None:
    same_as_json(raw)


@settings(max_examples=300, deadline=None)
@given(
    number=st.from_regex(
        r"-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][-+]?[0-9]{1,4})?", fullmatch=True
    )
)
def test_numbers(number: str) -> None:
    same_as_json(f"[{number}]".encode())
