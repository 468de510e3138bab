"""Destinations: where received events are relayed (HTTP, Redis streams, arq queues, and the
brokers RabbitMQ, NATS JetStream and MQTT, whose clients are imported only when built). The
types are listed in :mod:`relay.destinations.registry`."""

from relay.destinations.amqp_config import AmqpDestinationConfig
from relay.destinations.arq_queue import ArqDestination, ArqDestinationConfig
from relay.destinations.base import Destination, DestinationType
from relay.destinations.base_config import DestinationBase
from relay.destinations.http import HttpDestination, HttpDestinationConfig, new_http_client
from relay.destinations.mqtt_config import MqttDestinationConfig
from relay.destinations.nats_config import NatsDestinationConfig
from relay.destinations.outbound import (
    BodyFormat,
    Outbound,
    envelope,
    envelope_bytes,
    render,
)
from relay.destinations.outcome import Outcome
from relay.destinations.redis_stream import RedisStreamDestination, RedisStreamDestinationConfig
from relay.destinations.registry import (
    TYPES,
    DestinationConfig,
    build_destination,
    parse_destination_config,
    type_names,
)
from relay.destinations.retry_after import parse_retry_after
from relay.destinations.signing import Signer, generate_secret

__all__ = [
    "TYPES",
    "AmqpDestinationConfig",
    "ArqDestination",
    "ArqDestinationConfig",
    "BodyFormat",
    "Destination",
    "DestinationBase",
    "DestinationConfig",
    "DestinationType",
    "HttpDestination",
    "HttpDestinationConfig",
    "MqttDestinationConfig",
    "NatsDestinationConfig",
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
    "type_names",
]
