"""The kind registry: one table saying, per event kind, where it arrives and how it is keyed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel

from receivers.payloads.conversations import ConversationsEvent, MessageStatus, MoMessage
from receivers.payloads.numinfo import GnpResult, GnvResult
from receivers.payloads.sms import DeliveryReport, InboundMessage, LegacyDeliveryReport
from receivers.payloads.tts import TtsEvent

Matcher = Callable[[Mapping[str, Any]], bool]

INBOUND_EVENTS = frozenset({"momessage", "momessage::postback", "momessage::order"})


def _event_name(body: Mapping[str, Any]) -> str:
    value = body.get("event")
    return value.lower() if isinstance(value, str) else ""


def _is_status(body: Mapping[str, Any]) -> bool:
    return _event_name(body).startswith("messagestatus::")


def _is_inbound(body: Mapping[str, Any]) -> bool:
    return _event_name(body) in INBOUND_EVENTS


def _is_legacy_dlr(body: Mapping[str, Any]) -> bool:
    """The older SMS interface's report: ``msgid``/``stat`` and no ``requestId``."""
    return "requestId" not in body and ("msgid" in body or "stat" in body)


def _always(body: Mapping[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class Kind:
    """One event kind: its receiver paths and methods, payload model, dedup key and policy.

    ``paths`` are relative to a source's prefix (``/hooks`` or ``/hooks/{source}``). Kinds that
    share a path are told apart by ``matches`` on the decoded body, in table order.
    ``dedup_fields`` are wire field names joined into the dedup key; when one is missing, the
    body hash is the key. ``case_insensitive`` names dedup fields compared without letter case.
    ``variant`` names a second shape of a kind (its own model and dedup key, stored under the
    same kind name); such a row comes before the kind's canonical row (``variant`` empty), which
    is the one :data:`KINDS_BY_NAME` gives.
    """

    name: str
    paths: tuple[str, ...]
    methods: tuple[str, ...]
    model: type[BaseModel]
    dedup_fields: tuple[str, ...]
    default_policy: str
    policy_by_channel: Mapping[str, str] = field(default_factory=dict)
    case_insensitive: frozenset[str] = frozenset()
    matches: Matcher = _always
    variant: str = ""

    def policy_for(self, payload: Mapping[str, Any]) -> str:
        """The platform's retry policy for this kind (some depend on the channel)."""
        channel = payload.get("channel")
        if isinstance(channel, str):
            return self.policy_by_channel.get(channel.lower(), self.default_policy)
        return self.default_policy


CONVERSATIONS_PATHS = ("/conversations", "/chat-api")

KINDS: tuple[Kind, ...] = (
    Kind(
        "sms.inbound",
        ("/sms/inbound",),
        ("POST", "GET"),
        InboundMessage,
        ("requestId",),
        "platform-sms",
    ),
    Kind(
        "sms.dlr",
        ("/sms/dlr",),
        ("POST", "GET"),
        LegacyDeliveryReport,
        ("msgid", "stat"),
        "standard",
        case_insensitive=frozenset({"stat"}),
        matches=_is_legacy_dlr,
        variant="legacy",
    ),
    Kind(
        "sms.dlr",
        ("/sms/dlr",),
        ("POST", "GET"),
        DeliveryReport,
        ("requestId", "status"),
        "standard",
        case_insensitive=frozenset({"status"}),
    ),
    Kind(
        "numinfo.gnp", ("/numinfo/gnp",), ("POST",), GnpResult, ("requestId",), "platform-numinfo"
    ),
    Kind(
        "numinfo.gnv", ("/numinfo/gnv",), ("POST",), GnvResult, ("requestId",), "platform-numinfo"
    ),
    Kind(
        "conversations.status",
        CONVERSATIONS_PATHS,
        ("POST",),
        MessageStatus,
        ("messageId", "event"),
        "platform-status",
        case_insensitive=frozenset({"event"}),
        matches=_is_status,
    ),
    Kind(
        "conversations.inbound",
        CONVERSATIONS_PATHS,
        ("POST",),
        MoMessage,
        ("messageId", "event"),
        "platform-appa",
        policy_by_channel={"sms": "platform-sms"},
        case_insensitive=frozenset({"event"}),
        matches=_is_inbound,
    ),
    Kind(
        "conversations.event",
        CONVERSATIONS_PATHS,
        ("POST",),
        ConversationsEvent,
        ("messageId", "event"),
        "standard",
        case_insensitive=frozenset({"event"}),
    ),
    Kind(
        "tts.event",
        ("/tts/events",),
        ("POST",),
        TtsEvent,
        ("callId", "status"),
        "standard",
        case_insensitive=frozenset({"status"}),
    ),
)

KINDS_BY_NAME: Mapping[str, Kind] = {kind.name: kind for kind in KINDS if not kind.variant}
"""The canonical row of each kind (variants share its name, path and policy)."""

RESERVED_SOURCE_NAMES = frozenset(
    path.strip("/").split("/")[0] for kind in KINDS for path in kind.paths
)


def kinds_matching(pattern: str) -> list[str]:
    """The names of the kinds a glob matches, in table order (``"sms.*"``: ``sms.inbound``,
    ``sms.dlr``); letter case counts. Destinations' ``kinds`` and `relay events list --kind`
    read their globs so."""
    return [name for name in KINDS_BY_NAME if fnmatchcase(name, pattern)]


def kinds_by_path() -> dict[str, list[Kind]]:
    """Group the table by relative path, keeping table order for dispatch."""
    grouped: dict[str, list[Kind]] = {}
    for kind in KINDS:
        for path in kind.paths:
            grouped.setdefault(path, []).append(kind)
    return grouped


def kind_for(name: str, body: Mapping[str, Any]) -> Kind:
    """The row a receiver picks for a body of the kind ``name``: a variant whose ``matches``
    takes the body, else the canonical row."""
    for kind in KINDS:
        if kind.name == name and kind.variant and kind.matches(body):
            return kind
    return KINDS_BY_NAME[name]
