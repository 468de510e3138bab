"""Settings of ``mqtt`` destinations (MQTT 5); publishing is :mod:`relay.destinations.mqtt`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from relay.destinations.base import Destination, DestinationType
from relay.destinations.broker_config import BrokerTlsFiles, broker_url, checked_template
from relay.destinations.errors import without_credentials

MQTT_TOPIC_BYTES = 65_535


class MqttDestinationConfig(BrokerTlsFiles):
    """Publish to an MQTT 5 broker with QoS 1 or 2, retain off."""

    TLS_SCHEME: ClassVar[str] = "mqtts"

    CLIENT_PACKAGE: ClassVar[str] = "paho-mqtt"
    CLIENT: ClassVar[tuple[str, ...]] = ("paho",)

    type: Literal["mqtt"]
    url: str
    """``mqtt://[user:password@]host:1883`` (or ``mqtts://``)."""
    topic: str
    """A template, as ``"callbacks/{kind}/{source}"``."""
    qos: Literal[1, 2] = 1
    client_id_prefix: str = Field(default="callback-relay-", min_length=1, max_length=48)
    """Each connection's client id is this and 16 random hex digits: every worker process
    needs its own id (a broker closes the older of two connections with one id)."""

    def target(self) -> str:
        return f"{without_credentials(self.url)} topic {self.topic} QoS {self.qos}"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return broker_url(value, ("mqtt", "mqtts"))

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        checked_template(value, limit=MQTT_TOPIC_BYTES, forbidden="+#\0", what="topic")
        if value.startswith("$"):
            raise ValueError("topics starting with '$' are the broker's own")
        return value

    @field_validator("client_id_prefix")
    @classmethod
    def _client_id_prefix(cls, value: str) -> str:
        if not value.isascii() or not value.isprintable():
            raise ValueError("client_id_prefix must be printable ASCII")
        return value


def _build(name: str, config: MqttDestinationConfig, http_client: Any) -> Destination:
    from relay.destinations.mqtt import MqttDestination  # the client, when built

    return MqttDestination(name, config)


TYPE = DestinationType("mqtt", MqttDestinationConfig, _build)
