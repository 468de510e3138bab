"""A destination's health as the console's destinations page shows it: "healthy" only when
nothing recent says otherwise, else each reason.

The breaker's state alone would call a destination healthy while it fails: its consecutive
failures count only those that say it is down (:mod:`relay.delivery.breaker`), so a consumer
answering 500 to every message never opens it. So the page also reads the last hour's outcomes: the
deliveries attempted then that went dead, and those that wait to retry after a failure. (A
delivery given up by an operator without an attempt in the hour is not among them.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from relay.console.wording import count_text
from relay.delivery.breaker import BreakerState, DestinationHealth, breaker_state

RECENT = timedelta(hours=1)
"""How far back dead deliveries make a destination unhealthy."""


@dataclass(frozen=True)
class Problem:
    """One reason a destination is not healthy: its text and its badge's style."""

    text: str
    style: str


@dataclass(frozen=True)
class Recent:
    """What the store says of a destination's recent deliveries."""

    dead: int = 0
    """Deliveries attempted within :data:`RECENT` that went dead since."""
    retrying: int = 0
    """Deliveries attempted within :data:`RECENT` that wait to retry after a failure."""


def problems(health: DestinationHealth, recent: Recent, now: datetime) -> list[Problem]:
    """Why the destination is not healthy at ``now``, the most pressing first; none when it is
    healthy (not held, no pause, no consecutive failures, no recent dead, nothing retrying)."""
    found = []
    state = breaker_state(health, now)
    if state is BreakerState.DISABLED:
        found.append(Problem("held", "breaker-held"))
    elif state is BreakerState.PAUSED:
        found.append(Problem("breaker open", "breaker-open"))
    if health.consecutive_failures:
        found.append(
            Problem(
                f"failing: {count_text(health.consecutive_failures, 'consecutive failure')}", "dead"
            )
        )
    if recent.dead:
        found.append(Problem(f"{recent.dead} dead in the last hour", "dead"))
    if recent.retrying:
        found.append(Problem(f"{count_text(recent.retrying, 'delivery')} retrying", "pending"))
    return found
