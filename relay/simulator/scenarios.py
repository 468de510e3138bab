"""Scenarios: the platform's causal sequences of callbacks (one delivery report after another,
one call event after another), built from the payload factories."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from receivers.kinds import KINDS_BY_NAME
from relay.simulator import factories

Overrides = Mapping[str, Any]


@dataclass(frozen=True)
class Callback:
    """One callback the platform sends: its kind, receiver path and body."""

    kind: str
    body: dict[str, Any]
    label: str

    @property
    def path(self) -> str:
        """The receiver path relative to a source prefix (``/sms/dlr``; v3 for Conversations)."""
        return KINDS_BY_NAME[self.kind].paths[0]


Builder = Callable[[random.Random, Overrides], list[Callback]]


@dataclass(frozen=True)
class Scenario:
    """A named sequence of callbacks for one platform object (message, lookup, call)."""

    name: str
    summary: str
    build: Builder


def _sms_dlr(rng: random.Random, overrides: Overrides) -> list[Callback]:
    parts = rng.choice([1, 1, 1, 2, 3])
    ending = rng.choices(["DELIVERED", "REJECTED", "UNDELIVERABLE", "EXPIRED"], [7, 1, 1, 1])[0]
    states = ["ACCEPTED", "BUFFERED", ending] if ending != "REJECTED" else ["ACCEPTED", ending]
    first = factories.sms_dlr(overrides, status=states[0], parts=parts, rng=rng)
    fixed = {
        "requestId": first["requestId"],
        "reference": first["reference"],
        "from": first["from"],
        "to": first["to"],
        **overrides,
    }
    return [
        Callback("sms.dlr", factories.sms_dlr(fixed, status=state, parts=parts, rng=rng), state)
        for state in states
    ]


LEGACY_ENDINGS = {"delivered": 7, "not delivered": 1, "expired": 1, "rejected": 1}


def _sms_dlr_legacy(rng: random.Random, overrides: Overrides) -> list[Callback]:
    ending = rng.choices(list(LEGACY_ENDINGS), list(LEGACY_ENDINGS.values()))[0]
    states = ["buffered", ending] if ending != "rejected" else [ending]
    first = factories.sms_dlr_legacy(overrides, stat=states[0], rng=rng)
    same = ("msgid", "receiver", "sender", "text", "ttid", "mccmnc", "submitdate")
    fixed = {**{key: first[key] for key in same if key in first}, **overrides}
    return [
        Callback("sms.dlr", factories.sms_dlr_legacy(fixed, stat=state, rng=rng), state)
        for state in states
    ]


def _sms_inbound(rng: random.Random, overrides: Overrides) -> list[Callback]:
    variant = rng.choice(["single", "single", "concatenated", "missing-part"])
    body = factories.sms_inbound(
        overrides,
        parts=1 if variant == "single" else 3,
        missing_part=variant == "missing-part",
        rng=rng,
    )
    return [Callback("sms.inbound", body, variant)]


def _numinfo(kind: str, factory: Callable[..., dict[str, Any]]) -> Builder:
    def build(rng: random.Random, overrides: Overrides) -> list[Callback]:
        body = factory({"synchronous": False, **overrides}, ported=rng.random() < 0.2, rng=rng)
        return [Callback(kind, body, "result")]

    return build


STATUS_PATHS = {
    "delivered": ["accepted", "dispatched", "delivered", "seen"],
    "channel-failed": ["accepted", "channelFailed"],
    "failed": ["accepted", "failed"],
    "deleted": ["accepted", "delivered", "deleted"],
}


def _conversations_status(rng: random.Random, overrides: Overrides) -> list[Callback]:
    channel = str(overrides.get("channel") or rng.choice(["appa", "appb", "sms"]))
    path = rng.choices(list(STATUS_PATHS), [6, 2, 1, 1])[0]
    steps = [s for s in STATUS_PATHS[path] if not (channel == "sms" and s == "seen")]
    first = factories.conversations_status(
        overrides, event=f"MessageStatus::{steps[0]}", channel=channel, rng=rng
    )
    fixed = {
        "messageId": first["messageId"],
        "from": first["from"],
        "to": first["to"],
        "userContext": first["userContext"],
        **overrides,
    }
    return [
        Callback(
            "conversations.status",
            factories.conversations_status(
                fixed, event=f"MessageStatus::{step}", channel=channel, rng=rng
            ),
            step,
        )
        for step in steps
    ]


def _conversations_inbound(rng: random.Random, overrides: Overrides) -> list[Callback]:
    variant = rng.choice(["text", "media", "postback", "order", "sms"])
    body = factories.conversations_inbound(overrides, kind=variant, rng=rng)
    return [Callback("conversations.inbound", body, variant)]


TTS_PATHS = {
    "completed": ["started", "ringing", "early", "completed"],
    "hangup": ["started", "ringing", "hangup"],
}


def _tts_call(rng: random.Random, overrides: Overrides) -> list[Callback]:
    ending = rng.choices(list(TTS_PATHS), [4, 1])[0]
    first = factories.tts_event(overrides, status="started", rng=rng)
    fixed = {
        "callId": first["callId"],
        "from": first["from"],
        "to": first["to"],
        "direction": first["direction"],
        **overrides,
    }
    return [
        Callback("tts.event", factories.tts_event(fixed, status=status, rng=rng), status)
        for status in TTS_PATHS[ending]
    ]


SCENARIOS: Mapping[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "sms-dlr",
            "delivery reports of one SMS: ACCEPTED -> BUFFERED -> DELIVERED, "
            "or REJECTED/UNDELIVERABLE/EXPIRED; multipart with parts",
            _sms_dlr,
        ),
        Scenario(
            "sms-dlr-legacy",
            "the older SMS interface's reports (msgid, stat; its own shape, GET with "
            "--method GET): buffered -> delivered, or not delivered/expired/rejected",
            _sms_dlr_legacy,
        ),
        Scenario(
            "sms-inbound",
            "an inbound SMS: single, concatenated (3 parts), or a part missing after 10 min",
            _sms_inbound,
        ),
        Scenario(
            "numinfo-gnp",
            "a portability check result posted to callbackUrl",
            _numinfo("numinfo.gnp", factories.numinfo_gnp),
        ),
        Scenario(
            "numinfo-gnv",
            "an HLR lookup result posted to callbackUrl",
            _numinfo("numinfo.gnv", factories.numinfo_gnv),
        ),
        Scenario(
            "conversations-status",
            "MessageStatus accepted -> delivered -> seen, "
            "channelFailed, failed with details, or deleted",
            _conversations_status,
        ),
        Scenario(
            "conversations-inbound",
            "a MoMessage: text, media, postback, order, or on the SMS channel",
            _conversations_inbound,
        ),
        Scenario(
            "tts-call", "call events started -> ringing -> early -> completed, or hangup", _tts_call
        ),
    ]
}
