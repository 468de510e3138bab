"""Names built from each event: AMQP routing keys, NATS subjects, MQTT topics.

A template is text with fields in braces, as in ``"callbacks.{kind}.{source}"``:

- ``kind``: the event's kind, as ``sms.dlr``;
- ``source``: the name of the source that received it;
- ``event``: the platform's event name (a report's status, a Conversations event, a call's
  status), lower-cased;
- ``platform_id``: the platform's id of what the event is about (``requestId``,
  ``messageId``, ``callId``);
- ``id``: the relay's event id.

Every value but ``kind`` is reduced to letters, digits, ``_`` and ``-`` (anything else becomes
``_``) and cut to :data:`VALUE_LENGTH` characters, so a value from a callback can never add a
separator, a wildcard or a control character to a name. An ``event`` or ``platform_id`` that
is absent, or not short printable text (see :func:`receivers.dedup.platform_refs_of`), is
``none``.
"""

from __future__ import annotations

import re

from receivers.dedup import platform_refs_of
from receivers.kinds import KINDS_BY_NAME
from relay.destinations.outbound import Outbound
from relay.outbox.template_parts import template_parts

FIELDS = ("kind", "source", "event", "platform_id", "id")
VALUE_LENGTH = 64
ABSENT = "none"
UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
LONGEST_KIND = max(KINDS_BY_NAME, key=len)


class NameTemplate:
    """A parsed template; ``ValueError`` names what is wrong with a bad one."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts = template_parts(
            text, FIELDS.__contains__, ", ".join("{" + f + "}" for f in FIELDS)
        )

    @property
    def literal(self) -> str:
        """The template's own text, without its fields."""
        return "".join(literal for literal, _ in self.parts)

    def render(self, outbound: Outbound) -> str:
        """The name for one event."""
        platform_id, event = platform_refs_of(outbound.kind, outbound.payload)
        values = {
            "kind": outbound.kind,
            "source": safe_value(outbound.source),
            "event": safe_value(event),
            "platform_id": safe_value(platform_id),
            "id": safe_value(outbound.event_id),
        }
        return "".join(literal + (values[field] if field else "") for literal, field in self.parts)

    def longest(self) -> str:
        """The template with every field at its longest (to check a broker's length limit)."""
        longest = {field: "x" * VALUE_LENGTH for field in FIELDS} | {"kind": LONGEST_KIND}
        return "".join(literal + (longest[field] if field else "") for literal, field in self.parts)


def safe_value(value: str | None) -> str:
    """``value`` as a template inserts it: safe characters only, at most ``VALUE_LENGTH``."""
    if not value:
        return ABSENT
    return UNSAFE.sub("_", value[:VALUE_LENGTH])
