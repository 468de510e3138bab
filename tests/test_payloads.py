"""Unit tests of the payload models, fed by the simulator's factories and hand-made variants."""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pydantic
import pytest
from freezegun import freeze_time

from receivers.payloads.base import PlatformPayload
from receivers.payloads.conversations import ConversationsEvent, MessageStatus, MoMessage
from receivers.payloads.numinfo import GnpResult, GnvResult
from receivers.payloads.sms import DeliveryReport, InboundMessage, LegacyDeliveryReport
from receivers.payloads.tts import TtsEvent
from relay.simulator import factories as f

Factory = Callable[..., dict[str, Any]]

E164 = re.compile(r"^\+[1-9]\d{7,14}$")
DLR_STATES = ["ACCEPTED", "BUFFERED", "DELIVERED", "EXPIRED", "REJECTED", "UNDELIVERABLE"]
LEGACY_STATES = ["delivered", "not delivered", "expired", "rejected", "buffered"]
STATUS_KINDS = ["accepted", "dispatched", "delivered", "seen"]
STATUS_KINDS += ["channelFailed", "failed", "deleted", "unknown"]
INBOUND_KINDS = ["text", "media", "location", "contacts", "reaction", "postback", "order", "sms"]
TTS_STATES = ["started", "early", "ringing", "hangup", "completed"]

# (id, model, factory, factory keyword arguments)
CASES: list[tuple[str, type[PlatformPayload], Factory, dict[str, Any]]] = [
    ("sms.inbound", InboundMessage, f.sms_inbound, {}),
    ("sms.inbound-3-parts", InboundMessage, f.sms_inbound, {"parts": 3}),
    ("sms.inbound-missing", InboundMessage, f.sms_inbound, {"parts": 4, "missing_part": True}),
    *[(f"sms.dlr-{s}", DeliveryReport, f.sms_dlr, {"status": s, "parts": 2}) for s in DLR_STATES],
    *[
        (f"sms.dlr-legacy-{s}", LegacyDeliveryReport, f.sms_dlr_legacy, {"stat": s})
        for s in LEGACY_STATES
    ],
    ("numinfo.gnp", GnpResult, f.numinfo_gnp, {}),
    ("numinfo.gnp-ported", GnpResult, f.numinfo_gnp, {"ported": True}),
    ("numinfo.gnv", GnvResult, f.numinfo_gnv, {}),
    ("numinfo.gnv-ported-roaming", GnvResult, f.numinfo_gnv, {"ported": True, "roaming": True}),
    *[
        (f"status-{k}", MessageStatus, f.conversations_status, {"event": f"MessageStatus::{k}"})
        for k in STATUS_KINDS
    ],
    *[
        (
            f"status-v2-{k}",
            MessageStatus,
            f.conversations_status,
            {"event": f"MessageStatus::{k}", "v2": True, "channel": "whatsapp"},
        )
        for k in STATUS_KINDS
    ],
    ("status-sms", MessageStatus, f.conversations_status, {"channel": "sms"}),
    *[(f"inbound-{k}", MoMessage, f.conversations_inbound, {"kind": k}) for k in INBOUND_KINDS],
    ("inbound-whatsapp", MoMessage, f.conversations_inbound, {"channel": "whatsapp"}),
    ("inbound-group", MoMessage, f.conversations_inbound, {"kind": "media", "in_group": True}),
    ("event-call", ConversationsEvent, f.conversations_event, {}),
    (
        "event-coexistence",
        ConversationsEvent,
        f.conversations_event,
        {"event": "Coexistence::stateChanged"},
    ),
    *[(f"tts-{s}", TtsEvent, f.tts_event, {"status": s}) for s in TTS_STATES],
    ("tts-inbound", TtsEvent, f.tts_event, {"direction": "inbound"}),
]
CASE_IDS = [case[0] for case in CASES]


