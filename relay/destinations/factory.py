"""Building destinations from their settings.

A broker's destination module is imported only when a destination of its type is configured:
its client library (aio-pika, nats-py, paho-mqtt) is loaded by no other module and no other
process."""

from __future__ import annotations

import httpx

from relay.destinations.arq_queue import ArqDestination
from relay.destinations.base import Destination
from relay.destinations.config import (
    AmqpDestinationConfig,
    ArqDestinationConfig,
    DestinationConfig,
    HttpDestinationConfig,
    MqttDestinationConfig,
    NatsDestinationConfig,
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
        case AmqpDestinationConfig():
            from relay.destinations.amqp import AmqpDestination

            return AmqpDestination(name, config)
        case NatsDestinationConfig():
            from relay.destinations.nats_jetstream import NatsDestination

            return NatsDestination(name, config)
        case MqttDestinationConfig():
            from relay.destinations.mqtt import MqttDestination

            return MqttDestination(name, config)
    raise TypeError(f"unknown destination config: {type(config).__name__}")
