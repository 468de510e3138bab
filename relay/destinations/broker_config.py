"""What the settings of the message-broker destinations share: ``amqp`` (RabbitMQ), ``nats``
(JetStream) and ``mqtt`` (each type's own model is in ``<type>_config.py``).

Each publishes one message per event (``format``: the envelope or the platform's raw body),
with the headers of :mod:`relay.destinations.message_headers`, to a name built by a template
(:mod:`relay.destinations.templates`). A delivery succeeds only once the broker has taken
the message: a publisher confirm, a JetStream ack, a PUBACK (QoS 1) or PUBCOMP (QoS 2).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, get_args
from urllib.parse import unquote, urlsplit

from pydantic import Field, field_validator, model_validator

from relay.destinations.base_config import DestinationBase, Secrets
from relay.destinations.broker_clients import require_client
from relay.destinations.outbound import BodyFormat
from relay.destinations.templates import NameTemplate
from relay.destinations.tls_files import TlsFiles


class BrokerDestinationBase(DestinationBase):
    """What every broker destination takes beside filters, policy and timeout; a table is
    refused first where the type's client (``CLIENT``, from ``CLIENT_PACKAGE``) is not
    installed (:mod:`relay.destinations.broker_clients`)."""

    CLIENT_PACKAGE: ClassVar[str]
    CLIENT: ClassVar[tuple[str, ...]]
    """The top-level modules the type's destination imports, its client's first."""

    format: BodyFormat = "envelope"
    secret: Secrets = Field(default_factory=list)
    """``whsec_...`` secrets: each message carries a ``webhook-signature`` header."""

    @model_validator(mode="before")
    @classmethod
    def _client_installed(cls, data: Any) -> Any:
        (type_name,) = get_args(cls.model_fields["type"].annotation)  # Literal["amqp"]
        require_client(type_name, cls.CLIENT_PACKAGE, cls.CLIENT)
        return data


class BrokerTlsFiles(BrokerDestinationBase):
    """The TLS files of a broker destination whose URL asks for TLS (its scheme is
    ``TLS_SCHEME``): ``cafile`` (the CAs that sign the broker's certificate; by default the
    system's), ``certfile`` and ``keyfile`` (a client certificate, for a broker that asks for
    one)."""

    TLS_SCHEME: ClassVar[str]
    url: str
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    @property
    def tls(self) -> bool:
        """Whether the url asks for TLS."""
        return self.url.startswith(f"{self.TLS_SCHEME}://")

    @field_validator("cafile", "certfile", "keyfile")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and (not value or not value.isprintable() or len(value) > 4096):
            raise ValueError("must be the path of a file: one printable line, not empty")
        return value

    def tls_files(self) -> TlsFiles | None:
        """What the destination's TLS context is made of, where its URL asks for TLS."""
        return TlsFiles(self.cafile, None, self.certfile, self.keyfile) if self.tls else None

    @model_validator(mode="after")
    def _tls_files(self) -> BrokerTlsFiles:
        if not self.tls and (self.cafile or self.certfile or self.keyfile):
            raise ValueError(f"cafile, certfile and keyfile need a {self.TLS_SCHEME}:// url")
        if self.keyfile and not self.certfile:
            raise ValueError("keyfile needs certfile")
        return self


def broker_url(value: str, schemes: tuple[str, ...], *, query: bool = False) -> str:
    """``value`` if it is a ``scheme://[user:password@]host[:port]...`` URL of ``schemes``."""
    if any(not c.isprintable() or c.isspace() for c in value):
        raise ValueError("url cannot hold spaces or control characters")
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise ValueError(f"url must start with {' or '.join(s + '://' for s in schemes)}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError("url has an invalid port") from None
    if not parts.hostname:
        raise ValueError("url must name a host")
    if parts.fragment or (parts.query and not query):
        raise ValueError("url cannot hold a query or a fragment")
    if "@" in parts.netloc:
        _credentials(parts.netloc.rpartition("@")[0])
    return value


BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _credentials(userinfo: str) -> None:
    """Refuse credentials that would not reach the broker as written: an empty user (or
    token), a ``%`` that starts no escape, escapes that are not UTF-8, or control characters
    once decoded (the broker would get other bytes, or a NUL)."""
    user = userinfo.partition(":")[0]
    if not user:
        raise ValueError("url has credentials without a user (or token) before '@'")
    if BAD_ESCAPE.search(userinfo):
        raise ValueError("url credentials hold a '%' that is not an escape: write '%25' for '%'")
    try:
        decoded = unquote(userinfo, errors="strict")
    except UnicodeDecodeError:
        raise ValueError("url credentials hold escapes that are not UTF-8 text") from None
    if not decoded.isprintable():
        raise ValueError("url credentials cannot hold control characters, even escaped")


def checked_template(value: str, *, limit: int, forbidden: str = "", what: str = "name") -> str:
    """``value`` if it is a template whose names stay within ``limit`` UTF-8 bytes and whose
    own text holds none of ``forbidden`` (nor control characters)."""
    template = NameTemplate(value)
    literal = template.literal
    if any(not c.isprintable() for c in literal):
        raise ValueError(f"the {what} cannot hold control characters")
    bad = sorted({c for c in literal if c in forbidden})
    if bad:
        raise ValueError(f"the {what} cannot hold {' or '.join(repr(c) for c in bad)}")
    longest = len(template.longest().encode())
    if longest > limit:
        raise ValueError(f"the {what} can reach {longest} bytes, over the limit of {limit}")
    return value