def _paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Every key of a JSON value as a dotted path; list items share their list's path."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{prefix}{key}"
            yield from _paths(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for item in node:
            yield from _paths(item, prefix)


def _validate(model: type[PlatformPayload], payload: dict[str, Any]) -> dict[str, Any]:
    return model.model_validate(payload).to_stored()


# --- every factory output fits its model ------------------------------------------------------


@pytest.mark.parametrize(("model", "factory", "kwargs"), [c[1:] for c in CASES], ids=CASE_IDS)
def test_factory_output_validates_and_every_key_is_stored(
    model: type[PlatformPayload], factory: Factory, kwargs: dict[str, Any]
) -> None:
    payload = factory(rng=random.Random(7), **kwargs)
    stored = _validate(model, payload)
    assert set(_paths(stored)) == set(_paths(payload))
    if not kwargs.get("v2"):
        assert stored == payload


def test_v2_integer_from_is_stored_as_a_string() -> None:
    payload = f.conversations_status(v2=True, rng=random.Random(1))
    assert isinstance(payload["from"], int)
    assert _validate(MessageStatus, payload)["from"] == str(payload["from"])


# --- factories carry every documented field and realistic values ------------------------------

GNV_GROUP_FIELDS = ["MCC", "MNC", "TtId", "Operator", "Country", "TimeZone", "Technology"]
NUMINFO_COMMON = [
    "requestId",
    "msisdn",
    "ported",
    "price",
    "currency",
    "priceEffective",
    "errorCode",
    "synchronous",
]
DOCUMENTED: dict[str, tuple[list[tuple[Factory, dict[str, Any]]], set[str]]] = {
    "sms.inbound": (
        [(f.sms_inbound, {})],
        {
            "from",
            "to",
            "message",
            "originMCC",
            "originMNC",
            "originTtId",
            "totalPrice",
            "requestId",
            "size",
            "missingParts",
            "contentList",
            "contentList.msgId",
            "contentList.sentDate",
            "contentList.sequenceNumber",
            "contentList.price",
            "contentList.currency",
            "contentList.priceEffective",
        },
    ),
    "sms.dlr": (
        [(f.sms_dlr, {})],
        {
            "requestId",
            "status",
            "reference",
            "from",
            "to",
            "href",
            "submitDate",
            "doneDate",
            "errorCode",
            "errorReason",
            "mccmnc",
            "ttid",
            "size",
            "overallPrice",
            "priceEffective",
            "sentDate",
            "parts",
            "parts.partId",
            "parts.deliveryState",
            "parts.doneDate",
            "parts.errorCode",
            "parts.price",
            "parts.currency",
            "parts.priceEffective",
            "parts.statusText",
        },
    ),
    "sms.dlr (legacy)": (
        [(f.sms_dlr_legacy, {})],
        {
            "receiver",
            "msgid",
            "ttid",
            "mccmnc",
            "err",
            "stat",
            "sender",
            "text",
            "donedate",
            "submitdate",
            "price",
            "currency",
            "priceEffective",
        },
    ),
    "numinfo.gnp": (
        [(f.numinfo_gnp, {})],
        {*NUMINFO_COMMON, "mcc", "mnc", "ttid", "operator", "country", "timezone", "technology"},
    ),
    "numinfo.gnv": (
        [(f.numinfo_gnv, {})],
        {
            *NUMINFO_COMMON,
            "roaming",
            "presence",
            "imsi",
            "hlrCC",
            "hlrNDC",
            "hlr",
            "mscCC",
            "mscNDC",
            "msc",
            *(g + name for g in ("nrh", "imsi", "hlr", "msc") for name in GNV_GROUP_FIELDS),
        },
    ),
    "conversations.status": (
        [(f.conversations_status, {"event": f"MessageStatus::{k}"}) for k in STATUS_KINDS]
        + [(f.conversations_status, {"v2": True})],
        {
            "event",
            "messageId",
            "channel",
            "timestamp",
            "from",
            "to",
            "userContext",
            "details.code",
            "details.message",
            "status",
            "deliveryChannel",
            "appa.pricing",
        },
    ),
    "conversations.inbound": (
        [
            (
                f.conversations_inbound,
                {"kind": k, "channel": "whatsapp" if k != "sms" else None, "in_group": True},
            )
            for k in INBOUND_KINDS
        ],
        {
            "event",
            "messageId",
            "channel",
            "timestamp",
            "from",
            "to",
            "receivedAt",
            "groupId",
            "content.contentType",
            "content.text",
            "content.media.type",
            "content.media.url",
            "content.media.mediaId",
            "content.media.caption",
            "content.location",
            "content.contacts",
            "content.reaction",
            "context.messageId",
            "context.isForwarded",
            "whatsapp.senderName",
            "sms.origin.mcc",
            "sms.origin.mnc",
            "sms.origin.ttId",
            "sms.totalPrice",
            "sms.size",
            "sms.missingParts",
            "sms.parts",
            "postback.data",
            "order.catalogId",
            "order.text",
            "order.items",
        },
    ),
    "tts.event": (
        [(f.tts_event, {})],
        {
            "callId",
            "direction",
            "from",
            "to",
            "startTime",
            "answerTime",
            "endTime",
            "duration",
            "country",
            "rate",
            "price",
            "currency",
            "network",
            "status",
        },
    ),
}


@pytest.mark.parametrize("kind", sorted(DOCUMENTED))
def test_factories_carry_every_documented_field(kind: str) -> None:
    calls, expected = DOCUMENTED[kind]
    seen: set[str] = set()
    for factory, kwargs in calls:
        seen |= set(_paths(factory(rng=random.Random(3), **kwargs)))
    assert expected <= seen, sorted(expected - seen)


def _is_uuid4(value: str) -> bool:
    return uuid.UUID(value).version == 4


def _is_utc_iso(value: str) -> bool:
    moment = datetime.fromisoformat(value)
    return moment.utcoffset() == timedelta(0)


@pytest.mark.parametrize("seed", range(20))
def test_factory_values_are_realistic(seed: int) -> None:
    rng = random.Random(seed)
    inbound = f.sms_inbound(rng=rng)
    assert E164.match(inbound["from"]) and E164.match(inbound["to"])
    assert _is_uuid4(inbound["requestId"])
    assert re.fullmatch(r"\d{3}", inbound["originMCC"])
    assert re.fullmatch(r"\d{2,3}", inbound["originMNC"])
    assert all(_is_utc_iso(part["sentDate"]) for part in inbound["contentList"])
    assert {part["currency"] for part in inbound["contentList"]} == {"EUR"}

    dlr = f.sms_dlr(rng=rng)
    assert E164.match(dlr["to"]) and _is_uuid4(dlr["requestId"])
    assert isinstance(dlr["ttid"], int) and dlr["mccmnc"].startswith("262")
    assert _is_utc_iso(dlr["submitDate"]) and _is_utc_iso(dlr["doneDate"])
    assert dlr["submitDate"] < dlr["doneDate"]

    legacy = f.sms_dlr_legacy(stat="expired", rng=rng)
    assert E164.match(legacy["receiver"]) and _is_uuid4(legacy["msgid"])
    assert all(isinstance(value, str) for value in legacy.values())  # query parameters
    assert int(legacy["submitdate"]) < int(legacy["donedate"]) <= datetime.now().timestamp()
    assert legacy["mccmnc"] == legacy["ttid"] and legacy["err"] == "003"
    assert "donedate" not in f.sms_dlr_legacy(stat="buffered", rng=rng)

    gnp = f.numinfo_gnp(rng=rng)
    assert E164.match(gnp["msisdn"]) and re.fullmatch(r"[A-Z]{3}", gnp["country"])
    assert gnp["synchronous"] is False and gnp["currency"] == "EUR"

    gnv = f.numinfo_gnv(roaming=True, rng=rng)
    assert gnv["imsi"].startswith(gnv["imsiMCC"] + gnv["imsiMNC"]) and len(gnv["imsi"]) == 15
    assert gnv["hlr"].startswith(gnv["hlrCC"] + gnv["hlrNDC"])
    assert gnv["msc"].startswith(gnv["mscCC"] + gnv["mscNDC"])
    assert gnv["mscCountry"] != gnv["imsiCountry"] and gnv["roaming"] == "true"

    status = f.conversations_status(rng=rng)
    assert _is_uuid4(status["messageId"]) and _is_utc_iso(status["timestamp"])
    assert E164.match(status["from"]) and E164.match(status["to"])

    tts = f.tts_event(rng=rng)
    assert _is_uuid4(tts["callId"]) and re.fullmatch(r"[A-Z]{2}", tts["country"])
    assert tts["startTime"] < tts["answerTime"] < tts["endTime"]
    assert int(tts["duration"]) > 0 and float(tts["price"]) > 0


def test_sms_inbound_concatenated() -> None:
    payload = f.sms_inbound(parts=3, rng=random.Random(5))
    assert payload["size"] == 3 and payload["missingParts"] is False
    assert [part["sequenceNumber"] for part in payload["contentList"]] == [1, 2, 3]
    assert len(payload["message"]) > 2 * 152
    assert payload["totalPrice"] == pytest.approx(
        sum(part["price"] for part in payload["contentList"])
    )


def test_sms_inbound_missing_part() -> None:
    payload = f.sms_inbound(parts=3, missing_part=True, rng=random.Random(5))
    assert "<...>" in payload["message"]
    assert payload["missingParts"] is True and payload["size"] == 3
    assert len(payload["contentList"]) == 2  # the missing part has no record
    assert f.sms_inbound(missing_part=True, rng=random.Random(5))["size"] == 2


def test_sms_dlr_multipart() -> None:
    payload = f.sms_dlr(parts=3, status="UNDELIVERABLE", rng=random.Random(5))
    assert payload["size"] == 3 and len(payload["parts"]) == 3
    assert {part["deliveryState"] for part in payload["parts"]} == {"UNDELIVERABLE"}
    total = sum(float(part["price"]) for part in payload["parts"])
    assert float(payload["overallPrice"]) == pytest.approx(total)
    assert f.sms_dlr(status="BUFFERED", rng=random.Random(5))["doneDate"] is None


def test_conversations_inbound_kinds() -> None:
    rng = random.Random(9)
    assert f.conversations_inbound(kind="postback", rng=rng)["event"] == "MoMessage::Postback"
    assert f.conversations_inbound(kind="order", rng=rng)["event"] == "MoMessage::Order"
    sms = f.conversations_inbound(kind="sms", rng=rng)
    assert sms["channel"] == "sms" and "sms" in sms and "context" not in sms
    assert f.conversations_inbound(channel="viber", rng=rng)["viber"]["senderName"]
    with pytest.raises(ValueError, match="unknown inbound kind"):
        f.conversations_inbound(kind="telegram")


def test_conversations_event_has_no_message_id() -> None:
    payload = f.conversations_event(event="WhatsAppGroupEvent::joined", rng=random.Random(2))
    assert "messageId" not in payload
    assert ConversationsEvent.model_validate(payload).message_id is None


FACTORIES: list[Factory] = [
    f.sms_inbound,
    f.sms_dlr,
    f.sms_dlr_legacy,
    f.numinfo_gnp,
    f.numinfo_gnv,
    f.conversations_status,
    f.conversations_inbound,
    f.conversations_event,
    f.tts_event,
]


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda fn: fn.__name__)
def test_factories_are_deterministic_for_a_seed(factory: Factory) -> None:
    with freeze_time("2025-03-01T12:00:00Z"):
        first = factory(rng=random.Random(42))
        assert factory(rng=random.Random(42)) == first
        assert factory(rng=random.Random(43)) != first


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda fn: fn.__name__)
def test_factories_apply_overrides(factory: Factory) -> None:
    payload = factory({"extra.nested": "x", "channel": "custom"}, rng=random.Random(1))
    assert payload["extra"] == {"nested": "x"} and payload["channel"] == "custom"


