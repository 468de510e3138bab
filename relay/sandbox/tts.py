"""Text-to-speech calls: ``POST /tts/v1/calls`` starts a call whose events (started, ringing,
early, then completed, or hangup when nobody answers) happen on the sandbox's clock; each is
listed by ``GET /tts/v1/calls/{callId}/events`` once it happened and, with an eventsUrl,
POSTed there (one event per request, on the ``standard`` policy: the platform documents no
retries for call events)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from receivers.kinds import KINDS_BY_NAME
from relay.sandbox import checks, numbers
from relay.sandbox.room import make_room
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.sms_request import invalid
from relay.sandbox.state import Callback, iso

LANGUAGES = frozenset(
    [
        "ar_eg",
        "ar_sa",
        "bg_bg",
        "ca_es",
        "zh_cn",
        "zh_hk",
        "zh_tw",
        "hr_hr",
        "cs_cz",
        "da_dk",
        "nl_be",
        "nl_nl",
        "en_au",
        "en_ca",
        "en_gb",
        "en_in",
        "en_ie",
        "en_us",
        "fi_fi",
        "fr_ca",
        "fr_fr",
        "fr_ch",
        "de_at",
        "de_de",
        "de_ch",
        "el_gr",
        "he_il",
        "hi_in",
        "hu_hu",
        "id_id",
        "it_it",
        "ja_jp",
        "ko_kr",
        "ms_my",
        "nb_no",
        "pl_pl",
        "pt_pt",
        "ro_ro",
        "ru_ru",
        "sk_sk",
        "sl_si",
        "es_mx",
        "es_es",
        "sv_se",
        "ta_in",
        "th_th",
        "tr_tr",
        "vi_vn",
    ]
)
"""The seed's language codes."""
MAX_MESSAGE = 3_000
"""Characters of text to speak (an assumption: the platform's bound is not published)."""
MAX_INITIAL_DELAY = 60
"""Seconds (an assumption: the seed gives the field's type, int32, and no unit or bound)."""
SECOND = timedelta(seconds=1)
TO_RINGING = 1 * SECOND
TO_EARLY = 3 * SECOND
TO_ANSWER = 5 * SECOND
NO_ANSWER_AFTER = 30 * SECOND
WORDS_PER_SECOND = 2.5
RATE = "0.0450"
CURRENCY = "EUR"
COUNTRY = "DE"
NETWORK = "Sandbox Mobile"


@dataclass(frozen=True)
class CallRequest:
    """A checked TextToSpeechRequest."""

    sender: str
    to: str
    message: str
    language: str
    initial_delay: int
    events_url: str | None


@dataclass
class Call:
    """One call and the events it had so far."""

    call_id: str
    request: CallRequest
    started_at: datetime
    answered: bool
    status: str = "starting"
    events: list[dict[str, Any]] = field(default_factory=list)
    callbacks: list[str] = field(default_factory=list)


def parse_call(fields: Mapping[str, Any]) -> CallRequest:
    """Check a TextToSpeechRequest; the 400 problem of the first bad field."""
    sender = checks.international(fields, "from")
    to = checks.international(fields, "to")
    message = checks.string_field(fields, "message", required=True) or ""
    if len(message) > MAX_MESSAGE:
        raise invalid("message", f"has more than {MAX_MESSAGE} characters")
    language = checks.string_field(fields, "language", required=True) or ""
    if language not in LANGUAGES:
        raise invalid("language", "is not one of the platform's codes (e.g. en_gb, de_de)")
    delay = fields.get("initialDelay")
    if delay is None:
        delay = 0
    if not isinstance(delay, int) or isinstance(delay, bool):
        raise invalid("initialDelay", "must be a whole number of seconds")
    if not 0 <= delay <= MAX_INITIAL_DELAY:
        raise invalid("initialDelay", f"must be 0 to {MAX_INITIAL_DELAY} seconds")
    url = checks.callback_url(fields, "eventsUrl")
    return CallRequest(sender, to, message, language, delay, url)


