"""Settings of ``nats`` destinations (JetStream); publishing is
:mod:`relay.destinations.nats_jetstream`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import field_validator

from relay.destinations.base import Destination, DestinationType
from relay.destinations.broker_config import BrokerTlsFiles, broker_url, checked_template
from relay.destinations.errors import without_credentials
from relay.destinations.templates import NameTemplate

NATS_SUBJECT_BYTES = 1024
"""Far below what a server accepts: a longer subject is a mistake, not a need."""
NATS_SCHEMES = ("nats", "tls")
NATS_MAX_SERVERS = 32


def nats_servers(value: str) -> list[str]:
    """The server URLs of a NATS destination's ``url``: one, or several joined by commas (the
    seeds of a cluster, tried one after the other in a random order), all ``nats://`` or all
    ``tls://``, with the same credentials where any are given (they are the client's)."""
    urls = value.split(",")
    if len(urls) > NATS_MAX_SERVERS:
        raise ValueError(f"url lists more than {NATS_MAX_SERVERS} servers")
    if len(urls) > 1 and not all(urls):
        raise ValueError("url lists servers joined by single commas, without spaces")
    for url in urls:
        broker_url(url, NATS_SCHEMES)
        if urlsplit(url).path not in ("", "/"):
            raise ValueError("url cannot hold a path (NATS has none)")
    if len({urlsplit(url).scheme for url in urls}) > 1:
        raise ValueError("the servers of url must be all nats:// or all tls://")
    if len({urlsplit(url).netloc.rpartition("@")[0] for url in urls} - {""}) > 1:
        raise ValueError("the servers of url must have the same user and password, or none")
    return urls


def shown_servers(value: str) -> str:
    """A NATS ``url`` to show: each server without its credentials."""
    return ",".join(without_credentials(url) for url in value.split(","))


class NatsDestinationConfig(BrokerTlsFiles):
    """Publish to NATS JetStream; a stream must capture the subjects (core NATS is refused)."""

    TLS_SCHEME: ClassVar[str] = "tls"

    CLIENT_PACKAGE: ClassVar[str] = "nats-py"
    CLIENT: ClassVar[tuple[str, ...]] = ("nats",)

    type: Literal["nats"]
    url: str
    """``nats://[user:password@]host:4222``, ``nats://TOKEN@host`` (or ``tls://``: TLS or
    nothing, see :mod:`relay.destinations.nats_connect`); several servers joined by commas."""
    subject: str
    """A template, as ``"callbacks.{kind}.{source}"``."""

    def target(self) -> str:
        return f"{shown_servers(self.url)} subject {self.subject}"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        nats_servers(value)
        return value

    @field_validator("subject")
    @classmethod
    def _subject(cls, value: str) -> str:
        checked_template(value, limit=NATS_SUBJECT_BYTES, forbidden=" *>", what="subject")
        tokens = NameTemplate(value).longest().split(".")
        if not all(tokens):
            raise ValueError("the subject cannot start or end with '.' nor hold '..'")
        if value.startswith("$"):
            raise ValueError("subjects starting with '$' are the server's own ($JS, $SYS, ...)")
        return value


def _build(name: str, config: NatsDestinationConfig, http_client: Any) -> Destination:
    from relay.destinations.nats_jetstream import NatsDestination

    return NatsDestination(name, config)


TYPE = DestinationType("nats", NatsDestinationConfig, _build)
