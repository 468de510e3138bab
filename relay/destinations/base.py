"""The interface every destination implements, and what a destination type declares."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from relay.destinations.outbound import Outbound
from relay.destinations.outcome import Outcome

if TYPE_CHECKING:
    import httpx

    from relay.destinations.base_config import DestinationBase


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


Builder = Callable[[str, Any, "httpx.AsyncClient | None"], Destination]
"""``(name, config, http_client)`` to the destination; ``http_client`` is a shared pool that
HTTP destinations use (the others ignore it)."""


@dataclass(frozen=True)
class DestinationType:
    """One ``type`` of ``[destinations.NAME]`` table: its settings model (whose ``type`` field
    is ``Literal[name]``) and its builder. A builder imports its client library itself, so that
    a library is loaded only where a destination of its type is built."""

    name: str
    config: type[DestinationBase]
    build: Builder

    def __post_init__(self) -> None:
        field = self.config.model_fields.get("type")
        if field is None or typing.get_args(field.annotation) != (self.name,):
            raise TypeError(f"{self.config.__name__}.type must be Literal[{self.name!r}]")
