"""Routing: which destinations want an event, and under which retry policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from receivers.kinds import KINDS_BY_NAME

PLATFORM_POLICY = "platform"


class Filtered(Protocol):
    """The part of a destination's settings the router reads."""

    policy: str

    def wants(self, kind: str, source: str, payload: Mapping[str, Any]) -> bool: ...

    def order_key_of(self, kind: str, source: str, payload: Mapping[str, Any]) -> str | None: ...


@dataclass(frozen=True)
class Route:
    """One delivery to create: the destination, the policy it retries with, and its order key
    (None: it waits for no other delivery)."""

    destination: str
    policy: str
    order_key: str | None = None


class Router:
    """Fan-out: one route per destination whose filters match the event."""

    def __init__(self, destinations: Mapping[str, Filtered]) -> None:
        self._destinations = destinations

    def routes(self, kind: str, source: str, payload: Mapping[str, Any]) -> list[Route]:
        """The routes of one event, in configuration order."""
        routes = []
        for name, destination in self._destinations.items():
            if destination.wants(kind, source, payload):
                policy = self.policy_name(destination.policy, kind, payload)
                order_key = destination.order_key_of(kind, source, payload)
                routes.append(Route(name, policy, order_key))
        return routes

    @staticmethod
    def policy_name(configured: str, kind: str, payload: Mapping[str, Any]) -> str:
        """``platform`` means the kind's own platform policy (which may depend on the channel)."""
        if configured != PLATFORM_POLICY:
            return configured
        known = KINDS_BY_NAME.get(kind)
        return known.policy_for(payload) if known else "standard"