# --- apply_overrides ------------------------------------------------------------------------


def test_apply_overrides_paths() -> None:
    base = {"content": {"text": "a"}, "contentList": [{"price": 1.0}], "n": 1}
    result = f.apply_overrides(
        base,
        {
            "content.text": "b",
            "contentList.0.price": 0.5,
            "contentList.1": {"price": 2.0},
            "new.deep.key": True,
            "n.sub": 2,
        },
    )
    assert result == {
        "content": {"text": "b"},
        "contentList": [{"price": 0.5}, {"price": 2.0}],
        "new": {"deep": {"key": True}},
        "n": {"sub": 2},
    }
    assert base == {"content": {"text": "a"}, "contentList": [{"price": 1.0}], "n": 1}
    assert f.apply_overrides(base, None) == base


def test_apply_overrides_remove() -> None:
    base = {"a": {"b": 1, "c": 2}, "items": [1, 2, 3]}
    result = f.apply_overrides(base, {"a.b": f.REMOVE, "items.-1": f.REMOVE, "x.y": f.REMOVE})
    assert result == {"a": {"c": 2}, "items": [1, 2]}


def test_apply_overrides_bad_index() -> None:
    with pytest.raises(IndexError):
        f.apply_overrides({"items": []}, {"items.3": 1})
    with pytest.raises(KeyError):
        f.apply_overrides({"items": []}, {"items.first": 1})


