"""The stored payload keeps what the platform sent: a value is converted to the type of the
platform's schema only when nothing is lost, and kept exactly as received otherwise.

The rule, per schema type (``REFUSED``: does not fit, 422 from the receiver):

- integer: ``262`` and ``"262"`` -> 262; ``"0123"``, ``"1e3"``, ``2.5`` kept; ``"abc"`` refused.
- number: ``"0.002"`` -> 0.002, ``"262"`` -> 262; ``"0.0020"``, ``"1e3"`` kept; NaN refused.
- string: ``262`` -> ``"262"``; text kept; a boolean or an object refused.
- boolean: ``"true"``/``"false"`` -> true/false; other spellings (``"yes"``, ``1``) kept.
- Booleans never become strings or numbers.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pydantic
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.kinds import KINDS
from receivers.payloads.base import PlatformPayload
from receivers.store import queries
from relay.simulator import factories
from tests.conftest import TOKEN


class _Refused:
    def __repr__(self) -> str:
        return "REFUSED"


REFUSED: Any = _Refused()

INTEGER = "integer"
INTEGER_OR_TEXT = "integer, or any text"
NUMBER = "number"
TEXT = "string"
IDENTIFIER = "string (a dedup key's id or state)"
EVENT_NAME = "string (a Conversations event name)"
FLAG = "boolean"
FLAG_OR_TEXT = "boolean or string"
NAN, INF = float("nan"), float("inf")

# wire value -> stored value, per schema type
CASES: dict[str, list[tuple[Any, Any]]] = {
    INTEGER: [
        (262, 262),
        ("262", 262),
        ("-7", -7),
        ("0123", "0123"),
        ("262.0", "262.0"),
        ("1e3", "1e3"),
        ("+7", "+7"),
        (" 7 ", " 7 "),
        (2.5, 2.5),
        (10**30, 10**30),
        ("abc", REFUSED),
        ("", REFUSED),
        ("inf", REFUSED),
        ("\u0661\u0662", REFUSED),  # Arabic-Indic digits: Python's int() reads them, JSON not
        ({"n": 1}, REFUSED),
        ([1], REFUSED),
        (True, REFUSED),
        (NAN, REFUSED),
        (INF, REFUSED),
    ],
    INTEGER_OR_TEXT: [
        (26201, 26201),
        ("26201", 26201),
        ("026201", "026201"),
        ("TT-7", "TT-7"),
        ("1e3", "1e3"),
        (2.5, 2.5),
        ({"n": 1}, REFUSED),
        (True, REFUSED),
        (NAN, REFUSED),
    ],
    NUMBER: [
        (0.002, 0.002),
        ("0.002", 0.002),
        ("-0.5", -0.5),
        ("0.0020", "0.0020"),
        ("2.50", "2.50"),
        ("1e3", "1e3"),
        ("262", 262),
        ("0123", "0123"),
        (5, 5),
        (0, 0),
        ("abc", REFUSED),
        ("", REFUSED),
        ("inf", REFUSED),
        ("NaN", REFUSED),
        (NAN, REFUSED),
        (INF, REFUSED),
        (True, REFUSED),
        ({"p": 1}, REFUSED),
    ],
    TEXT: [
        ("abc", "abc"),
        ("0123", "0123"),
        ("0.0020", "0.0020"),
        (262, "262"),
        (4915112345678, "4915112345678"),
        (0.045, "0.045"),
        (-5, "-5"),
        (True, REFUSED),
        ({"a": 1}, REFUSED),
        ([1], REFUSED),
        (NAN, REFUSED),  # pydantic would store the text "nan"
        (INF, REFUSED),
    ],
    IDENTIFIER: [
        ("abc", "abc"),
        ("0123", "0123"),
        ("", ""),
        (262, "262"),
        (4915112345678, "4915112345678"),
        (10**30, str(10**30)),
        (0.045, REFUSED),  # a fraction may have lost digits: two callbacks could share a key
        (9007199254740993.0, REFUSED),
        (NAN, REFUSED),
        (INF, REFUSED),  # 1e400 and 2e400 both decode to it
        (True, REFUSED),
        ({"a": 1}, REFUSED),
    ],
    EVENT_NAME: [
        ("MoMessage", "MoMessage"),
        (7, "7"),
        ("", REFUSED),
        (0.5, REFUSED),
        (INF, REFUSED),
        (True, REFUSED),
    ],
    FLAG: [
        (True, True),
        (False, False),
        ("true", True),
        ("false", False),
        ("True", "True"),
        ("0", "0"),
        ("yes", "yes"),
        (1, 1),
        (0, 0),
        ("abc", REFUSED),
        (2, REFUSED),
        ({"a": 1}, REFUSED),
    ],
    FLAG_OR_TEXT: [
        (True, True),
        (False, False),
        ("unknown", "unknown"),
        ("true", "true"),
        (1, "1"),
        (0, "0"),
        (0.5, "0.5"),
        ({"a": 1}, REFUSED),
        ([1], REFUSED),
    ],
}

# The platform's schema type of every field that is not a string (seeds and PAYLOADS.md):
# (model, wire name) -> type. Every other scalar field is a string.
NOT_TEXT: dict[tuple[str, str], str] = {
    # sms.inbound: InboundMessage and InboundContent
    ("InboundMessage", "totalPrice"): NUMBER,
    ("InboundMessage", "size"): INTEGER,
    ("InboundMessage", "missingParts"): FLAG,
    ("InboundContent", "sequenceNumber"): INTEGER,
    ("InboundContent", "price"): NUMBER,
    # sms.dlr: RestMessageResponse (ttid: integer; text ids of older senders are kept)
    ("DeliveryReport", "ttid"): INTEGER_OR_TEXT,
    ("DeliveryReport", "size"): INTEGER,
    # numinfo: GNP ttid, ported and the GNV groups are strings; price a number
    ("GnpResult", "price"): NUMBER,
    ("GnpResult", "ported"): FLAG_OR_TEXT,
    ("GnpResult", "synchronous"): FLAG,
    ("GnvResult", "price"): NUMBER,
    ("GnvResult", "ported"): FLAG_OR_TEXT,
    ("GnvResult", "roaming"): FLAG_OR_TEXT,
    ("GnvResult", "presence"): FLAG_OR_TEXT,
    ("GnvResult", "synchronous"): FLAG,
    # Conversations MoMessage: the sms block as InboundMessage; location; order items
    ("SmsBlock", "totalPrice"): NUMBER,
    ("SmsBlock", "size"): INTEGER,
    ("SmsBlock", "missingParts"): FLAG,
    ("SmsPart", "sequenceNumber"): INTEGER,
    ("SmsPart", "price"): NUMBER,
    ("Location", "latitude"): NUMBER,
    ("Location", "longitude"): NUMBER,
    ("OrderItem", "quantity"): INTEGER,
    ("OrderItem", "itemPrice"): NUMBER,
    ("MoContext", "isForwarded"): FLAG,
    # the fields of the dedup keys: an integer id is kept as its text, a fraction refused
    ("InboundMessage", "requestId"): IDENTIFIER,
    ("DeliveryReport", "requestId"): IDENTIFIER,
    ("DeliveryReport", "status"): IDENTIFIER,
    ("LegacyDeliveryReport", "msgid"): IDENTIFIER,
    ("LegacyDeliveryReport", "stat"): IDENTIFIER,
    ("GnpResult", "requestId"): IDENTIFIER,
    ("GnvResult", "requestId"): IDENTIFIER,
    ("ConversationsEvent", "event"): EVENT_NAME,
    ("ConversationsEvent", "messageId"): IDENTIFIER,
    ("MessageStatus", "event"): EVENT_NAME,
    ("MessageStatus", "messageId"): IDENTIFIER,
    ("MoMessage", "event"): EVENT_NAME,
    ("MoMessage", "messageId"): IDENTIFIER,
    ("TtsEvent", "callId"): IDENTIFIER,
    ("TtsEvent", "status"): IDENTIFIER,
}

# The least each model needs besides the field under test.
REQUIRED: dict[str, dict[str, Any]] = {
    "InboundMessage": {"from": "+4915112345678", "to": "+4915730000001", "message": "Hi"}
    | {"requestId": "r-1"},
    "InboundContent": {"msgId": "m-1", "sentDate": "2026-03-01T12:00:00.000Z"}
    | {"sequenceNumber": 1},
    "DeliveryReport": {"requestId": "r-1", "status": "DELIVERED"},
    "LegacyDeliveryReport": {"msgid": "m-1", "stat": "delivered"},
    "GnpResult": {"requestId": "r-1"},
    "GnvResult": {"requestId": "r-1"},
    "ConversationsEvent": {"event": "Call::started"},
    "MessageStatus": {"event": "MessageStatus::delivered", "messageId": "m-1"},
    "MoMessage": {"event": "MoMessage", "messageId": "m-1"},
}


def _models() -> dict[str, type[PlatformPayload]]:
    """Every payload model of every kind, nested ones included, by class name."""
    found: dict[str, type[PlatformPayload]] = {}
    pending: list[Any] = [kind.model for kind in KINDS]
    while pending:
        model = pending.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            pending.extend(_nested_models(field.annotation))
    return found


def _nested_models(annotation: Any) -> Iterator[type[PlatformPayload]]:
    if isinstance(annotation, type) and issubclass(annotation, PlatformPayload):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _nested_models(arg)


def _is_scalar(annotation: Any) -> bool:
    """Not a nested model, list or object."""
    if annotation is Any or typing.get_origin(annotation) in (list, dict):
        return False
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return False
    return all(_is_scalar(arg) for arg in typing.get_args(annotation))


MODELS = _models()
FIELDS: list[tuple[str, str, str]] = sorted(
    (model_name, field.alias or name, NOT_TEXT.get((model_name, field.alias or name), TEXT))
    for model_name, model in MODELS.items()
    for name, field in model.model_fields.items()
    if _is_scalar(field.annotation)
)


def same(stored: Any, expected: Any) -> bool:
    """Equal and of the same JSON type (1, 1.0, True and "1" are four different values)."""
    return json.dumps(stored, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_every_typed_field_is_a_field_of_the_models() -> None:
    assert {"LegacyDeliveryReport", "InboundContent", "SmsPart", "OrderItem"} <= set(MODELS)
    assert set(NOT_TEXT) <= {(model, name) for model, name, _ in FIELDS}
    assert set(REQUIRED) <= set(MODELS)


@pytest.mark.parametrize(("model_name", "wire_name", "schema_type"), FIELDS)
def test_each_field_keeps_what_a_lossless_conversion_cannot_give(
    model_name: str, wire_name: str, schema_type: str
) -> None:
    model = MODELS[model_name]
    wrong: list[str] = []
    for sent, expected in CASES[schema_type]:
        payload = {**REQUIRED.get(model_name, {}), wire_name: sent}
        try:
            stored = model.model_validate(payload).to_stored()
        except pydantic.ValidationError as exc:
            locs = [error["loc"] for error in exc.errors()]
            if expected is not REFUSED or locs != [(wire_name,)]:
                wrong.append(f"{sent!r}: refused at {locs}, expected {expected!r}")
            continue
        if expected is REFUSED:
            wrong.append(f"{sent!r}: stored as {stored.get(wire_name)!r}, expected a refusal")
        elif not same(stored[wire_name], expected):
            wrong.append(f"{sent!r}: stored as {stored[wire_name]!r}, expected {expected!r}")
        elif not same(model.model_validate(stored).to_stored(), stored):
            wrong.append(f"{sent!r}: {stored!r} changes when validated again")
    assert wrong == [], f"{model_name}.{wire_name} ({schema_type})"


def test_factory_payloads_are_stored_unchanged() -> None:
    """The simulator sends the schema's types, so nothing it sends is converted."""
    for kind in KINDS:
        payload = _factory_payload(kind.model.__name__)
        assert same(kind.model.model_validate(payload).to_stored(), payload), kind.model.__name__


