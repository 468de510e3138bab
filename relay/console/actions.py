"""The console's actions (POST): replay, bulk replay and give-up with a confirmation, enable,
disable.

Each takes effect at once: what becomes due is handed to the relay's queue right away (in
embedded mode this wakes the in-process worker), and each is logged with who did it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from relay import outbox
from relay.console import queries
from relay.console.filters import BadFilter, delivery_filter, query_string, text_value
from relay.console.pages import ROW_ID
from relay.console.sessions import Operator
from relay.console.web import CONSOLE_PATH, Console, error, form_values, safe_next, see_other
from relay.delivery.give_up import LONGEST_REASON, give_up
from relay.observe.operator_actions import (
    CONSOLE,
    enabled,
    gave_up,
    replayed,
    replayed_delivery,
)
from relay.outbox.tables import DEAD

log = logging.getLogger("relay.console")


async def replay_delivery(
    console: Console, request: Request, operator: Operator, fields: Mapping[str, str]
) -> Response:
    delivery_id = request.path_params["delivery_id"]
    if not ROW_ID.fullmatch(delivery_id):
        return error(console, request, 404, "Not Found", "No delivery has this id.")
    due = await outbox.replay(console.engine, console.clock(), delivery_ids=[delivery_id])
    if not due:
        return error(console, request, 404, "Not Found", "No delivery has this id.")
    await console.enqueue(due)
    log.info(
        replayed_delivery(CONSOLE, operator.name, delivery_id),
        extra={"user": operator.name, "delivery_id": delivery_id},
    )
    back = safe_next(fields.get("back"), f"{CONSOLE_PATH}/deliveries").split("?")[0]
    return see_other(_with_notice(back, "replayed", len(due)))


async def give_up_delivery(
    console: Console, request: Request, operator: Operator, fields: Mapping[str, str]
) -> Response:
    """A pending or held delivery: first a confirmation page (with a reason to give), then
    (``confirm=yes``) it is dead now, and the next of its per-key line is enqueued."""
    delivery_id = request.path_params["delivery_id"]
    found = (
        await queries.delivery_in_line(console.engine, delivery_id)
        if ROW_ID.fullmatch(delivery_id)
        else None
    )
    if found is None:
        return error(console, request, 404, "Not Found", "No delivery has this id.")
    delivery, behind = found
    back = safe_next(fields.get("back"), f"{CONSOLE_PATH}/deliveries").split("?")[0]
    try:
        reason = text_value(fields, "reason", LONGEST_REASON)
    except BadFilter as exc:
        return error(console, request, 400, "Bad Request", str(exc))
    if fields.get("confirm") != "yes":
        return console.page(
            request, "give_up.html", operator, delivery=delivery, behind=behind, back=back
        )
    done = await give_up(
        console.engine, console.clock(), [delivery_id], by=operator.name, reason=reason
    )
    if not done.given_up:
        status = done.finished.get(delivery_id, "gone")
        return error(
            console, request, 409, "Conflict", f"This delivery is {status} already: kept as it is."
        )
    await console.enqueue(done.next_in_line)
    log.info(
        gave_up(CONSOLE, operator.name, [delivery_id], reason),
        extra={"user": operator.name, "delivery_id": delivery_id},
    )
    return see_other(_with_notice(back, "given-up"))


async def replay_event(
    console: Console, request: Request, operator: Operator, fields: Mapping[str, str]
) -> Response:
    event_id = request.path_params["event_id"]
    found = (
        await queries.event_detail(console.engine, event_id) if ROW_ID.fullmatch(event_id) else None
    )
    if found is None:
        return error(console, request, 404, "Not Found", "No stored event has this id.")
    ids = [delivery.id for delivery in found[1]]
    due = await outbox.replay(console.engine, console.clock(), delivery_ids=ids) if ids else []
    await console.enqueue(due)
    log.info(
        "console: %s replayed the %d deliveries of event %s",
        operator.name,
        len(due),
        event_id,
        extra={"user": operator.name, "event_id": event_id},
    )
    return see_other(_with_notice(f"{CONSOLE_PATH}/events/{event_id}", "replayed", len(due)))


async def bulk_replay(
    console: Console, request: Request, operator: Operator, fields: Mapping[str, str]
) -> Response:
    """Dead deliveries by destination and time range: first a confirmation with the count,
    then (``confirm=yes``) the replay."""
    try:
        where = delivery_filter(
            {**form_values(fields, "destination", "since", "until"), "status": DEAD},
            console.destinations,
        )
    except BadFilter as exc:
        return error(console, request, 400, "Bad Request", str(exc))
    count = await queries.count_deliveries(console.engine, where)
    confirmed = fields.get("confirm") == "yes" and fields.get("count") == str(count)
    if not confirmed:
        changed = fields.get("confirm") == "yes"  # confirmed, but for another count
        return console.page(
            request,
            "confirm.html",
            operator,
            where=where,
            count=count,
            list_query=query_string(where),
            notice="The count changed since you confirmed: check it again." if changed else None,
        )
    due = await outbox.replay(
        console.engine,
        console.clock(),
        status=DEAD,
        destination=where.destination,
        since=where.since,
        until=where.until,
    )
    await console.enqueue(due)
    log.info(
        replayed(CONSOLE, operator.name, len(due), query_string(where) or "all", status=DEAD),
        extra={"user": operator.name, "destination": where.destination},
    )
    listed = f"{CONSOLE_PATH}/deliveries" + (
        f"?{query_string(where)}" if query_string(where) else ""
    )
    return see_other(_with_notice(listed, "replayed", len(due)))


async def enable_destination(
    console: Console, request: Request, operator: Operator, fields: Mapping[str, str]
) -> Response:
    name = request.path_params["name"]
    if name not in console.destinations:
        return error(console, request, 404, "Not Found", "No destination of this name.")
    due = await outbox.enable_destination(console.engine, name, console.clock())
    await console.enqueue(due)
    log.info(
        enabled(CONSOLE, operator.name, name, len(due)),
        extra={"user": operator.name, "destination": name},
    )
    return see_other(f"{CONSOLE_PATH}/destinations?notice=enabled&count={len(due)}")


async def disable_destination(
    console: Console, request: Request, operator: Operator, fields: Mapping[str, str]
) -> Response:
    name = request.path_params["name"]
    if name not in console.destinations:
        return error(console, request, 404, "Not Found", "No destination of this name.")

    def disabled(current: Mapping[str, Any]) -> Mapping[str, Any]:
        return {**current, "disabled": True, "disabled_reason": f"disabled by {operator.name}"}

    await outbox.update_health(console.engine, name, disabled, console.clock())
    log.info(
        "console: %s disabled destination %s",
        operator.name,
        name,
        extra={"user": operator.name, "destination": name},
    )
    return see_other(f"{CONSOLE_PATH}/destinations?notice=disabled")


def _with_notice(location: str, notice: str, count: int | None = None) -> str:
    """``location`` with a notice to show; a replay's names how many it made due (nothing
    replayed is its own notice)."""
    if notice == "replayed" and count == 0:
        notice, count = "nothing", None
    separator = "&" if "?" in location else "?"
    shown = f"{location}{separator}notice={notice}"
    return shown if count is None else f"{shown}&count={count}"