# --- tolerance: strings for numbers, numbers for strings, casing ---------------------------


def test_inbound_numbers_as_strings() -> None:
    payload = f.sms_inbound(
        {
            "totalPrice": "0.002",
            "size": "1",
            "missingParts": "false",
            "contentList.0.sequenceNumber": "1",
            "contentList.0.price": "0.002",
        },
        rng=random.Random(1),
    )
    model = InboundMessage.model_validate(payload)
    assert model.total_price == 0.002 and model.size == 1 and model.missing_parts is False
    assert model.content_list[0].sequence_number == 1
    assert model.content_list[0].price == 0.002
    assert set(model.to_stored()) == set(payload)


def test_inbound_get_variant_flat_query_parameters() -> None:
    params = {
        "from": "+4915112345678",
        "to": "+4915730000001",
        "message": "Hi",
        "requestId": "8f6c1a3e-2b1d-4c6f-9a51-3f0e1c2d4b5a",
        "originMCC": "262",
        "originMNC": "01",
        "originTtId": "26201",
        "totalPrice": "0.0",
        "size": "1",
        "missingParts": "false",
    }
    model = InboundMessage.model_validate(params)
    assert model.content_list == [] and model.total_price == 0.0
    assert model.to_stored() == {**params, "totalPrice": 0.0, "size": 1, "missingParts": False}


