"""The outbox: stored events routed into deliveries, kept in SQL until each one ends.

Its operations, whatever module holds them, are read as ``outbox.NAME``: the records and
claims (:mod:`~relay.outbox.records`), routing (:mod:`~relay.outbox.routing`), replay
(:mod:`~relay.outbox.replaying`) and the figures operators read (:mod:`~relay.outbox.figures`).
The rest of the package is the routing's parts (:mod:`~relay.outbox.router`, order keys and
their lines in :mod:`~relay.outbox.order_keys` and :mod:`~relay.outbox.ordering`), the tables
(:mod:`~relay.outbox.tables`), the after-commit hook (:mod:`~relay.outbox.hook`) and the
sweeper (:mod:`~relay.outbox.sweeper`), which import from here and are not re-exported.
"""

from relay.outbox.figures import delivery_counts, store_figures
from relay.outbox.records import (
    ATTEMPTS,
    CLOCK_SKEW,
    DELIVERIES,
    EVENTS,
    JOB_BATCH,
    KEEP_FIRST_ATTEMPTS,
    KEEP_LAST_ATTEMPTS,
    LOOKUP_CHUNK,
    RELAY_WRITES,
    ROUTED,
    STATES,
    AttemptRecord,
    AttemptResult,
    Claim,
    Due,
    EventRef,
    HealthChange,
    LeaseLost,
    claim_many,
    claim_on,
    due_deliveries,
    next_in_line,
    record_attempts,
    record_on,
    release,
    release_on,
    update_health,
)
from relay.outbox.replaying import enable_destination, replay
from relay.outbox.routing import route_events, unrouted_events

__all__ = [
    "ATTEMPTS",
    "CLOCK_SKEW",
    "DELIVERIES",
    "EVENTS",
    "JOB_BATCH",
    "KEEP_FIRST_ATTEMPTS",
    "KEEP_LAST_ATTEMPTS",
    "LOOKUP_CHUNK",
    "RELAY_WRITES",
    "ROUTED",
    "STATES",
    "AttemptRecord",
    "AttemptResult",
    "Claim",
    "Due",
    "EventRef",
    "HealthChange",
    "LeaseLost",
    "claim_many",
    "claim_on",
    "delivery_counts",
    "due_deliveries",
    "enable_destination",
    "next_in_line",
    "record_attempts",
    "record_on",
    "release",
    "release_on",
    "replay",
    "route_events",
    "store_figures",
    "unrouted_events",
    "update_health",
]
