"""A transactional outbox: new events are routed in the transaction that stores them.

The receivers' event writer (:mod:`receivers.store.in_commit`) loads :func:`routing` where it
writes, the writer's own process for a SQLite file too, from the destinations' filters
(:func:`routing_writer`), and calls it in each of its transactions: an event and its
deliveries commit together. The after-commit hook then has only to hand those deliveries to the
dispatcher (:func:`first_jobs`), without a transaction of its own competing for the store's
write lock; events stored without it (should routing fail) are routed by the hook and the
sweeper, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from receivers.store import StoredEvent
from receivers.store.in_commit import InCommitWriter, WriteInCommit
from relay.destinations.base_config import DestinationBase
from relay.outbox.records import Due, EventRef
from relay.outbox.router import Router
from relay.outbox.routing import routed_rows, write_routes

ROUTING_FIELDS = frozenset(
    {"kinds", "events", "channels", "sources", "policy", "ordering", "order_key"}
)
"""What routing reads of a destination's settings (no address, no secret)."""


def routing_writer(destinations: Mapping[str, DestinationBase]) -> InCommitWriter:
    """The in-commit writer that routes to these destinations (their filters only)."""
    return InCommitWriter(
        f"{__name__}:routing",
        {
            name: destination.model_dump(mode="json", include=set(ROUTING_FIELDS))
            for name, destination in destinations.items()
        },
    )


def routing(filters: Mapping[str, Mapping[str, Any]]) -> WriteInCommit:
    """Routes new events on their transaction's connection; answers each event's deliveries
    as ``[delivery id, batch job id]`` pairs (marshal-able, for the writer's process)."""
    router = Router({name: DestinationBase.model_validate(f) for name, f in filters.items()})

    def write(conn: Connection, events: Sequence[StoredEvent]) -> list[list[list[str]]]:
        now = events[0].received_at  # one time for the whole group
        refs = [EventRef(e.id, e.source, e.kind, e.payload, e.received_at) for e in events]
        routed = routed_rows(router, refs, now)
        created = write_routes(conn, routed)
        made: dict[str, list[list[str]]] = {event.id: [] for event in events}
        for row in routed.deliveries:
            if row["id"] in created:
                made[row["event_id"]].append([row["id"], row["job_id"]])
        return [made[event.id] for event in events]

    return write


def first_jobs(events: Sequence[StoredEvent]) -> list[Due]:
    """The first jobs of the deliveries routed with these events (none for an event stored
    without routing: ``written_with`` None)."""
    return [
        Due(delivery, 0, event.received_at, job)
        for event in events
        for delivery, job in event.written_with or ()
    ]
