"""The relay's Prometheus figures: what a worker does (attempts, their duration, the lag of
deliveries, sweeps), and the store's state (backlog, breakers), read from the database in the
background while scraped, at most once per interval.

Every metric lives in the registry it is given, one per process (see
:class:`receivers.metrics.Metrics`), never in ``prometheus_client``'s global one. A worker
resolves each destination's labelled children once, so an attempt costs no label lookup."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.delivery.breaker import DestinationHealth, breaker_state
from relay.destinations.errors import describe_database_error, describe_error
from relay.outbox.tables import PENDING
from relay.settings import SettingsError

log = logging.getLogger("relay.metrics")  # stable: users filter on it

SUCCEEDED_ATTEMPT, FAILED_ATTEMPT, GONE_ATTEMPT = "succeeded", "failed", "gone"
ATTEMPT_OUTCOMES = (SUCCEEDED_ATTEMPT, FAILED_ATTEMPT, GONE_ATTEMPT)
"""The ``outcome`` label of an attempt: a 2xx, any other failure, or 410 Gone."""
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LAG_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    *(300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0),  # retries stretch the lag to hours
)
STORE_READ_TIMEOUT_SECONDS = 2.0
"""How long a read of the store's figures may take before it counts as failed."""
EXPOSITION_MAX_AGE_SECONDS = 1.0
"""`relay serve`'s ``/metrics`` encodes its figures at most this often (per format), shared by
every scraper (see :class:`receivers.metrics.Metrics`)."""


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
    while it is lost (see :class:`relay.dispatch.queue_connection.QueueConnection`); 1 to begin
    with."""
    gauge = Gauge(
        "relay_queue_connected",
        "1 while the relay queue's Redis answers, 0 while it is lost (deliveries wait in the "
        "database until it is back).",
        registry=registry,
    )
    gauge.set(1)
    return gauge


class StoreFigures:
    """Gauges of the store's state: each destination's pending and dead deliveries and breaker
    state, and the oldest pending delivery's age. They are the store's, not the process's:
    every `relay serve` reports the same values.

    A scrape never reads the database itself (:meth:`refresh`): one that finds the figures
    older than ``interval`` starts a read in the background (:meth:`read`, one at a time) and
    is served the figures at hand. So the database is read at most once per interval however
    many scrape, and not at all while nobody does; only while no figures were read yet does a
    scrape wait for the read (at most ``timeout``). Their age is a gauge of its own,
    ``relay_store_figures_age_seconds``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        engine: AsyncEngine,
        destinations: Iterable[str],
        clock: Callable[[], datetime],
        *,
        interval: timedelta,
        timeout: float = STORE_READ_TIMEOUT_SECONDS,
    ) -> None:
        self._engine = engine
        self._destinations = tuple(destinations)
        self._clock = clock
        self._interval = interval
        self._timeout = timeout
        self._read_at: datetime | None = None
        """When the figures served were read (None until a read succeeded)."""
        self._asked_at: datetime | None = None
        """When the last read started, whatever its outcome."""
        self._reading: asyncio.Task[None] | None = None
        self._failing = False
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
        registry.register(FiguresAge(self))

    def age(self) -> float | None:
        """Seconds since the figures served were read (None before any was)."""
        if self._read_at is None:
            return None
        return max((self._clock() - self._read_at).total_seconds(), 0.0)

    async def refresh(self) -> None:
        """Before a scrape: start a read when the figures are older than the interval and none
        is under way; wait for it only while no figures were read yet."""
        reading = self._reading
        if (reading is None or reading.done()) and self._due():
            self._asked_at = self._clock()
            reading = self._reading = asyncio.create_task(self.read(), name="store-figures")
        if reading is not None and self._read_at is None:
            await asyncio.shield(reading)

    def _due(self) -> bool:
        if self._asked_at is None:
            return True
        elapsed = self._clock() - self._asked_at
        return not timedelta(0) <= elapsed < self._interval  # a clock set back counts as due

    async def read(self) -> None:
        """Read the figures now. A store that fails or does not answer in time leaves the last
        figures served (their age grows); one line is logged when reads start failing, and one
        when they succeed again."""
        now = self._clock()
        try:
            async with asyncio.timeout(self._timeout):
                backlog, health = await outbox.store_figures(self._engine)
        except Exception as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "metrics: cannot read the store's figures: %s; the last ones read are served",
                    describe_database_error(exc),
                )
            return
        if self._failing:
            self._failing = False
            log.info("metrics: the store's figures are read again")
        self._set(backlog, health, now)
        self._read_at = now

    def _set(self, backlog: list[Row[Any]], health: list[Row[Any]], now: datetime) -> None:
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

    async def aclose(self) -> None:
        """Cancel a read under way (when the server stops)."""
        reading = self._reading
        if reading is not None and not reading.done():
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)


class FiguresAge(Collector):
    """``relay_store_figures_age_seconds``, computed when collected; absent until the store's
    figures were first read."""

    NAME = "relay_store_figures_age_seconds"
    HELP = "Seconds since the store's gauges served were read from the database."

    def __init__(self, figures: StoreFigures) -> None:
        self._figures = figures

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(self.NAME, self.HELP)]

    def collect(self) -> Iterator[Metric]:
        age = self._figures.age()
        if age is not None:
            yield GaugeMetricFamily(self.NAME, self.HELP, value=age)


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