def test_dlr_ttid_variants() -> None:
    rng = random.Random(1)
    assert DeliveryReport.model_validate(f.sms_dlr({"ttid": "26201"}, rng=rng)).ttid == 26201
    stored = _validate(DeliveryReport, f.sms_dlr({"ttid": f.REMOVE, "ttId": 26202}, rng=rng))
    assert stored["ttid"] == 26202 and "ttId" not in stored
    assert DeliveryReport.model_validate(f.sms_dlr({"ttid": "TT-7"}, rng=rng)).ttid == "TT-7"
    assert DeliveryReport.model_validate(f.sms_dlr({"ttid": "026201"}, rng=rng)).ttid == "026201"


ID_CASES = [
    (InboundMessage, f.sms_inbound, "requestId"),
    (DeliveryReport, f.sms_dlr, "requestId"),
    (GnpResult, f.numinfo_gnp, "requestId"),
    (GnvResult, f.numinfo_gnv, "requestId"),
    (MessageStatus, f.conversations_status, "messageId"),
    (MoMessage, f.conversations_inbound, "messageId"),
    (TtsEvent, f.tts_event, "callId"),
]


@pytest.mark.parametrize(
    ("model", "factory", "key"), ID_CASES, ids=[c[0].__name__ for c in ID_CASES]
)
def test_ids_as_numbers_become_strings(
    model: type[PlatformPayload], factory: Factory, key: str
) -> None:
    assert _validate(model, factory({key: 12345}, rng=random.Random(1)))[key] == "12345"


