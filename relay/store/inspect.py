"""Read-side queries over the outbox, for operators."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.outbox import ATTEMPTS, DELIVERIES, STATES
from relay.outbox.ordering import order_flags


def _with_order_flags() -> Any:
    return select(DELIVERIES, *order_flags())


async def list_deliveries(
    engine: AsyncEngine,
    *,
    status: str | None = None,
    destination: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Deliveries, newest first."""
    query = _with_order_flags().order_by(DELIVERIES.c.created_at.desc(), DELIVERIES.c.id.desc())
    if status is not None:
        query = query.where(DELIVERIES.c.status == status)
    if destination is not None:
        query = query.where(DELIVERIES.c.destination == destination)
    async with engine.connect() as conn:
        return [delivery_json(row._mapping) for row in await conn.execute(query.limit(limit))]


async def get_delivery(engine: AsyncEngine, delivery_id: str) -> dict[str, Any] | None:
    """One delivery with its kept attempts."""
    async with engine.connect() as conn:
        query = _with_order_flags().where(DELIVERIES.c.id == delivery_id)
        row = (await conn.execute(query)).first()
        if row is None:
            return None
        attempts = await conn.execute(
            select(ATTEMPTS)
            .where(ATTEMPTS.c.delivery_id == delivery_id)
            .order_by(ATTEMPTS.c.number)
        )
        document = delivery_json(row._mapping)
        document["attempt_log"] = [
            {
                "number": a.number,
                "started_at": _iso(a.started_at),
                "duration_ms": round(a.duration_ms, 3),
                "status_code": a.status_code,
                "error": a.error,
                "response_excerpt": a.response_excerpt,
            }
            for a in attempts
        ]
    return document


async def list_destinations(engine: AsyncEngine, configured: list[str]) -> list[dict[str, Any]]:
    """Every configured destination (and any known to the store) with its health."""
    async with engine.connect() as conn:
        states = {row.name: row for row in await conn.execute(select(STATES))}
    names = list(configured) + sorted(set(states) - set(configured))
    result = []
    for name in names:
        state = states.get(name)
        result.append(
            {
                "name": name,
                "configured": name in configured,
                "consecutive_failures": state.consecutive_failures if state else 0,
                "paused_until": _iso(state.paused_until) if state else None,
                "disabled": bool(state.disabled) if state else False,
                "disabled_reason": state.disabled_reason if state else None,
            }
        )
    return result


def delivery_json(row: Any) -> dict[str, Any]:
    """A delivery as JSON for operators."""
    return {
        "id": row["id"],
        "event_id": row["event_id"],
        "destination": row["destination"],
        "policy": row["policy"],
        "status": row["status"],
        "attempts": row["attempts"],
        "created_at": _iso(row["created_at"]),
        "first_attempt_at": _iso(row["first_attempt_at"]),
        "last_attempt_at": _iso(row["last_attempt_at"]),
        "next_attempt_at": _iso(row["next_attempt_at"]),
        "finished_at": _iso(row["finished_at"]),
        "last_status_code": row["last_status_code"],
        "last_error": row["last_error"],
        "order_key": row["order_key"],
        "out_of_order_if_replayed": bool(row.get("out_of_order_if_replayed")),
        "waiting_in_line": bool(row.get("waiting_in_line")),
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
