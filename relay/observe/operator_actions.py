"""The log lines of operators' actions on deliveries, worded alike whether the console or a
command did them (``via``): ``console: alice replayed 12 dead deliveries
(status=dead&destination=crm)``, ``cli: bob gave up delivery ID (the CRM rejects it)``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlencode

from relay.words import counted

CONSOLE = "console"
COMMAND_LINE = "cli"
SHOWN_IDS = 10
"""How many delivery ids a line names (the rest are counted): a line stays one line."""


def replayed(via: str, who: str, count: int, which: str, *, status: str | None = None) -> str:
    """``who`` replayed ``count`` deliveries (of ``status``), chosen by ``which`` (a filter as
    a query string, ids, or "all")."""
    noun = f"{status} delivery" if status else "delivery"
    return f"{via}: {who} replayed {counted(count, noun, noun[:-1] + 'ies')} ({which})"


def replayed_delivery(via: str, who: str, delivery_id: str) -> str:
    """``who`` replayed one delivery, named."""
    return f"{via}: {who} replayed delivery {delivery_id}"


def gave_up(via: str, who: str, ids: Sequence[str], reason: str | None) -> str:
    """``who`` gave up these deliveries (one is named as such), for ``reason``."""
    why = f" ({reason})" if reason else ""
    if len(ids) == 1:
        return f"{via}: {who} gave up delivery {ids[0]}{why}"
    named = f": {ids_text(ids)}" if ids else ""
    return f"{via}: {who} gave up {counted(len(ids), 'delivery')}{named}{why}"


def enabled(via: str, who: str, name: str, released: int) -> str:
    """``who`` enabled destination ``name``, which released ``released`` held deliveries."""
    return f"{via}: {who} enabled destination {name} ({released} held deliveries released)"


def ids_text(ids: Sequence[str]) -> str:
    """The first :data:`SHOWN_IDS` ids, and how many more: ``a, b and 3 more``."""
    shown = ", ".join(ids[:SHOWN_IDS])
    more = len(ids) - SHOWN_IDS
    return f"{shown} and {more} more" if more > 0 else shown


def filter_text(values: Mapping[str, str | None]) -> str:
    """A filter as the console writes it in its lines and links: ``status=dead&since=...``
    (the values given only), or ``all``."""
    return urlencode({k: v for k, v in values.items() if v}) or "all"