def start_call(sandbox: Sandbox, request: CallRequest, chaos: frozenset[str]) -> Call:
    """Record a call and plan its events; the TextToSpeechResponse is :func:`response`."""
    state = sandbox.state
    make_room(state.calls, state.callbacks, sandbox.settings.max_messages, _ended, "calls")
    row = numbers.BY_NUMBER.get(request.to)
    answered = not (row is not None and row.product == "tts" and row.outcome == "not-answered")
    call = Call(str(uuid.uuid4()), request, sandbox.clock.now(), answered)
    sandbox.state.calls[call.call_id] = call
    for offset, status in timeline(request, answered):
        sandbox.scheduler.at(call.started_at + offset, _happen(sandbox, call, status, chaos))
    sandbox.state.changed()
    return call


def _ended(call: Call) -> bool:
    return call.status in ("completed", "hangup")


def timeline(request: CallRequest, answered: bool) -> list[tuple[timedelta, str]]:
    """When each event of a call happens, from its start."""
    if not answered:
        return [(timedelta(0), "started"), (TO_RINGING, "ringing"), (NO_ANSWER_AFTER, "hangup")]
    return [
        (timedelta(0), "started"),
        (TO_RINGING, "ringing"),
        (TO_EARLY, "early"),
        (TO_ANSWER + speech(request), "completed"),
    ]


def speech(request: CallRequest) -> timedelta:
    """How long the call lasts once answered: the pause, then the text spoken."""
    words = len(request.message.split())
    return timedelta(seconds=request.initial_delay + max(1, math.ceil(words / WORDS_PER_SECOND)))


def response(call: Call) -> dict[str, Any]:
    """The TextToSpeechResponse."""
    return {
        "callId": call.call_id,
        "status": "starting",
        "from": call.request.sender,
        "to": call.request.to,
    }


def event(call: Call, status: str, now: datetime) -> dict[str, Any]:
    """A TextToSpeechEvent of ``call`` at ``now``."""
    ended = status in ("completed", "hangup")
    answer = call.started_at + TO_ANSWER if call.answered else None
    seconds = round((now - answer).total_seconds()) if ended and answer else 0
    body = {
        "callId": call.call_id,
        "direction": "outbound",
        "from": call.request.sender,
        "to": call.request.to,
        "startTime": iso(call.started_at),
        "answerTime": iso(answer) if status == "completed" else None,
        "endTime": iso(now) if ended else None,
        "duration": str(seconds) if ended else None,
        "country": COUNTRY,
        "rate": RATE,
        "price": f"{float(RATE) * math.ceil(seconds / 60):.4f}" if ended else None,
        "currency": CURRENCY,
        "network": NETWORK,
        "status": status,
    }
    return {k: v for k, v in body.items() if v is not None}


def _happen(sandbox: Sandbox, call: Call, status: str, chaos: frozenset[str]) -> Any:
    async def happen() -> None:
        if sandbox.state.calls.get(call.call_id) is not call:
            return  # reset meanwhile
        now = sandbox.clock.now()
        body = event(call, status, now)
        call.status = status
        call.events.append(body)
        url = call.request.events_url
        if url is not None:
            delay = sandbox.settings.chaos.slow_delay if "slow" in chaos else timedelta(0)
            callback = Callback(
                id=str(uuid.uuid4()),
                subject=call.call_id,
                kind="tts.event",
                label=status,
                url=url,
                method="POST",
                body=body,
                policy=KINDS_BY_NAME["tts.event"].policy_for(body),
                due_at=now + delay,
                duplicate="duplicate" in chaos,
            )
            call.callbacks.append(callback.id)
            sandbox.scheduler.schedule(callback)
        sandbox.state.changed()

    return happen


def call_json(sandbox: Sandbox, call: Call) -> dict[str, Any]:
    """A call as the control API and the page show it."""
    return {
        **response(call),
        "status": call.status,
        "message": call.request.message,
        "language": call.request.language,
        "initialDelay": call.request.initial_delay,
        "eventsUrl": call.request.events_url,
        "answered": call.answered,
        "events": call.events,
        "callbacks": [
            sandbox.state.callbacks[c].as_json()
            for c in call.callbacks
            if c in sandbox.state.callbacks
        ],
    }
