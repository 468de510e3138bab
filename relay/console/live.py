"""Live counts of the events and deliveries pages: the backlog (pending, held, dead) and how
many rows of the list arrived above the newest one the page shows.

A page renders them as they are when it is served, so it is complete without a script; the
console's one script (:mod:`relay.console.script`) then polls ``GET /console/counts`` with the
page's filter and puts the new figures in place, as text. The endpoint is behind the same
session as the pages, answers JSON only, and counts as the pages do: on their indexes, each
count bounded (more than :data:`~relay.console.queries.BACKLOG_CAP` shows as "1,000+").
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from relay.console import queries
from relay.console.filters import (
    BadFilter,
    Cursor,
    DeliveryFilter,
    EventFilter,
    after_cursor,
    delivery_filter,
    event_filter,
    query_string,
)
from relay.console.script import live_script
from relay.console.sessions import Operator
from relay.console.web import CONSOLE_PATH, Console, error, query
from relay.console.wording import backlog_text, plural

EVERY_MS = 5_000
"""How often a page's script asks for its counts."""
LISTS = {"events": "event", "deliveries": "delivery"}
"""The lists with live counts, and what each lists."""


@dataclass(frozen=True)
class Live:
    """What a page needs to show its live counts and have them refreshed."""

    url: str
    """The counts endpoint for this page's list, filter and newest row."""
    counts: dict[str, str]
    every: int = EVERY_MS
    script: Markup | None = None


async def counts(
    console: Console, where: EventFilter | DeliveryFilter, after: Cursor | None
) -> dict[str, str]:
    """The figures a page shows, as text: ``pending``, ``held``, ``dead`` (of the filtered
    destination, or of all) and ``newer`` ("3 newer events", empty when none)."""
    destination = getattr(where, "destination", None)
    names = [destination] if destination else console.destinations
    backlog = await queries.backlog_counts(console.engine, names, queries.BACKLOG_STATUSES)
    shown = {}
    for status in queries.BACKLOG_STATUSES:
        figures = [backlog[name][status] for name in names]
        total = sum(min(n, queries.BACKLOG_CAP) for n in figures)
        over = any(n > queries.BACKLOG_CAP for n in figures)
        shown[status] = f"{total:,}+" if over else backlog_text(total, queries.BACKLOG_CAP)
    newer = await queries.newer_count(console.engine, where, after)
    thing = "newer event" if isinstance(where, EventFilter) else "newer delivery"
    if newer == 1:
        shown["newer"] = f"1 {thing}"
    elif newer:
        shown["newer"] = f"{backlog_text(newer, queries.BACKLOG_CAP)} {plural(thing)}"
    else:
        shown["newer"] = ""
    return shown


async def live(
    console: Console, list_name: str, where: EventFilter | DeliveryFilter, after: Cursor | None
) -> Live:
    """A page's live counts as they are now, and where its script asks for the next ones."""
    parameters = query_string(where, before=None)
    url = f"{CONSOLE_PATH}/counts?" + urlencode({"list": list_name})
    if parameters:
        url += f"&{parameters}"
    if after is not None:
        url += "&" + urlencode({"after": after.encode()})
    return Live(url, await counts(console, where, after), script=live_script())


async def counts_endpoint(console: Console, request: Request, operator: Operator) -> Response:
    """``GET /console/counts?list=events|deliveries&after=CURSOR&<the page's filter>``: the
    page's figures as JSON (each a text to show)."""
    try:
        params = query(request)
        list_name = params.get("list", "")
        if list_name not in LISTS:
            raise BadFilter(f"list: one of {', '.join(LISTS)}")
        where = (
            event_filter(params, console.sources)
            if list_name == "events"
            else delivery_filter(params, console.destinations)
        )
        after = after_cursor(params)
    except BadFilter as exc:
        return error(console, request, 400, "Bad Request", str(exc))
    return JSONResponse(await counts(console, where, after))
