"""Field types that store what the platform sent: a received value becomes the schema's type only
when that loses nothing, and is kept exactly as received otherwise.

A conversion is lossless when the converted value, written back as text, is the received text:
``"262"`` -> 262 (``str(262) == "262"``) but ``"0123"`` stays ``"0123"``; ``"0.002"`` -> 0.002
but ``"0.0020"`` and ``"1e3"`` stay. A value that is not of the type at all (``"abc"`` or an
object where a number belongs, NaN or Infinity) does not fit. Booleans never become numbers or
strings. String fields are plain ``str`` (with ``coerce_numbers_to_str``: 262 -> ``"262"``).

Each validator runs only for a field that was sent, and the usual case (a value already of the
schema's type) is one type check.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticKnownError, core_schema

__all__ = [
    "EventName",
    "Flag",
    "FlagOrText",
    "Identifier",
    "Integer",
    "IntegerOrText",
    "Lossless",
    "Number",
]

NUMERIC_TEXT = re.compile(
    r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*", re.ASCII
)
"""A number written in decimal notation, possibly padded (``"0123"``, ``" 1.50 "``, ``"1e3"``);
not ``inf``/``nan``, nor digits of other scripts that Python's ``int()`` also reads."""

_FLAG_TEXT = {"true": True, "false": False}
_FLAG_SPELLINGS = frozenset(
    {"true", "false", "0", "1", "t", "f", "y", "n", "yes", "no", "on", "off"}
)
"""What reads as a boolean (pydantic's lax spellings, in any letter case)."""


def _canonical_int(text: str) -> int | None:
    """The integer written exactly as ``text`` (no padding, sign or separators), else None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if str(value) == text else None


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise PydanticKnownError("finite_number")
    return value


def _integer(value: Any) -> int | float | str:
    """An integer field: int as is; its canonical text -> int; any other number as received."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        number = _canonical_int(value)
        if number is not None:
            return number
        if NUMERIC_TEXT.fullmatch(value):
            return value
        raise PydanticKnownError("int_parsing")
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)  # an int subclass (IntEnum) from Python callers
    raise PydanticKnownError("int_type")


def _integer_or_text(value: Any) -> int | float | str:
    """An integer identifier that older senders send as text (``"TT-7"``): any text is kept."""
    if isinstance(value, str):
        number = _canonical_int(value)
        return value if number is None else number
    return _integer(value)


def _number(value: Any) -> int | float | str:
    """A number field: numbers as is; text -> the number it writes exactly, else as received."""
    kind = type(value)
    if kind is float and math.isfinite(value):
        return value
    if kind is int:
        return value
    if isinstance(value, str):
        if not NUMERIC_TEXT.fullmatch(value):
            raise PydanticKnownError("float_parsing")
        number = _canonical_int(value)
        if number is not None:
            return number
        decimal = float(value)
        return decimal if math.isfinite(decimal) and repr(decimal) == value else value
    if isinstance(value, float):
        return _finite(float(value))  # a float subclass from Python callers
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise PydanticKnownError("float_type")


def _flag(value: Any) -> bool | int | str:
    """A boolean field: booleans as is; ``"true"``/``"false"`` -> booleans; other spellings of a
    boolean (``"yes"``, ``"0"``, ``1``) as received."""
    if value is True or value is False:
        return value
    if isinstance(value, str):
        flag = _FLAG_TEXT.get(value)
        if flag is not None:
            return flag
        if value.strip().lower() in _FLAG_SPELLINGS:
            return value
        raise PydanticKnownError("bool_parsing")
    if type(value) is int and value in (0, 1):
        return value
    raise PydanticKnownError("bool_type")


def _flag_or_text(value: Any) -> bool | str:
    """A string field that some senders fill with a boolean (``ported``: true, false, unknown):
    booleans and text as received, a number as its text."""
    if value is True or value is False or isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(_finite(value))
    raise PydanticKnownError("string_type")


def _identifier(value: Any) -> str:
    """An id or state that dedup keys are made of: text as is, an integer as its text. A
    fraction or a number past a float's range would lose digits (``1e400`` and ``2e400`` both
    read as infinity), and two different callbacks would share a key: it does not fit."""
    if isinstance(value, str):
        return value
    if type(value) is int:
        return str(value)
    raise PydanticKnownError("string_type")


def _event_name(value: Any) -> str:
    """An event name (Conversations ``event``): an identifier that is not empty."""
    name = _identifier(value)
    if not name:
        raise PydanticKnownError("string_too_short", {"min_length": 1})
    return name


@dataclass(frozen=True)
class Lossless:
    """The pydantic schema of a field of this module: ``validate`` alone, and the stored value
    (already a JSON scalar) serialized by its own type, which is as fast as a plain ``int``
    field (pydantic's union serializer would try each member in turn)."""

    validate: Callable[[Any], Any]
    json_types: tuple[str, ...]
    """What the OpenAPI document says the field takes."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self.validate, serialization=core_schema.simple_ser_schema("any")
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [{"type": json_type} for json_type in self.json_types]}


Integer = Annotated[int | float | str, Lossless(_integer, ("integer", "string"))]
"""An integer of the schema (``size``, ``sequenceNumber``)."""

IntegerOrText = Annotated[int | float | str, Lossless(_integer_or_text, ("integer", "string"))]
"""An integer identifier of the schema that may arrive as any text (the DLR's ``ttid``)."""

Number = Annotated[int | float | str, Lossless(_number, ("number", "string"))]
"""A number of the schema (``price``, ``totalPrice``)."""

Flag = Annotated[bool | int | str, Lossless(_flag, ("boolean", "string"))]
"""A boolean of the schema (``missingParts``, ``synchronous``)."""

FlagOrText = Annotated[bool | str, Lossless(_flag_or_text, ("boolean", "string"))]
"""A string of the schema that may arrive as a boolean (``ported``, ``roaming``, ``presence``)."""

Identifier = Annotated[str, Lossless(_identifier, ("string", "integer"))]
"""An id or state of the dedup key (``requestId``, ``messageId``, ``callId``, ``status``)."""

EventName = Annotated[str, Lossless(_event_name, ("string", "integer"))]
"""A Conversations ``event`` name: an :data:`Identifier` that is not empty."""
