"""The destination types, in one place: each ``[destinations.NAME]`` table's ``type`` names one.

A type's module declares its settings model and its builder as ``TYPE``
(:class:`~relay.destinations.base.DestinationType`); adding a type is that module and one line
in :data:`TYPES`. The brokers' ``TYPE`` lives in their light settings modules
(``amqp_config.py``...): their builders import the client's module, so that aio-pika, nats-py
or paho-mqtt are loaded only where a destination of their type is built.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import httpx
from pydantic import BeforeValidator, Field, TypeAdapter

from relay.destinations import amqp_config, arq_queue, http, mqtt_config, nats_config, redis_stream
from relay.destinations.base import Destination, DestinationType
from relay.destinations.base_config import DestinationBase

TYPES: tuple[DestinationType, ...] = (
    http.TYPE,
    redis_stream.TYPE,
    arq_queue.TYPE,
    amqp_config.TYPE,
    nats_config.TYPE,
    mqtt_config.TYPE,
)
BY_NAME: Mapping[str, DestinationType] = {kind.name: kind for kind in TYPES}
BY_MODEL: Mapping[type[DestinationBase], DestinationType] = {kind.config: kind for kind in TYPES}


def type_names() -> list[str]:
    """The ``type`` values a destination table may have, in the registry's order."""
    return list(BY_NAME)


def _known_type(value: object) -> object:
    """A table's ``type``, refused with the list of types where it names none."""
    if isinstance(value, Mapping):
        kind = value.get("type")
        known = ", ".join(type_names())
        if kind is None:
            raise ValueError(f"type is missing: one of {known}")
        if not isinstance(kind, str) or kind not in BY_NAME:
            raise ValueError(f"type {kind!r} is not a destination type (known: {known})")
    return value


if TYPE_CHECKING:
    DestinationConfig = DestinationBase
else:
    DestinationConfig = Annotated[
        typing.Union[tuple(kind.config for kind in TYPES)],  # noqa: UP007 - built at run time
        Field(discriminator="type"),
        BeforeValidator(_known_type),
    ]
"""One ``[destinations.NAME]`` table; ``type`` chooses the model."""

DESTINATION_CONFIG: TypeAdapter[DestinationConfig] = TypeAdapter(DestinationConfig)


def parse_destination_config(data: Mapping[str, Any]) -> DestinationConfig:
    """Validate one destination table (raises pydantic's ValidationError)."""
    return DESTINATION_CONFIG.validate_python(data)


def build_destination(
    name: str, config: DestinationBase, *, http_client: httpx.AsyncClient | None = None
) -> Destination:
    """The destination ``config`` describes; HTTP ones use ``http_client`` when given."""
    kind = BY_MODEL.get(type(config))
    if kind is None:
        raise TypeError(f"unknown destination config: {type(config).__name__}")
    return kind.build(name, config, http_client)
