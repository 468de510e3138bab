"""The interface every destination implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from relay.destinations.outbound import Outbound
from relay.destinations.outcome import Outcome


@runtime_checkable
class Destination(Protocol):
    """Somewhere events are relayed to.

    ``deliver`` makes one attempt within ``timeout`` seconds and reports it as an ``Outcome``;
    it does not raise for network or service errors. Delivery is at-least-once: consumers
    dedupe on the event id.
    """

    name: str

    async def start(self) -> None:
        """Check what can be checked before the first delivery; raise
        :class:`~relay.destinations.errors.DestinationRefused` for a setup that can never
        deliver (a NATS server without JetStream). A service that is down is not an error here:
        its deliveries fail and wait under the policy."""
        ...

    async def deliver(self, outbound: Outbound, *, timeout: float) -> Outcome:
        """Deliver once."""
        ...

    async def aclose(self) -> None:
        """Release connections this destination owns."""
        ...