def _factory_payload(model_name: str) -> dict[str, Any]:
    return {
        "InboundMessage": lambda: factories.sms_inbound(parts=2),
        "DeliveryReport": lambda: factories.sms_dlr(parts=2),
        "LegacyDeliveryReport": lambda: factories.sms_dlr_legacy(),
        "GnpResult": factories.numinfo_gnp,
        "GnvResult": factories.numinfo_gnv,
        "MessageStatus": factories.conversations_status,
        "MoMessage": lambda: factories.conversations_inbound(kind="sms"),
        "ConversationsEvent": factories.conversations_event,
        "TtsEvent": factories.tts_event,
    }[model_name]()


def test_nan_and_infinity_never_reach_the_stored_payload() -> None:
    for model_name, wire_name, schema_type in FIELDS:
        if schema_type in (INTEGER, INTEGER_OR_TEXT, NUMBER, TEXT, IDENTIFIER, EVENT_NAME):
            for value in (NAN, INF, -INF):
                payload = {**REQUIRED.get(model_name, {}), wire_name: value}
                with pytest.raises(pydantic.ValidationError):
                    MODELS[model_name].model_validate(payload)
    stored = MODELS["GnpResult"].model_validate({"requestId": "r", "score": NAN}).to_stored()
    assert stored["score"] is None  # an unknown field: null, as before


