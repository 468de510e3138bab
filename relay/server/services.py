"""The relay's moving parts built from settings: router, destinations, deliverer, sweeper."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import StoreWritable
from relay import outbox
from relay.delivery.deliverer import Deliverer, Target, attempt_lease
from relay.destinations import Destination, build_destination, new_http_client
from relay.destinations.errors import DestinationRefused
from relay.dispatch import Dispatcher
from relay.observe.metrics import WorkerMetrics
from relay.outbox.router import Router
from relay.outbox.sweeper import Sweeper
from relay.settings import Settings, SettingsError
from relay.store.pruner import Pruner

log = logging.getLogger("relay.services")  # stable: users filter on it

START_WAIT_SECONDS = 5.0
"""The longest a worker waits for its destinations to connect when it starts."""
HTTP_LIMITS = httpx.Limits(max_connections=200, max_keepalive_connections=100)
"""The connection limits of a worker's HTTP destinations (one client, shared)."""


@dataclass
class WorkerServices:
    """What a relay worker needs; close it when done."""

    deliverer: Deliverer
    queue: Dispatcher
    sweeper: Sweeper
    http_client: httpx.AsyncClient
    targets: dict[str, Target]
    pruner: Pruner | None = None
    """Applies ``retention`` in the background; None while it is not set."""

    async def start(self) -> None:
        """Start every destination, all at once, waiting at most :data:`START_WAIT_SECONDS`
        (a broker that accepts connections and never answers must not keep the worker, or
        `relay serve`'s receivers, from starting); one still connecting then is left to its
        first delivery. SettingsError names a destination whose setup can never deliver."""

        async def start_one(name: str, destination: Destination) -> None:
            try:
                async with asyncio.timeout(START_WAIT_SECONDS):
                    await destination.start()
            except TimeoutError:
                log.warning(
                    "destination %r: still connecting after %g s at start; its deliveries "
                    "will try again",
                    name,
                    START_WAIT_SECONDS,
                )
            except DestinationRefused as refused:
                raise SettingsError(f"destination {name!r}: {refused}") from None

        await asyncio.gather(*(start_one(n, t.destination) for n, t in self.targets.items()))

    async def aclose(self) -> None:
        """Close every destination's connections."""
        for target in self.targets.values():
            await target.destination.aclose()
        await self.http_client.aclose()


def router_for(settings: Settings) -> Router:
    """Fan-out over the configured destinations."""
    return Router(settings.destinations)


def lease_for(settings: Settings) -> timedelta:
    """The attempt lease (also the arq job timeout): the longest destination timeout + margin."""
    return attempt_lease((d.timeout for d in settings.destinations.values()), settings.lease_margin)


def worker_services(
    settings: Settings,
    engine: AsyncEngine,
    queue: Dispatcher,
    clock: Callable[[], datetime],
    *,
    metrics: WorkerMetrics | None = None,
    writable: StoreWritable | None = None,
) -> WorkerServices:
    """Build the destinations and the deliverer of one worker, whose sweeper dispatches on
    ``queue``; its deliverer and sweeper record in ``metrics`` (a private registry by default),
    and tell the store's outages they meet to ``writable`` (the process's state of the relay's
    writes; a new one by default)."""
    writable = writable if writable is not None else StoreWritable(outbox.RELAY_WRITES)
    metrics = metrics if metrics is not None else WorkerMetrics()
    http_client = new_http_client(limits=HTTP_LIMITS)
    targets = {
        name: Target(build_destination(name, config, http_client=http_client), config.timeout)
        for name, config in settings.destinations.items()
    }
    deliverer = Deliverer(
        engine,
        targets,
        settings.resolved_policies(),
        clock=clock,
        lease=lease_for(settings),
        concurrency=settings.worker_concurrency,
        metrics=metrics,
        writable=writable,
    )
    sweeper = Sweeper(
        engine,
        router_for(settings),
        queue,
        clock=clock,
        interval=settings.sweep_interval,
        metrics=metrics,
        writable=writable,
    )
    pruner = (
        Pruner(engine, settings.retention, clock=clock) if settings.retention is not None else None
    )
    return WorkerServices(deliverer, queue, sweeper, http_client, targets, pruner)
