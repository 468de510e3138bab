"""The console's list filters, parsed from a query string; anything malformed is refused.

Every value is checked against what the column can hold, so a hostile query string becomes a
400 naming the parameter, never a query over a wrong type.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from receivers.kinds import KINDS_BY_NAME
from relay.outbox.tables import DELIVERY_STATUSES

CURSOR = re.compile(r"(-?[0-9]{1,20})~([0-9a-f-]{36})")
LONGEST_VALUE = 200
EARLIEST_YEAR, LATEST_YEAR = 1970, 9000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


class BadFilter(ValueError):
    """A query parameter the console cannot use; the message names it."""


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: below this (time, id)."""

    moment: datetime
    id: str

    def encode(self) -> str:
        return f"{(self.moment - EPOCH) // MICROSECOND}~{self.id}"


@dataclass(frozen=True)
class EventFilter:
    source: str | None = None
    kind: str | None = None
    event: str | None = None
    platform_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    before: Cursor | None = None


@dataclass(frozen=True)
class DeliveryFilter:
    status: str | None = None
    destination: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    before: Cursor | None = None


def event_filter(params: Mapping[str, str], sources: list[str]) -> EventFilter:
    """The events page's filter from its query string."""
    source = _text(params, "source", 64)
    if source is not None and source not in sources:
        raise BadFilter("source: not a configured source")
    kind = _text(params, "kind", 64)
    if kind is not None and kind not in KINDS_BY_NAME:
        raise BadFilter(f"kind: one of {', '.join(KINDS_BY_NAME)}")
    event = _text(params, "event", 64)
    return EventFilter(
        source=source,
        kind=kind,
        event=event.lower() if event else None,
        platform_id=_text(params, "q", LONGEST_VALUE),
        since=_moment(params, "since"),
        until=_moment(params, "until"),
        before=_cursor(params),
    )


def delivery_filter(params: Mapping[str, str], destinations: list[str]) -> DeliveryFilter:
    """The deliveries page's filter (also the bulk replay's) from its query string or form."""
    status = _text(params, "status", 16)
    if status is not None and status not in DELIVERY_STATUSES:
        raise BadFilter(f"status: one of {', '.join(DELIVERY_STATUSES)}")
    destination = _text(params, "destination", 64)
    if destination is not None and destination not in destinations:
        raise BadFilter("destination: not a configured destination")
    return DeliveryFilter(
        status=status,
        destination=destination,
        since=_moment(params, "since"),
        until=_moment(params, "until"),
        before=_cursor(params),
    )


def page_cursor(params: Mapping[str, str]) -> Cursor | None:
    """A list's page cursor (``before``), for lists without other filters."""
    return _cursor(params)


def after_cursor(params: Mapping[str, str]) -> Cursor | None:
    """The newest row a page showed (``after``): the live counts count the rows above it."""
    return _cursor(params, "after")


def query_string(where: EventFilter | DeliveryFilter, **changes: str | None) -> str:
    """The filter as a query string (for links to the next page), with ``changes``."""
    values: dict[str, str | None] = {}
    for field in fields(where):
        value = getattr(where, field.name)
        name = "q" if field.name == "platform_id" else field.name
        if isinstance(value, Cursor):
            values[name] = value.encode()
        elif isinstance(value, datetime):
            values[name] = value.strftime("%Y-%m-%dT%H:%M:%S")
        elif value is not None:
            values[name] = str(value)
    values.update(changes)
    return urlencode({k: v for k, v in values.items() if v})


def text_value(params: Mapping[str, str], name: str, longest: int) -> str | None:
    """A free text field (a reason): stripped, None when absent or blank; :class:`BadFilter`
    naming it when too long or holding control characters."""
    return _text(params, name, longest)


def _text(params: Mapping[str, str], name: str, longest: int) -> str | None:
    value = params.get(name)
    if value is None or not value.strip():
        return None
    value = value.strip()
    if len(value) > longest:
        raise BadFilter(f"{name}: at most {longest} characters")
    if not value.isprintable():
        raise BadFilter(f"{name}: control characters are not allowed")
    return value


def _moment(params: Mapping[str, str], name: str) -> datetime | None:
    value = _text(params, name, 40)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        moment = None
    if moment is None or not EARLIEST_YEAR <= moment.year <= LATEST_YEAR:
        raise BadFilter(
            f"{name}: a date and time like 2026-11-24T09:30 (UTC), "
            f"between the years {EARLIEST_YEAR} and {LATEST_YEAR}"
        )
    return moment


def _cursor(params: Mapping[str, str], name: str = "before") -> Cursor | None:
    value = params.get(name)
    if value is None or not value.strip():
        return None  # a blank cursor is the first page
    match = CURSOR.fullmatch(value)  # as the console wrote it: no spaces, ASCII digits
    if match is None:
        raise BadFilter(f"{name}: not a page cursor")
    try:
        moment = EPOCH + int(match[1]) * MICROSECOND
    except OverflowError:
        raise BadFilter(f"{name}: not a page cursor") from None
    return Cursor(moment, match[2])
