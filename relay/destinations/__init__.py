"""Destinations: where received events are relayed (HTTP, Redis streams, arq queues, and the
brokers RabbitMQ, NATS JetStream and MQTT, whose modules are imported only when configured)."""

from relay.destinations.arq_queue import ArqDestination
from relay.destinations.base import Destination
from relay.destinations.config import (
    ArqDestinationConfig,
    DestinationBase,
    DestinationConfig,
    HttpDestinationConfig,
    RedisStreamDestinationConfig,
    parse_destination_config,
)
from relay.destinations.factory import build_destination
from relay.destinations.http import HttpDestination, new_http_client
from relay.destinations.outbound import (
    BodyFormat,
    Outbound,
    envelope,
    envelope_bytes,
    render,
)
from relay.destinations.outcome import Outcome
from relay.destinations.redis_stream import RedisStreamDestination
from relay.destinations.retry_after import parse_retry_after
from relay.destinations.signing import Signer, generate_secret

__all__ = [
    "ArqDestination",
    "ArqDestinationConfig",
    "BodyFormat",
    "Destination",
    "DestinationBase",
    "DestinationConfig",
    "HttpDestination",
    "HttpDestinationConfig",
    "Outbound",
    "Outcome",
    "RedisStreamDestination",
    "RedisStreamDestinationConfig",
    "Signer",
    "build_destination",
    "envelope",
    "envelope_bytes",
    "generate_secret",
    "new_http_client",
    "parse_destination_config",
    "parse_retry_after",
    "render",
]
