"""Prometheus figures with ``prometheus_client``: one registry per app or worker, never the
library's global ``REGISTRY``, and the receivers' counters in it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

Refresh = Callable[[], Awaitable[None]]
"""Brings some figures up to date just before they are read (e.g. from the database)."""


class Metrics:
    """The figures one process serves: its registry, and what to refresh before a scrape.

    Built by the wiring and passed down (to the app, the worker), so that everything one process
    records lands in the registry its ``/metrics`` serves. With ``max_age``, an exposition
    encoded less than that many seconds ago (``clock``) is served again, in the same format:
    encoding the registry is a scrape's main cost, so scrapes then cost the same however many
    scrapers there are."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        max_age: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._refreshes: list[Refresh] = []
        self._max_age = max_age
        self._clock = clock
        self._encoded: dict[str, tuple[float, bytes]] = {}
        """By content type (two at most): when it was encoded, and the exposition."""

    def before_scrape(self, refresh: Refresh) -> None:
        """Await ``refresh`` before each scrape (it handles its own errors and time limit)."""
        self._refreshes.append(refresh)

    async def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The refreshed figures and their content type, in the format the scraper's
        ``Accept`` header asks for (Prometheus text by default, or OpenMetrics)."""
        for refresh in self._refreshes:
            await refresh()
        encoder, content_type = choose_encoder(accept or "")
        now = self._clock()
        encoded = self._encoded.get(content_type)
        if encoded is not None and 0 <= now - encoded[0] < self._max_age:
            return encoded[1], content_type
        body = encoder(self.registry)
        if self._max_age > 0:
            self._encoded[content_type] = (now, body)
        return body, content_type


class ReceiverCounters:
    """The receivers' counters, registered in ``registry``. Their labels are sources, kinds and
    fixed reasons: never a credential."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.callbacks = Counter(
            "relay_callbacks_total",
            "Callbacks accepted: stored, or answered again as a duplicate.",
            ("source", "kind", "outcome"),
            registry=registry,
        )
        self.client_disconnects = Counter(
            "relay_client_disconnects_total",
            "Callers that left before the end of their body.",
            ("source",),
            registry=registry,
        )
        self.auth_failures = Counter(
            "relay_auth_failures_total",
            "Callbacks refused with 401 or 403, by reason.",
            ("source", "reason"),
            registry=registry,
        )
        self.store_unavailable = Counter(
            "relay_store_unavailable_total",
            "Callbacks answered 503 because the store could not take them.",
            ("source",),
            registry=registry,
        )
        self.rejected = Counter(
            "relay_rejected_total",
            "Bodies quarantined (400, 422), by answer status.",
            ("source", "status"),
            registry=registry,
        )
