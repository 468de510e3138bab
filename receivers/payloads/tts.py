"""Text-to-speech call events (``tts.event``)."""

from __future__ import annotations

from pydantic import Field

from receivers.payloads.base import PlatformPayload
from receivers.payloads.values import Identifier


class TtsEvent(PlatformPayload):
    """One event of a text-to-speech call, pushed to the call's eventsUrl; every field optional."""

    call_id: Identifier | None = Field(default=None, alias="callId")
    direction: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    start_time: str | None = Field(default=None, alias="startTime")
    answer_time: str | None = Field(default=None, alias="answerTime")
    end_time: str | None = Field(default=None, alias="endTime")
    duration: str | None = None
    country: str | None = None
    rate: str | None = None
    price: str | None = None
    currency: str | None = None
    network: str | None = None
    status: Identifier | None = None