def test_gnp_case_variants_land_on_canonical_names() -> None:
    payload = f.numinfo_gnp(
        {
            "ttid": f.REMOVE,
            "timezone": f.REMOVE,
            "ttId": 26201,
            "timeZone": "+01:00",
            "mcc": 262,
            "price": "0.005",
        },
        rng=random.Random(1),
    )
    model = GnpResult.model_validate(payload)
    assert model.ttid == "26201" and model.timezone == "+01:00" and model.mcc == "262"
    assert model.price == 0.005
    stored = model.to_stored()
    assert stored["ttid"] == "26201" and stored["timezone"] == "+01:00"  # a string in the schema
    assert "ttId" not in stored and "timeZone" not in stored


def test_gnv_case_variants_and_tristate_flags() -> None:
    payload = f.numinfo_gnv(
        {
            "nrhTimeZone": f.REMOVE,
            "nrhTimezone": "+01:00",
            "imsiTtId": f.REMOVE,
            "imsiTTID": 26203,
            "ported": "unknown",
            "roaming": False,
            "presence": "true",
        },
        rng=random.Random(1),
    )
    model = GnvResult.model_validate(payload)
    assert model.nrh_time_zone == "+01:00" and model.imsi_tt_id == "26203"
    assert (model.ported, model.roaming, model.presence) == ("unknown", False, "true")
    stored = model.to_stored()
    assert stored["nrhTimeZone"] == "+01:00" and stored["imsiTtId"] == "26203"
    assert "nrhTimezone" not in stored and "imsiTTID" not in stored


def test_exact_spelling_wins_over_a_case_variant() -> None:
    payload = f.numinfo_gnp({"ttid": "1", "ttId": "2"}, rng=random.Random(1))
    assert GnpResult.model_validate(payload).ttid == "1"


@pytest.mark.parametrize(
    ("model", "payload"),
    [
        (MoMessage, f.conversations_inbound({"event": "MoMessage::PostBack"}, kind="postback")),
        (MoMessage, f.conversations_inbound({"event": "momessage"})),
        (MessageStatus, f.conversations_status({"event": "MESSAGESTATUS::Delivered"})),
        (ConversationsEvent, f.conversations_event({"event": "call::STARTED"})),
    ],
)
def test_event_names_are_stored_as_received(
    model: type[PlatformPayload], payload: dict[str, Any]
) -> None:
    assert _validate(model, payload)["event"] == payload["event"]


