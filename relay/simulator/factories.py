"""Realistic platform callback payloads, one factory per kind, deterministic given an ``rng``."""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

__all__ = [
    "REMOVE",
    "apply_overrides",
    "conversations_event",
    "conversations_inbound",
    "conversations_status",
    "numinfo_gnp",
    "numinfo_gnv",
    "sms_dlr",
    "sms_dlr_legacy",
    "sms_inbound",
    "tts_event",
]


class _Remove:
    """The type of :data:`REMOVE`."""

    def __repr__(self) -> str:
        return "REMOVE"


REMOVE: Final = _Remove()
"""An override value that deletes the key at its path instead of setting it."""


def apply_overrides(
    payload: Mapping[str, Any], overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A deep copy of ``payload`` with each dotted path of ``overrides`` set to its value.

    ``"content.text"`` sets a nested key, creating dicts as needed; numeric segments index lists
    (``"contentList.0.price"``; the index equal to the length appends). The value :data:`REMOVE`
    deletes the key.
    """
    result = copy.deepcopy(dict(payload))
    for path, value in (overrides or {}).items():
        _set_path(result, path, value)
    return result


def _overridden(payload: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """:func:`apply_overrides` on a payload a factory has just built, in place: nothing else
    holds it, so the deep copy (most of a factory's cost) is saved."""
    for path, value in (overrides or {}).items():
        _set_path(payload, path, value)
    return payload


def _set_path(root: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = root
    for key in parents:
        if isinstance(node, list):
            index = _index(node, key, path, creating=value is not REMOVE)
            if index == len(node):
                node.append({})
            child = node[index]
            if not isinstance(child, dict | list):
                child = node[index] = {}
        else:
            child = node.get(key)
            if not isinstance(child, dict | list):
                if value is REMOVE:
                    return
                child = node[key] = {}
        node = child
    if isinstance(node, list):
        index = _index(node, last, path, creating=value is not REMOVE)
        if value is REMOVE:
            if index < len(node):
                del node[index]
        elif index == len(node):
            node.append(copy.deepcopy(value))
        else:
            node[index] = copy.deepcopy(value)
    elif value is REMOVE:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


def _index(node: list[Any], key: str, path: str, *, creating: bool) -> int:
    try:
        index = int(key)
    except ValueError:
        raise KeyError(f"{path!r}: {key!r} is not a list index") from None
    if index < 0:
        index += len(node)
    if not 0 <= index <= len(node) or (index == len(node) and not creating):
        raise IndexError(f"{path!r}: index {key} out of range (list of {len(node)})")
    return index


# --- realistic building blocks ---------------------------------------------------------------


_ALPHA2 = {"DEU": "DE", "GBR": "GB", "FRA": "FR", "ITA": "IT"}


@dataclass(frozen=True)
class _Operator:
    mcc: str
    mnc: str
    name: str
    country3: str
    cc: str
    ndcs: str  # space-separated national destination codes of its mobile ranges
    subscriber_digits: int
    timezone: str = "+01:00"
    technology: str = "GSM"

    @property
    def ttid(self) -> int:
        return int(self.mcc + self.mnc)

    @property
    def country2(self) -> str:
        return _ALPHA2[self.country3]

    def number(self, rng: random.Random) -> str:
        """An E.164 number in one of this operator's ranges."""
        digits = "".join(str(rng.randrange(10)) for _ in range(self.subscriber_digits))
        return f"+{self.cc}{rng.choice(self.ndcs.split())}{digits}"

    def node(self, rng: random.Random) -> tuple[str, str, str]:
        """(CC, NDC, global title) of a network node (HLR, MSC) of this operator."""
        ndc = self.ndcs.split()[0]
        return self.cc, ndc, f"{self.cc}{ndc}{rng.randrange(10**6):06d}"


_DE = [
    _Operator("262", "01", "Telekom Deutschland GmbH", "DEU", "49", "151 160 170 171 175", 8),
    _Operator("262", "02", "Vodafone GmbH", "DEU", "49", "152 162 172 173 174", 8),
    _Operator("262", "03", "Telefonica Germany GmbH & Co. OHG", "DEU", "49", "159 176 177 178", 8),
]
_ABROAD = [
    _Operator("234", "15", "Vodafone Limited", "GBR", "44", "7700 7787", 6, timezone="+00:00"),
    _Operator("208", "01", "Orange", "FRA", "33", "6", 8),
    _Operator("222", "01", "Telecom Italia", "ITA", "39", "330 335", 7),
]

_SHORT_TEXTS = [
    "Hi, can you confirm my appointment for tomorrow at 10:30?",
    "Yes, please leave the parcel with my neighbour.",
    "Ich komme heute etwas später, bitte warten.",
    "What are your opening hours on Saturday?",
    "STOP",
    "Thanks, received!",
]
_SENTENCES = [
    "Hello, I ordered a replacement charger last week and it still has not arrived.",
    "The tracking page says it was handed to the courier on Monday.",
    "Could you check where it is and let me know the new delivery date?",
    "If it is lost, please send another one or refund the order.",
    "My order number is 4711-0815 and the address is unchanged.",
    "Thank you for your help and have a nice day.",
]
_NAMES = ["Max Mustermann", "Erika Mustermann", "Jan Schmidt", "Lena Fischer", "Tom Becker"]
_SENDER_IDS = ["ACME", "Shop24", "MyBank"]
_GSM_PART = 152  # characters per part of a concatenated GSM-7 message
_MISSING = "<...>"


def _rng(rng: random.Random | None) -> random.Random:
    return random.Random() if rng is None else rng


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _now(rng: random.Random, max_age_s: int = 5) -> datetime:
    """A moment shortly before now (the event happened, then the platform called back)."""
    return datetime.now(UTC) - timedelta(milliseconds=rng.randrange(max_age_s * 1000))


def _price_effective() -> str:
    """The first day of the current month, from which a price applies."""
    today = datetime.now(UTC)
    return _iso(today.replace(day=1, hour=0, minute=0, second=0, microsecond=0))


def _long_text(rng: random.Random, parts: int) -> list[str]:
    """Text needing exactly ``parts`` concatenated parts, split as the handset would."""
    if parts == 1:
        return [rng.choice(_SHORT_TEXTS)]
    lower, upper = _GSM_PART * (parts - 1) + 1, _GSM_PART * parts
    target = lower + rng.randrange(60)
    words: list[str] = []
    while len(" ".join(words)) < target:
        words.extend(rng.choice(_SENTENCES).split())
    while len(" ".join(words)) > upper:
        words.pop()
    text = " ".join(words)
    return [text[i : i + _GSM_PART] for i in range(0, len(text), _GSM_PART)]


# --- SMS -------------------------------------------------------------------------------------


def sms_inbound(
    overrides: Mapping[str, Any] | None = None,
    *,
    parts: int = 1,
    missing_part: bool = False,
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """An ``sms.inbound`` InboundMessage.

    ``parts`` > 1 makes a concatenated message (``size`` = parts, one contentList entry per part).
    ``missing_part`` drops one part (at least 2 parts then): its text becomes ``<...>``, it has
    no contentList entry and ``missingParts`` is true.
    """
    rng = _rng(rng)
    if parts < 1:
        raise ValueError("parts must be at least 1")
    if missing_part:
        parts = max(parts, 2)
    origin, home = rng.choice(_DE + _ABROAD), rng.choice(_DE)
    chunks = _long_text(rng, parts)
    missing = rng.randrange(parts) if missing_part else None
    if missing is not None:
        chunks[missing] = _MISSING
    price_effective = _price_effective()
    first_sent = _now(rng) - timedelta(seconds=rng.randrange(2, 30))
    part_price = rng.choice([0.0, 0.0, 0.002, 0.005])
    content_list = [
        {
            "msgId": _uuid(rng),
            "sentDate": _iso(first_sent + timedelta(milliseconds=rng.randrange(800) * seq)),
            "sequenceNumber": seq + 1,
            "price": part_price,
            "currency": "EUR",
            "priceEffective": price_effective,
        }
        for seq in range(parts)
        if seq != missing
    ]
    payload = {
        "from": origin.number(rng),
        "to": home.number(rng),
        "message": "".join(chunks),
        "originMCC": origin.mcc,
        "originMNC": origin.mnc,
        "originTtId": str(origin.ttid),
        "totalPrice": round(part_price * len(content_list), 6),
        "requestId": _uuid(rng),
        "size": parts,
        "missingParts": missing is not None,
        "contentList": content_list,
    }
    return _overridden(payload, overrides)


# (errorCode, errorReason, charged) per delivery state; the platform's codes are not published,
# these are illustrative.
_DLR_OUTCOMES: dict[str, tuple[str | None, str | None, bool]] = {
    "ACCEPTED": (None, None, True),
    "BUFFERED": (None, None, True),
    "DELIVERED": ("000", "Delivered", True),
    "EXPIRED": ("003", "Validity period expired", True),
    "REJECTED": ("102", "Insufficient funds", False),
    "UNDELIVERABLE": ("001", "Unknown subscriber", True),
}
_PENDING = {"ACCEPTED", "BUFFERED"}


def sms_dlr(
    overrides: Mapping[str, Any] | None = None,
    *,
    status: str = "DELIVERED",
    parts: int = 1,
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """An ``sms.dlr`` delivery report (the message status object) with ``parts`` part records."""
    rng = _rng(rng)
    if parts < 1:
        raise ValueError("parts must be at least 1")
    operator = rng.choice(_DE)
    request_id = _uuid(rng)
    error_code, error_reason, charged = _DLR_OUTCOMES.get(status.upper(), (None, None, True))
    done = _now(rng)
    submitted = done - timedelta(seconds=rng.randrange(2, 20))
    done_date = None if status.upper() in _PENDING else _iso(done)
    unit_price = rng.choice([0.039, 0.045, 0.052]) if charged else 0.0
    price_effective = _price_effective()
    part_records = [
        {
            "partId": _uuid(rng),
            "deliveryState": status,
            "doneDate": done_date,
            "errorCode": error_code,
            "price": f"{unit_price:.4f}",
            "currency": "EUR",
            "priceEffective": price_effective,
            "statusText": error_reason,
        }
        for _ in range(parts)
    ]
    payload = {
        "requestId": request_id,
        "status": status,
        "reference": f"order-{rng.randrange(10000, 99999)}",
        "from": rng.choice([*_SENDER_IDS, operator.number(rng)]),
        "to": operator.number(rng),
        "href": f"https://api.example.com/messaging/v1/messages/{request_id}",
        "submitDate": _iso(submitted),
        "sentDate": _iso(submitted + timedelta(milliseconds=rng.randrange(100, 900))),
        "doneDate": done_date,
        "errorCode": error_code,
        "errorReason": error_reason,
        "mccmnc": operator.mcc + operator.mnc,
        "ttid": operator.ttid,
        "size": parts,
        "overallPrice": f"{unit_price * parts:.4f}",
        "priceEffective": price_effective,
        "parts": part_records,
    }
    return _overridden(payload, overrides)


# (err, charged) per state of the older SMS interface; illustrative codes, as above.
_LEGACY_OUTCOMES: dict[str, tuple[str | None, bool]] = {
    "buffered": (None, True),
    "delivered": ("000", True),
    "expired": ("003", True),
    "rejected": ("102", False),
    "not delivered": ("001", True),
}


def sms_dlr_legacy(
    overrides: Mapping[str, Any] | None = None,
    *,
    stat: str = "delivered",
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """An ``sms.dlr`` delivery report of the older SMS interface: its own flat field names,
    every value text (it is sent as GET query parameters); ``submitdate`` and ``donedate`` in
    Unix seconds. ``stat`` is delivered, not delivered, expired, rejected or buffered; a
    buffered report has no ``donedate`` or ``err`` yet."""
    rng = _rng(rng)
    operator = rng.choice(_DE)
    err, charged = _LEGACY_OUTCOMES.get(stat.lower(), (None, True))
    done = _now(rng)
    submitted = done - timedelta(seconds=rng.randrange(2, 20))
    payload = {
        "msgid": _uuid(rng),
        "stat": stat,
        "receiver": operator.number(rng),
        "sender": rng.choice(_SENDER_IDS),
        "text": rng.choice(_SHORT_TEXTS),
        "ttid": str(operator.ttid),
        "mccmnc": operator.mcc + operator.mnc,
        "err": err,
        "submitdate": str(int(submitted.timestamp())),
        "donedate": None if stat.lower() == "buffered" else str(int(done.timestamp())),
        "price": f"{rng.choice([0.039, 0.045, 0.052]) if charged else 0.0:.4f}",
        "currency": "EUR",
        "priceEffective": _price_effective(),
    }
    payload = {key: value for key, value in payload.items() if value is not None}
    return _overridden(payload, overrides)


# --- number information ----------------------------------------------------------------------


def _numinfo_common(rng: random.Random, msisdn: str, ported: bool, price: float) -> dict[str, Any]:
    return {
        "requestId": _uuid(rng),
        "msisdn": msisdn,
        "ported": "true" if ported else "false",
        "price": price,
        "currency": "EUR",
        "priceEffective": _price_effective(),
        "errorCode": None,
        "synchronous": False,
    }


def _other(rng: random.Random, operators: list[_Operator], than: _Operator) -> _Operator:
    return rng.choice([op for op in operators if op != than])


def numinfo_gnp(
    overrides: Mapping[str, Any] | None = None,
    *,
    ported: bool = False,
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """A ``numinfo.gnp`` portability check result, as posted to the lookup's callbackUrl."""
    rng = _rng(rng)
    range_holder = rng.choice(_DE)
    current = _other(rng, _DE, range_holder) if ported else range_holder
    payload = _numinfo_common(rng, range_holder.number(rng), ported, 0.005)
    payload |= {
        "mcc": current.mcc,
        "mnc": current.mnc,
        "ttid": str(current.ttid),  # a string in the schema (some examples show an integer)
        "operator": current.name,
        "country": current.country3,
        "timezone": current.timezone,
        "technology": current.technology,
    }
    return _overridden(payload, overrides)


def _group(prefix: str, op: _Operator) -> dict[str, str]:
    return {
        f"{prefix}MCC": op.mcc,
        f"{prefix}MNC": op.mnc,
        f"{prefix}TtId": str(op.ttid),
        f"{prefix}Operator": op.name,
        f"{prefix}Country": op.country3,
        f"{prefix}TimeZone": op.timezone,
        f"{prefix}Technology": op.technology,
    }


def numinfo_gnv(
    overrides: Mapping[str, Any] | None = None,
    *,
    ported: bool = False,
    roaming: bool = False,
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """A ``numinfo.gnv`` HLR lookup result with its nrh, imsi, hlr and msc groups."""
    rng = _rng(rng)
    range_holder = rng.choice(_DE)
    subscription = _other(rng, _DE, range_holder) if ported else range_holder
    visited = rng.choice(_ABROAD) if roaming else subscription
    hlr_cc, hlr_ndc, hlr = subscription.node(rng)
    msc_cc, msc_ndc, msc = visited.node(rng)
    payload = _numinfo_common(rng, range_holder.number(rng), ported, 0.01)
    payload |= {"roaming": "true" if roaming else "false", "presence": "true"}
    payload |= _group("nrh", range_holder)
    payload |= {"imsi": f"{subscription.mcc}{subscription.mnc}{rng.randrange(10**10):010d}"}
    payload |= _group("imsi", subscription)
    payload |= {"hlrCC": hlr_cc, "hlrNDC": hlr_ndc, "hlr": hlr} | _group("hlr", subscription)
    payload |= {"mscCC": msc_cc, "mscNDC": msc_ndc, "msc": msc} | _group("msc", visited)
    return _overridden(payload, overrides)


# --- Conversations ---------------------------------------------------------------------------


def _conversation_parties(rng: random.Random) -> tuple[str, str]:
    """(customer, business) E.164 numbers."""
    return rng.choice(_DE + _ABROAD).number(rng), rng.choice(_DE).number(rng)


def conversations_status(
    overrides: Mapping[str, Any] | None = None,
    *,
    event: str = "MessageStatus::delivered",
    channel: str = "appa",
    v2: bool = False,
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """A ``conversations.status`` MessageStatus event (v3; ``v2=True`` for the chat-api shape).

    Failures carry ``details``; delivered carries the channel block with pricing (not on sms);
    deleted carries the deprecated ``status``; v2 adds ``status``, ``deliveryChannel`` and an
    integer ``from``.
    """
    rng = _rng(rng)
    customer, business = _conversation_parties(rng)
    kind = event.split("::", 1)[-1]
    payload: dict[str, Any] = {
        "event": event,
        "messageId": _uuid(rng),
        "channel": channel,
        "timestamp": _iso(_now(rng)),
        "from": business,
        "to": customer,
        "userContext": f"order-{rng.randrange(10000, 99999)}",
    }
    if kind.lower() in {"channelfailed", "failed"}:
        payload["details"] = {
            "code": f"{channel}::external::131026",
            "message": "Message undeliverable: the recipient cannot receive this message",
        }
    if kind.lower() == "delivered" and channel.lower() != "sms":
        payload[channel] = {
            "pricing": {"billable": True, "pricingModel": "PMP", "category": "utility"}
        }
    if kind.lower() == "deleted" or v2:
        payload["status"] = kind
    if v2:
        payload["deliveryChannel"] = channel
        payload["from"] = int(business.lstrip("+"))
    return _overridden(payload, overrides)


_INBOUND_KINDS = ("text", "media", "location", "contacts", "reaction", "postback", "order", "sms")


def _inbound_content(kind: str, rng: random.Random) -> dict[str, Any] | None:
    if kind in {"text", "sms"}:
        return {"contentType": "text", "text": rng.choice(_SHORT_TEXTS)}
    if kind == "media":
        media_id = _uuid(rng)
        return {
            "contentType": "media",
            "media": {
                "type": "image",
                "url": f"https://api.example.com/conversations/v3/media/{media_id}",
                "mediaId": media_id,
                "caption": "Photo of the damaged parcel",
            },
        }
    if kind == "location":
        return {
            "contentType": "location",
            "location": {
                "latitude": 52.520008,
                "longitude": 13.404954,
                "name": "Alexanderplatz",
                "address": "Alexanderplatz, 10178 Berlin",
            },
        }
    if kind == "contacts":
        first, last = rng.choice(_NAMES).split()
        return {
            "contentType": "contacts",
            "contacts": [
                {
                    "name": {
                        "formattedName": f"{first} {last}",
                        "firstName": first,
                        "lastName": last,
                    },
                    "phones": [{"phone": rng.choice(_DE).number(rng), "type": "CELL"}],
                }
            ],
        }
    if kind == "reaction":
        return {
            "contentType": "reaction",
            "reaction": {"messageId": _uuid(rng), "emoji": "\N{THUMBS UP SIGN}"},
        }
    if kind == "postback":
        return {"contentType": "text", "text": "Yes, confirm"}
    return None  # an order carries its own block


def _sms_block(rng: random.Random) -> dict[str, Any]:
    origin = rng.choice(_DE)
    price = rng.choice([0.0, 0.002])
    return {
        "origin": {"mcc": origin.mcc, "mnc": origin.mnc, "ttId": str(origin.ttid)},
        "totalPrice": price,
        "size": 1,
        "missingParts": False,
        "parts": [
            {
                "messageId": _uuid(rng),
                "sentDate": _iso(_now(rng, 30)),
                "sequenceNumber": 1,
                "price": price,
                "currency": "EUR",
                "priceEffective": _price_effective(),
            }
        ],
    }


def conversations_inbound(
    overrides: Mapping[str, Any] | None = None,
    *,
    kind: str = "text",
    channel: str | None = None,
    in_group: bool = False,
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """A ``conversations.inbound`` MoMessage (``MoMessage::Postback``/``::Order`` by ``kind``).

    ``kind`` is one of text, media, location, contacts, reaction, postback, order, sms ("sms" is
    text on the sms channel). ``channel`` defaults to "appa" ("sms" for kind sms); the channel
    block is keyed by the channel name: ``sms`` {origin, totalPrice, ...} on the sms channel,
    otherwise {senderName}. ``in_group`` adds a ``groupId``.
    """
    if kind not in _INBOUND_KINDS:
        raise ValueError(f"unknown inbound kind {kind!r}; expected one of {_INBOUND_KINDS}")
    rng = _rng(rng)
    channel = channel or ("sms" if kind == "sms" else "appa")
    customer, business = _conversation_parties(rng)
    event = {"postback": "MoMessage::Postback", "order": "MoMessage::Order"}.get(kind, "MoMessage")
    timestamp = _iso(_now(rng))
    payload: dict[str, Any] = {
        "event": event,
        "messageId": _uuid(rng),
        "channel": channel,
        "from": customer,
        "to": business,
        "timestamp": timestamp,
        "receivedAt": timestamp,
    }
    content = _inbound_content(kind, rng)
    if content is not None:
        payload["content"] = content
    if kind == "postback":
        payload["postback"] = {"data": "appointment:confirm"}
    if kind == "order":
        payload["order"] = {
            "catalogId": str(rng.randrange(10**15, 10**16)),
            "text": "Please deliver by Friday",
            "items": [
                {
                    "productRetailerId": "SKU-1001",
                    "quantity": 2,
                    "itemPrice": 12.5,
                    "currency": "EUR",
                },
                {
                    "productRetailerId": "SKU-2040",
                    "quantity": 1,
                    "itemPrice": 4.99,
                    "currency": "EUR",
                },
            ],
        }
    if channel.lower() == "sms":
        payload["sms"] = _sms_block(rng)
    else:
        payload["context"] = {"isForwarded": False}
        if kind == "postback":
            payload["context"]["messageId"] = _uuid(rng)
        payload[channel] = {"senderName": rng.choice(_NAMES)}
    if in_group:
        payload["groupId"] = _uuid(rng)
    return _overridden(payload, overrides)


def conversations_event(
    overrides: Mapping[str, Any] | None = None,
    *,
    event: str = "Call::started",
    channel: str = "appa",
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """A ``conversations.event``: any other event (Call::*, Coexistence::*, ...), no messageId.

    The bodies of these events are not documented; Call and CallStatus events get a ``call``
    block, others only the common fields.
    """
    rng = _rng(rng)
    customer, business = _conversation_parties(rng)
    payload: dict[str, Any] = {
        "event": event,
        "channel": channel,
        "timestamp": _iso(_now(rng)),
        "from": customer,
        "to": business,
    }
    if event.split("::", 1)[0].lower() in {"call", "callstatus"}:
        payload["call"] = {
            "callId": _uuid(rng),
            "direction": "inbound",
            "status": event.split("::", 1)[-1],
        }
    return _overridden(payload, overrides)


# --- text-to-speech --------------------------------------------------------------------------


def tts_event(
    overrides: Mapping[str, Any] | None = None,
    *,
    status: str = "completed",
    direction: str = "outbound",
    rng: random.Random | None = None,
) -> dict[str, Any]:
    """A ``tts.event`` call event; times, duration and price follow ``status``.

    started/early/ringing: no answer or end yet; hangup: ended unanswered; completed: answered
    and ended, charged per started minute.
    """
    rng = _rng(rng)
    operator = rng.choice(_DE)
    customer, business = operator.number(rng), rng.choice(_DE).number(rng)
    caller, callee = (business, customer) if direction == "outbound" else (customer, business)
    answered = status == "completed"
    ended = status in {"completed", "hangup"}
    seconds = rng.randrange(8, 180) if answered else 0
    end = _now(rng)
    answer = end - timedelta(seconds=seconds)
    start = answer - timedelta(seconds=rng.randrange(3, 15))
    rate = rng.choice([0.03, 0.045, 0.06])
    minutes = -(-seconds // 60)
    payload = {
        "callId": _uuid(rng),
        "direction": direction,
        "from": caller,
        "to": callee,
        "startTime": _iso(start),
        "answerTime": _iso(answer) if answered else None,
        "endTime": _iso(end) if ended else None,
        "duration": str(seconds) if ended else None,
        "country": operator.country2,
        "rate": f"{rate:.4f}",
        "price": f"{rate * minutes:.4f}" if ended else None,
        "currency": "EUR",
        "network": operator.name,
        "status": status,
    }
    return _overridden(payload, overrides)
