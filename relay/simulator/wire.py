"""How the platform puts a callback on the wire: URL, method, encoding, credentials, signature.

A callback's body is serialised once; every retry sends the identical bytes. Only transport
headers (the signature's timestamp and the signature) change between attempts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from receivers.auth import sign
from relay.simulator.scenarios import Callback

GET_KINDS = frozenset({"sms.inbound", "sms.dlr"})
USER_AGENT = "callback-relay-simulator"


@dataclass(frozen=True)
class Credentials:
    """What the platform was configured with to protect its callbacks."""

    secret: str | None = None
    signature_method: str = "HS256"
    header: tuple[str, str] | None = None


@dataclass(frozen=True)
class Endpoint:
    """The receiver's base URL as given to the platform: userinfo becomes basic auth and the
    query (e.g. ``?token=...``) is kept on every request."""

    base: str
    query: tuple[tuple[str, str], ...] = ()
    basic_auth: tuple[str, str] | None = None
    exact: bool = False

    @classmethod
    def parse(cls, url: str, *, exact: bool = False) -> Endpoint:
        """``http://user:pass@host:8000/hooks?token=t`` -> base, query and basic auth."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        if parts.port:
            netloc += f":{parts.port}"
        auth = (parts.username or "", parts.password or "") if parts.username else None
        base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        return cls(base, tuple(parse_qsl(parts.query, keep_blank_values=True)), auth, exact)

    def url_for(self, path: str) -> str:
        """The full URL for a receiver path (unless the endpoint is exact)."""
        return self.base if self.exact else self.base + path


@dataclass(frozen=True)
class Prepared:
    """A callback ready to send, the same bytes for every attempt."""

    method: str
    url: str
    query: tuple[tuple[str, str], ...]
    body: bytes | None
    headers: Mapping[str, str] = field(default_factory=dict)


def prepare(callback: Callback, endpoint: Endpoint, method: str = "POST") -> Prepared:
    """Encode a callback: POST JSON, or GET with the flat fields as query parameters (sms.*)."""
    url = endpoint.url_for(callback.path)
    if method == "GET":
        if callback.kind not in GET_KINDS:
            raise ValueError(f"{callback.kind} callbacks are only POSTed")
        return Prepared(
            "GET",
            url,
            endpoint.query + query_fields(callback.body),
            None,
            {"user-agent": USER_AGENT},
        )
    body = json.dumps(callback.body, ensure_ascii=False, separators=(",", ":")).encode()
    headers = {"content-type": "application/json", "user-agent": USER_AGENT}
    return Prepared("POST", url, endpoint.query, body, headers)


def query_fields(body: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Flat query parameters: lists and objects as JSON, booleans lower-case, nulls left out."""
    pairs = []
    for key, value in body.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, dict | list):
            text = json.dumps(value, separators=(",", ":"))
        else:
            text = str(value)
        pairs.append((key, text))
    return tuple(pairs)


def attempt_headers(
    prepared: Prepared, credentials: Credentials, now: float | None = None
) -> dict[str, str]:
    """The headers of one attempt: the custom header and a fresh HMAC signature."""
    headers = dict(prepared.headers)
    if credentials.header is not None:
        headers[credentials.header[0]] = credentials.header[1]
    if credentials.secret is not None:
        stamp = str(int(time.time() if now is None else now))
        headers["x-request-timestamp"] = stamp
        headers["x-signature"] = sign(
            credentials.secret, stamp, prepared.body or b"", credentials.signature_method
        )
        headers["x-signature-version"] = "V1.0"
    return headers


def full_url(prepared: Prepared) -> str:
    """The URL with its query string (what appears on the wire)."""
    return prepared.url + ("?" + urlencode(prepared.query) if prepared.query else "")
