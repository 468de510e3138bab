"""The base of every platform payload model: tolerant parsing that keeps what it does not know."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

TEXT_TYPES = (str, str | None)
NOT_TEXT = object()
"""Put in place of a value a string field must refuse (pydantic then names the field)."""


class PlatformPayload(BaseModel):
    """A platform callback body.

    Field names are matched case-insensitively (``ttid``/``ttId``, ``timezone``/``timeZone``),
    and unknown fields are kept as extra attributes so nothing the platform sends is dropped.
    Values are stored as received unless they convert to the schema's type without loss
    (``"262"`` -> 262 in an integer field, 262 -> ``"262"`` in a string field, but ``"0123"``
    and ``"0.0020"`` stay text): see :mod:`receivers.payloads.values`.

    ``NaN`` and ``Infinity`` (which JSON does not have, but some encoders write; also what a
    number beyond a float's range such as ``1e400`` decodes to) do not fit a number field, and
    become ``null`` in a stored unknown field, so that the stored payload is standard JSON on
    every backend (PostgreSQL refuses those tokens); the raw body keeps them. They do not fit a
    string field either (pydantic would store the text ``"nan"``).
    """

    model_config = ConfigDict(
        extra="allow",
        allow_inf_nan=False,
        populate_by_name=True,
        coerce_numbers_to_str=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    _key_index: ClassVar[dict[str, str]] = {}
    _canonical_names: ClassVar[frozenset[str]] = frozenset()
    _text_fields: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        index: dict[str, str] = {}
        for name, field in cls.model_fields.items():
            wire_name = field.alias or name
            index[wire_name.lower()] = wire_name
            index[name.lower()] = wire_name
        cls._key_index = index
        cls._canonical_names = frozenset(index.values())
        cls._text_fields = frozenset(
            field.alias or name
            for name, field in cls.model_fields.items()
            if field.annotation in TEXT_TYPES
        )

    @model_validator(mode="before")
    @classmethod
    def _canonical_keys(cls, data: Any) -> Any:
        """Rename keys that differ from a known field only by letter case; refuse NaN and
        Infinity in string fields."""
        if not isinstance(data, dict):
            return data
        index, canonical_names = cls._key_index, cls._canonical_names
        if canonical_names.issuperset(data) or all(
            key in canonical_names or key.lower() not in index for key in data
        ):
            return _without_non_finite_text(data, cls._text_fields)  # nothing to rename
        renamed: dict[str, Any] = {}
        for key, value in data.items():
            canonical = index.get(key.lower(), key) if isinstance(key, str) else key
            if canonical in renamed and canonical != key:
                continue  # the exact spelling wins over a case variant
            renamed[canonical] = value
        return _without_non_finite_text(renamed, cls._text_fields)

    def to_stored(self) -> dict[str, Any]:
        """The payload as stored: canonical field names, only what was sent, extras kept."""
        # model_dump(mode="json", by_alias=True, exclude_unset=True), less its Python wrapper
        stored: dict[str, Any] = self.__pydantic_serializer__.to_python(
            self, mode="json", by_alias=True, exclude_unset=True
        )
        return stored


def _without_non_finite_text(data: dict[str, Any], text_fields: frozenset[str]) -> dict[str, Any]:
    """``data``, with NaN or Infinity in a string field replaced by what the field refuses."""
    bad = [
        name
        for name in text_fields.intersection(data)
        if type(data[name]) is float and not math.isfinite(data[name])
    ]
    if not bad:
        return data
    return {**data, **dict.fromkeys(bad, NOT_TEXT)}
