"""Building destinations from their settings."""

from __future__ import annotations

import httpx

from relay.destinations.arq_queue import ArqDestination
from relay.destinations.base import Destination
from relay.destinations.config import (
    ArqDestinationConfig,
    DestinationConfig,
    HttpDestinationConfig,
    RedisStreamDestinationConfig,
)
from relay.destinations.http import HttpDestination
from relay.destinations.redis_stream import RedisStreamDestination


def build_destination(
    name: str, config: DestinationConfig, *, http_client: httpx.AsyncClient | None = None
) -> Destination:
    """The destination ``config`` describes; HTTP ones use ``http_client`` when given."""
    match config:
        case HttpDestinationConfig():
            return HttpDestination(name, config, client=http_client)
        case RedisStreamDestinationConfig():
            return RedisStreamDestination(name, config)
        case ArqDestinationConfig():
            return ArqDestination(name, config)
    raise TypeError(f"unknown destination config: {type(config).__name__}")