# --- end to end: one case per kind through the receiver ---------------------------------------

# (path, payload as sent, {dotted path in the stored payload: stored value})
E2E: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "/hooks/sms/inbound",
        factories.sms_inbound(
            {
                "totalPrice": "0.0040",
                "size": "2",
                "originTtId": 26201,
                "contentList.0.price": "0.002",
                "contentList.1.price": "0.0020",
                "contentList.1.sequenceNumber": "02",
            },
            parts=2,
        ),
        {
            "totalPrice": "0.0040",
            "size": 2,
            "originTtId": "26201",
            "contentList.0.price": 0.002,
            "contentList.1.price": "0.0020",
            "contentList.1.sequenceNumber": "02",
        },
    ),
    (
        "/hooks/sms/dlr",
        factories.sms_dlr(
            {"ttid": "0123", "size": "2", "overallPrice": 0.09, "parts.0.price": 0.045}, parts=2
        ),
        {"ttid": "0123", "size": 2, "overallPrice": "0.09", "parts.0.price": "0.045"},
    ),
    (
        "/hooks/numinfo/gnp",
        factories.numinfo_gnp({"ttid": 26201, "price": "0.0050", "mcc": 262}),
        {"ttid": "26201", "price": "0.0050", "mcc": "262"},
    ),
    (
        "/hooks/numinfo/gnv",
        factories.numinfo_gnv({"nrhTtId": 26201, "imsiTtId": "026203", "price": "0.01"}),
        {"nrhTtId": "26201", "imsiTtId": "026203", "price": 0.01},
    ),
    (
        "/hooks/conversations",
        factories.conversations_status({"from": 4915112345678}),
        {"from": "4915112345678"},
    ),
    (
        "/hooks/conversations",
        factories.conversations_inbound(
            {
                "sms.totalPrice": "0.0020",
                "sms.size": "1",
                "sms.origin.ttId": 26201,
                "sms.parts.0.sequenceNumber": "01",
                "sms.parts.0.price": "0.002",
            },
            kind="sms",
        ),
        {
            "sms.totalPrice": "0.0020",
            "sms.size": 1,
            "sms.origin.ttId": "26201",
            "sms.parts.0.sequenceNumber": "01",
            "sms.parts.0.price": 0.002,
        },
    ),
    (
        "/hooks/conversations",
        factories.conversations_inbound(
            {"order.items.0.quantity": "002", "order.items.0.itemPrice": "12.50"}, kind="order"
        ),
        {"order.items.0.quantity": "002", "order.items.0.itemPrice": "12.50"},
    ),
    (
        "/hooks/conversations",
        factories.conversations_event({"from": 4915112345678}),
        {"from": "4915112345678"},
    ),
    (
        "/hooks/tts/events",
        factories.tts_event({"price": 0.045, "rate": "0.0450", "duration": 42}),
        {"price": "0.045", "rate": "0.0450", "duration": "42"},
    ),
]


