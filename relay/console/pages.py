"""The console's pages (GET): events, one event, deliveries, destinations, quarantine."""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from receivers.kinds import KINDS_BY_NAME
from relay.console import live, queries
from relay.console.charts import health_chart, latency_line
from relay.console.filters import (
    BadFilter,
    Cursor,
    delivery_filter,
    event_filter,
    page_cursor,
    query_string,
)
from relay.console.health import Recent, problems
from relay.console.sessions import Operator
from relay.console.web import CONSOLE_PATH, Console, error, query, see_other
from relay.console.wording import backlog_text, count_text
from relay.delivery.breaker import BreakerState, DestinationHealth, breaker_state
from relay.outbox.tables import DELIVERY_STATUSES

BREAKER_NAMES = {
    BreakerState.CLOSED: "closed",
    BreakerState.PAUSED: "open",
    BreakerState.DISABLED: "held",
}
"""How the page names each breaker state (held: disabled by a 410 or an operator)."""
ROW_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
COUNT = re.compile(r"[0-9]{1,9}")
"""A notice's count as an action's redirect writes it (anything else is not shown)."""


def notice_text(code: str, count: int | None) -> str | None:
    """What an action's redirect shows: a code from this list and, for a replay or an enable,
    how many deliveries it made due (never text from the URL)."""
    if code == "replayed":
        if count is None:
            return "Replayed: the deliveries are due now."
        due = "it is" if count == 1 else "they are"
        return f"Replayed {count_text(count, 'delivery')}: {due} due now."
    if code == "enabled":
        if count is None:
            return "Enabled: held deliveries are due now."
        return f"Enabled: {count_text(count, 'held delivery', 'held deliveries')} released."
    return {
        "disabled": "Disabled: its deliveries are held until it is enabled.",
        "nothing": "Nothing matched: nothing was replayed.",
        "given-up": "Given up: the delivery is dead now, and the next of its line goes.",
    }.get(code)


def notice(request: Request) -> str | None:
    count = request.query_params.get("count", "")
    return notice_text(
        request.query_params.get("notice", ""), int(count) if COUNT.fullmatch(count) else None
    )


async def events(console: Console, request: Request, operator: Operator) -> Response:
    try:
        where = event_filter(query(request), console.sources)
    except BadFilter as exc:
        return error(console, request, 400, "Bad Request", str(exc))
    page = await queries.events_page(console.engine, where)
    statuses = await queries.delivery_statuses(console.engine, [row.id for row in page.rows])
    return console.page(
        request,
        "events.html",
        operator,
        where=where,
        page=page,
        statuses=statuses,
        kinds=list(KINDS_BY_NAME),
        sources=console.sources,
        next_query=query_string(where, before=page.next.encode()) if page.next else None,
        first_query=query_string(where, before=None),
        notice=notice(request),
        live=await live.live(console, "events", where, newest(page, "received_at")),
    )


async def event(console: Console, request: Request, operator: Operator) -> Response:
    event_id = request.path_params["event_id"]
    found = (
        await queries.event_detail(console.engine, event_id) if ROW_ID.fullmatch(event_id) else None
    )
    if found is None:
        return error(console, request, 404, "Not Found", "No stored event has this id.")
    row, deliveries, attempts = found
    return console.page(
        request,
        "event.html",
        operator,
        event=row,
        deliveries=deliveries,
        attempts=attempts,
        notice=notice(request),
    )


async def deliveries(console: Console, request: Request, operator: Operator) -> Response:
    try:
        where = delivery_filter(query(request), console.destinations)
    except BadFilter as exc:
        return error(console, request, 400, "Bad Request", str(exc))
    page = await queries.deliveries_page(console.engine, where)
    return console.page(
        request,
        "deliveries.html",
        operator,
        where=where,
        page=page,
        statuses=DELIVERY_STATUSES,
        destinations=console.destinations,
        next_query=query_string(where, before=page.next.encode()) if page.next else None,
        first_query=query_string(where, before=None),
        notice=notice(request),
        live=await live.live(console, "deliveries", where, newest(page, "created_at")),
    )


def newest(page: queries.Page, moment: str) -> Cursor | None:
    """The newest row a page shows, as a cursor (None for an empty page)."""
    if not page.rows:
        return None
    first = page.rows[0]._mapping
    return Cursor(first[moment], first["id"])


async def destinations(console: Console, request: Request, operator: Operator) -> Response:
    now = console.clock()
    counts = await queries.backlog_counts(
        console.engine, console.destinations, queries.BACKLOG_STATUSES
    )
    states = {row.name: row for row in await queries.destination_states(console.engine)}
    history = await queries.destination_health(console.engine, now)
    recent = await queries.recent_outcomes(console.engine, now)
    medians = await queries.median_latency(console.engine, now)
    rows: list[dict[str, Any]] = []
    for name in console.destinations:
        state = states.get(name)
        health = (
            DestinationHealth(state.consecutive_failures, state.paused_until, state.disabled)
            if state is not None
            else DestinationHealth()
        )
        buckets = history.get(name, [])
        attempts = sum(b.attempts for b in buckets)
        chart = health_chart(buckets)
        kind = console.targets.get(name, "").partition(": ")[0]
        rows.append(
            {
                "name": name,
                "type": kind or None,
                "target": console.targets.get(name),
                "breaker": BREAKER_NAMES[breaker_state(health, now)],
                "problems": problems(health, recent.get(name, Recent()), now),
                "state": state,
                "counts": {
                    status: backlog_text(n, queries.BACKLOG_CAP)
                    for status, n in counts[name].items()
                },
                "attempts": attempts,
                "success_rate": sum(b.succeeded for b in buckets) / attempts if attempts else None,
                "mean_ms": mean_ms(buckets),
                "p50_ms": medians.get(name),
                "chart": chart,
                "line": latency_line(chart),
            }
        )
    return console.page(
        request, "destinations.html", operator, destinations=rows, notice=notice(request)
    )


def mean_ms(buckets: list[queries.HealthBucket]) -> float | None:
    """The mean attempt duration over ``buckets`` (None without a timed attempt)."""
    timed = [(b.mean_ms, b.attempts) for b in buckets if b.mean_ms is not None]
    weight = sum(attempts for _, attempts in timed)
    return sum(mean * attempts for mean, attempts in timed) / weight if weight else None


async def quarantine(console: Console, request: Request, operator: Operator) -> Response:
    try:
        before = page_cursor(query(request))
    except BadFilter as exc:
        return error(console, request, 400, "Bad Request", str(exc))
    page = await queries.quarantine_page(console.engine, before)
    return console.page(
        request,
        "quarantine.html",
        operator,
        page=page,
        next_query=f"before={page.next.encode()}" if page.next else None,
    )


async def rejected(console: Console, request: Request, operator: Operator) -> Response:
    rejected_id = request.path_params["rejected_id"]
    row = (
        await queries.rejected_body(console.engine, rejected_id)
        if ROW_ID.fullmatch(rejected_id)
        else None
    )
    if row is None:
        return error(console, request, 404, "Not Found", "No quarantined body has this id.")
    return console.page(request, "rejected.html", operator, body=row)


async def home(console: Console, request: Request, operator: Operator) -> Response:
    return see_other(CONSOLE_PATH + "/events")