# --- unknown fields are kept ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "factory", "kwargs", "extras"),
    [
        (InboundMessage, f.sms_inbound, {}, ["futureField", "contentList.0.futureField"]),
        (DeliveryReport, f.sms_dlr, {}, ["futureField", "parts.0.futureField"]),
        (LegacyDeliveryReport, f.sms_dlr_legacy, {}, ["futureField"]),
        (GnpResult, f.numinfo_gnp, {}, ["futureField"]),
        (GnvResult, f.numinfo_gnv, {}, ["futureField"]),
        (
            MessageStatus,
            f.conversations_status,
            {"event": "MessageStatus::failed"},
            ["futureField", "details.futureField", "appa.pricing"],
        ),
        (
            MoMessage,
            f.conversations_inbound,
            {"kind": "media", "channel": "whatsapp"},
            [
                "futureField",
                "content.media.futureField",
                "content.futureField",
                "context.futureField",
                "whatsapp.futureField",
            ],
        ),
        (
            MoMessage,
            f.conversations_inbound,
            {"kind": "sms"},
            ["sms.origin.futureField", "sms.parts.0.futureField", "sms.futureField"],
        ),
        (
            MoMessage,
            f.conversations_inbound,
            {"kind": "order"},
            ["order.futureField", "order.items.0.futureField", "postback.futureField"],
        ),
        (
            MoMessage,
            f.conversations_inbound,
            {"kind": "reaction"},
            ["content.reaction.futureField", "content.location.futureField"],
        ),
        (ConversationsEvent, f.conversations_event, {}, ["futureField", "call.futureField"]),
        (TtsEvent, f.tts_event, {}, ["futureField"]),
    ],
)
def test_unknown_fields_are_kept(
    model: type[PlatformPayload], factory: Factory, kwargs: dict[str, Any], extras: list[str]
) -> None:
    unknown = {path: {"any": [1, "two"]} for path in extras}
    payload = factory(unknown, rng=random.Random(1), **kwargs)
    stored = _validate(model, payload)
    assert stored == payload
    for path in extras:
        node: Any = stored
        for key in path.split("."):
            node = node[int(key)] if isinstance(node, list) else node[key]
        assert node == {"any": [1, "two"]}


def test_unknown_fields_are_readable_as_extras() -> None:
    payload = f.conversations_inbound({"content.media.width": 640}, kind="media")
    model = MoMessage.model_validate(payload)
    assert model.content is not None and model.content.media is not None
    assert model.content.media.model_extra == {"width": 640}


# --- required fields ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "factory", "path", "loc"),
    [
        (InboundMessage, f.sms_inbound, "from", ("from",)),
        (InboundMessage, f.sms_inbound, "to", ("to",)),
        (InboundMessage, f.sms_inbound, "message", ("message",)),
        (InboundMessage, f.sms_inbound, "requestId", ("requestId",)),
        (InboundMessage, f.sms_inbound, "contentList.0.msgId", ("contentList", 0, "msgId")),
        (InboundMessage, f.sms_inbound, "contentList.0.sentDate", ("contentList", 0, "sentDate")),
        (
            InboundMessage,
            f.sms_inbound,
            "contentList.0.sequenceNumber",
            ("contentList", 0, "sequenceNumber"),
        ),
        (DeliveryReport, f.sms_dlr, "requestId", ("requestId",)),
        (DeliveryReport, f.sms_dlr, "status", ("status",)),
        (LegacyDeliveryReport, f.sms_dlr_legacy, "msgid", ("msgid",)),
        (LegacyDeliveryReport, f.sms_dlr_legacy, "stat", ("stat",)),
        (GnpResult, f.numinfo_gnp, "requestId", ("requestId",)),
        (GnvResult, f.numinfo_gnv, "requestId", ("requestId",)),
        (ConversationsEvent, f.conversations_event, "event", ("event",)),
        (MessageStatus, f.conversations_status, "messageId", ("messageId",)),
        (MessageStatus, f.conversations_status, "event", ("event",)),
        (MoMessage, f.conversations_inbound, "messageId", ("messageId",)),
    ],
)
def test_missing_required_fields_are_named(
    model: type[PlatformPayload], factory: Factory, path: str, loc: tuple[Any, ...]
) -> None:
    payload = factory({path: f.REMOVE}, rng=random.Random(1))
    with pytest.raises(pydantic.ValidationError) as caught:
        model.model_validate(payload)
    assert [error["loc"] for error in caught.value.errors()] == [loc]


def test_empty_event_name_is_rejected() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        ConversationsEvent.model_validate({"event": "", "channel": "appa"})
    assert caught.value.errors()[0]["loc"] == ("event",)


def test_tts_event_fields_are_all_optional() -> None:
    assert TtsEvent.model_validate({}).to_stored() == {}
    assert TtsEvent.model_validate({"status": "ringing"}).to_stored() == {"status": "ringing"}