def _at(payload: Any, path: str) -> Any:
    for key in path.split("."):
        payload = payload[int(key)] if isinstance(payload, list) else payload[key]
    return payload


async def assert_stored(
    engine: AsyncEngine, answer: httpx.Response, expected: dict[str, Any]
) -> None:
    """The answer accepted its callback, stored with ``expected`` at each dotted path."""
    assert answer.status_code == 200, answer.text
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None
    got = {key: _at(stored.payload, key) for key in expected}
    assert same(got, expected), got


@pytest.mark.slow
@pytest.mark.parametrize(("path", "sent", "expected"), E2E, ids=[c[0] for c in E2E])
async def test_the_receiver_stores_values_as_the_rule_says(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    path: str,
    sent: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    answer = await client.post(f"{path}?token={TOKEN}", json=sent)
    await assert_stored(engine, answer, expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "query", "expected"),
    [
        (
            "/hooks/sms/dlr",
            {"requestId": "r-1", "status": "DELIVERED", "ttid": "0123", "size": "1"},
            {"ttid": "0123", "size": 1},
        ),
        (
            "/hooks/sms/dlr",
            {"requestId": "r-2", "status": "DELIVERED", "ttid": "26201", "size": "01"},
            {"ttid": 26201, "size": "01"},
        ),
        (
            "/hooks/sms/inbound",
            {"from": "+4915112345678", "to": "+4915730000001", "message": "Hi"}
            | {"requestId": "r-3", "totalPrice": "0.0040", "size": "1", "missingParts": "false"},
            {"totalPrice": "0.0040", "size": 1, "missingParts": False},
        ),
    ],
)
async def test_get_callbacks_keep_what_a_lossless_conversion_cannot_give(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    path: str,
    query: dict[str, str],
    expected: dict[str, Any],
) -> None:
    answer = await client.get(f"{path}?token={TOKEN}&{urlencode(query)}")
    await assert_stored(engine, answer, expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "sent", "field"),
    [
        ("/hooks/sms/inbound", factories.sms_inbound({"size": "abc"}), "size"),
        ("/hooks/sms/inbound", factories.sms_inbound({"size": {"n": 1}}), "size"),
        ("/hooks/sms/inbound", factories.sms_inbound({"totalPrice": True}), "totalPrice"),
        ("/hooks/sms/dlr", factories.sms_dlr({"size": True}), "size"),
        ("/hooks/tts/events", factories.tts_event({"price": True}), "price"),
    ],
)
async def test_values_that_are_not_of_the_type_at_all_are_refused(
    client: httpx.AsyncClient, engine: AsyncEngine, path: str, sent: dict[str, Any], field: str
) -> None:
    answer = await client.post(f"{path}?token={TOKEN}", json=sent)

    assert answer.status_code == 422, answer.text
    assert [error["field"] for error in answer.json()["errors"]] == [field]
    assert await queries.count_events(engine) == 0
