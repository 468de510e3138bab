"""The relay's Prometheus figures: what a worker does (attempts, their duration, the lag of
deliveries, sweeps), and the store's state (backlog, breakers), read from the database when
scraped.

Every metric lives in the registry it is given, one per process (see
:class:`receivers.metrics.Metrics`), never in ``prometheus_client``'s global one. A worker
resolves each destination's labelled children once, so an attempt costs no label lookup."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.metrics import Metrics
from relay import outbox
from relay.breaker import DestinationHealth, breaker_state
from relay.destinations.errors import describe_error
from relay.settings import SettingsError
from relay.tables import PENDING

log = logging.getLogger(__name__)

SUCCEEDED_ATTEMPT, FAILED_ATTEMPT, GONE_ATTEMPT = "succeeded", "failed", "gone"
ATTEMPT_OUTCOMES = (SUCCEEDED_ATTEMPT, FAILED_ATTEMPT, GONE_ATTEMPT)
"""The ``outcome`` label of an attempt: a 2xx, any other failure, or 410 Gone."""
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LAG_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    *(300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0),  # retries stretch the lag to hours
)
STORE_READ_TIMEOUT_SECONDS = 2.0
"""How long a scrape waits for the store's figures before serving without them."""


@dataclass(frozen=True)
class DestinationFigures:
    """One destination's labelled children, resolved once."""

    attempts: Mapping[str, Counter]
    """By outcome (:data:`ATTEMPT_OUTCOMES`)."""
    duration: Histogram
    lag: Histogram

    def attempted(self, outcome: str, seconds: float) -> None:
        """Count one attempt and its duration."""
        self.attempts[outcome].inc()
        self.duration.observe(seconds)


class WorkerMetrics:
    """A worker's figures (the embedded one's are in `relay serve`'s registry; a private
    registry by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.attempts = Counter(
            "relay_delivery_attempts_total",
            "Delivery attempts made by this process, by destination and outcome.",
            ("destination", "outcome"),
            registry=self.registry,
        )
        self.attempt_duration = Histogram(
            "relay_delivery_attempt_duration_seconds",
            "How long an attempt took, until the destination's answer or the error.",
            ("destination",),
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.lag = Histogram(
            "relay_delivery_lag_seconds",
            "From the event's storage to its delivery's success, retries included.",
            ("destination",),
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        sweeps = Counter(
            "relay_sweeps_total",
            "Sweeper runs of this process, by outcome (ok, failed).",
            ("outcome",),
            registry=self.registry,
        )
        self.sweeps_ok, self.sweeps_failed = sweeps.labels("ok"), sweeps.labels("failed")
        self._destinations: dict[str, DestinationFigures] = {}

    def destination(self, name: str) -> DestinationFigures:
        """The children of destination ``name`` (made on first use, the same ever after)."""
        figures = self._destinations.get(name)
        if figures is None:
            figures = DestinationFigures(
                {outcome: self.attempts.labels(name, outcome) for outcome in ATTEMPT_OUTCOMES},
                self.attempt_duration.labels(name),
                self.lag.labels(name),
            )
            self._destinations[name] = figures
        return figures


def queue_connected_gauge(registry: CollectorRegistry) -> Gauge:
    """``relay_queue_connected`` in ``registry``: 1 while the relay queue's Redis answers, 0
    while it is lost (see :class:`relay.queue_connection.QueueConnection`); 1 to begin with."""
    gauge = Gauge(
        "relay_queue_connected",
        "1 while the relay queue's Redis answers, 0 while it is lost (deliveries wait in the "
        "database until it is back).",
        registry=registry,
    )
    gauge.set(1)
    return gauge


class StoreFigures:
    """Gauges read from the database at each scrape (:meth:`refresh`): each destination's
    pending and dead deliveries and breaker state, and the oldest pending delivery's age. They
    are the store's, not the process's: every `relay serve` reports the same values."""

    def __init__(
        self,
        registry: CollectorRegistry,
        engine: AsyncEngine,
        destinations: Iterable[str],
        clock: Callable[[], datetime],
        *,
        timeout: float = STORE_READ_TIMEOUT_SECONDS,
    ) -> None:
        self._engine = engine
        self._destinations = tuple(destinations)
        self._clock = clock
        self._timeout = timeout
        self.pending = Gauge(
            "relay_deliveries_pending",
            "Deliveries waiting for an attempt (due or scheduled), by destination.",
            ("destination",),
            registry=registry,
        )
        self.dead = Gauge(
            "relay_deliveries_dead",
            "Deliveries that gave up (until replayed), by destination.",
            ("destination",),
            registry=registry,
        )
        self.oldest_pending_age = Gauge(
            "relay_oldest_pending_age_seconds",
            "Age of the oldest pending delivery (0 when none is pending).",
            registry=registry,
        )
        self.breaker = Gauge(
            "relay_destination_breaker_state",
            "0 closed, 1 open (paused after consecutive failures), 2 disabled by 410 Gone.",
            ("destination",),
            registry=registry,
        )
        self._by_destination = (self.pending, self.dead, self.breaker)

    async def refresh(self) -> None:
        """Read the figures; a store that does not answer in time leaves them out of this
        scrape (logged), and the process's own figures are served all the same."""
        try:
            async with asyncio.timeout(self._timeout):
                backlog, health = await outbox.store_figures(self._engine)
        except Exception as exc:
            log.warning("metrics: cannot read the store's figures: %s", describe_error(exc))
            for gauge in (*self._by_destination, self.oldest_pending_age):
                gauge.clear()
            return
        now = self._clock()
        names = {*self._destinations, *(row.destination for row in backlog)}
        names.update(row.name for row in health)
        for gauge in self._by_destination:
            gauge.clear()  # a destination gone from config and store drops out
            for name in names:
                gauge.labels(name).set(0)
        oldest: datetime | None = None
        for row in backlog:
            gauge = self.pending if row.status == PENDING else self.dead
            gauge.labels(row.destination).set(row.count)
            if row.status == PENDING and row.oldest is not None:
                oldest = row.oldest if oldest is None else min(oldest, row.oldest)
        self.oldest_pending_age.set(max((now - oldest).total_seconds(), 0.0) if oldest else 0.0)
        for row in health:
            state = DestinationHealth(row.consecutive_failures, row.paused_until, row.disabled)
            self.breaker.labels(row.name).set(breaker_state(state, now))


def serve_metrics(
    engine: AsyncEngine, destinations: Iterable[str], clock: Callable[[], datetime]
) -> Metrics:
    """The figures of one `relay serve` process: its ``/metrics`` reads the store's figures
    when scraped; the receivers' counters (and the embedded worker's) join its registry."""
    metrics = Metrics()
    store = StoreFigures(metrics.registry, engine, destinations, clock)
    metrics.before_scrape(store.refresh)
    return metrics


@contextlib.asynccontextmanager
async def metrics_server(
    registry: CollectorRegistry, host: str, port: int | None
) -> AsyncIterator[tuple[str, int] | None]:
    """Serve ``registry`` at ``http://host:port/metrics`` while inside (``prometheus_client``'s
    HTTP server, in a thread of its own); the address it listens on, or None without a port.
    A port that cannot be bound is a :class:`SettingsError`."""
    if port is None:
        yield None
        return
    try:
        server, thread = start_http_server(port, host, registry=registry)
    except OSError as exc:
        reason = exc.strerror or describe_error(exc)
        raise SettingsError(f"cannot serve metrics on {host}:{port}: {reason}") from None
    address = (host, int(server.server_address[1]))
    log.info("metrics at http://%s:%d/metrics", *address)
    try:
        yield address
    finally:
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        thread.join()
