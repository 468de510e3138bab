"""Authentication of callbacks: IP allowlist, URL token, basic auth, custom header, HMAC.

Every comparison of a secret is constant-time, and no secret or credential is ever put into a
log line or an error detail.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv6Address, ip_address

from pydantic import SecretStr
from starlette.datastructures import Headers, QueryParams

from receivers.problems import Problem
from receivers.sources import Network, SourceConfig

IPAddress = IPv4Address | IPv6Address

TOKEN_PARAM = "token"
SIGNATURE_HEADER = "x-signature"
TIMESTAMP_HEADER = "x-request-timestamp"
SIGNATURE_VERSION_HEADER = "x-signature-version"
SUPPORTED_SIGNATURE_VERSIONS = frozenset({"v1.0", "v1"})
DIGESTS = {"HS256": hashlib.sha256, "HS512": hashlib.sha512}


class AuthFailure(Problem):
    """A failed check; ``reason`` is a short label for counting, never a secret."""

    def __init__(
        self, status: int, reason: str, detail: str, headers: dict[str, str] | None = None
    ):
        title = "Forbidden" if status == 403 else "Unauthorized"
        super().__init__(status, reason, title, detail, headers=headers)
        self.reason = reason


def client_address(
    peer: str | None, forwarded_for: str | None, trusted_proxies: Sequence[Network]
) -> IPAddress | None:
    """The caller's address: the peer, or X-Forwarded-For's nearest untrusted hop behind
    trusted proxies. X-Forwarded-For from an untrusted peer is ignored."""
    address = _parse_ip(peer)
    if address is None or not forwarded_for or not _in_any(address, trusted_proxies):
        return address
    for hop in reversed([part.strip() for part in forwarded_for.split(",")]):
        hop_address = _parse_ip(hop)
        if hop_address is None:
            return address  # a malformed chain: trust nothing beyond the last proxy
        address = hop_address
        if not _in_any(hop_address, trusted_proxies):
            return hop_address
    return address


def check_address(source: SourceConfig, address: IPAddress | None) -> None:
    """403 unless the caller's address is in the source's allowlist (when one is set)."""
    if source.allow_ips and (address is None or not _in_any(address, source.allow_ips)):
        raise AuthFailure(403, "ip-not-allowed", "The caller's address is not allowed.")


def check_method(source: SourceConfig, method: str) -> None:
    """401 for a GET on a source that needs a signature: the platform signs only POST bodies,
    so nothing in a GET could be verified (a check that cannot apply refuses the request)."""
    if source.signature_secret and method != "POST":
        raise AuthFailure(
            401,
            "unsigned-method",
            f"This source requires a signed POST body; a {method} cannot carry a signature.",
        )


def check_credentials(source: SourceConfig, headers: Headers, query: QueryParams) -> None:
    """401 unless the URL token, basic auth and custom header (those configured) all match.
    A credential given more than once is refused: which copy counts would be a guess."""
    if source.token and not _matches_any(_only(query.getlist(TOKEN_PARAM)), source.token):
        raise AuthFailure(401, "bad-token", "Missing or wrong token in the callback URL.")
    if source.basic_auth and not _matches_any(_basic_credentials(headers), source.basic_auth):
        raise AuthFailure(
            401,
            "bad-basic-auth",
            "Missing or wrong basic auth credentials.",
            headers={"WWW-Authenticate": 'Basic realm="callback-relay"'},
        )
    if source.header is not None and not _matches_any(
        _only(headers.getlist(source.header.name)), [source.header.value]
    ):
        raise AuthFailure(401, "bad-header", f"Missing or wrong {source.header.name} header.")


def check_signature(source: SourceConfig, headers: Headers, body: bytes, now: datetime) -> None:
    """401 unless x-signature is the HMAC of ``x-request-timestamp + "\\n" + raw body`` under one
    of the source's secrets and the timestamp is within the tolerance."""
    if not source.signature_secret:
        return
    versions = headers.getlist(SIGNATURE_VERSION_HEADER)
    if len(versions) > 1 or (
        versions and versions[0].strip().lower() not in SUPPORTED_SIGNATURE_VERSIONS
    ):
        raise AuthFailure(401, "bad-signature", "Unsupported x-signature-version.")
    timestamp_text = _only(headers.getlist(TIMESTAMP_HEADER))
    signature_text = _only(headers.getlist(SIGNATURE_HEADER))
    if not timestamp_text or not signature_text:
        raise AuthFailure(
            401,
            "bad-signature",
            "Missing (or repeated) x-signature or x-request-timestamp header.",
        )
    age = _age_seconds(timestamp_text, now)
    if age is None:
        raise AuthFailure(401, "bad-signature", "Unreadable x-request-timestamp header.")
    if abs(age) > source.signature_tolerance_seconds:
        raise AuthFailure(401, "stale-signature", "The x-request-timestamp is too old or too new.")
    given = _decode_base64url(signature_text)
    digest = DIGESTS[source.signature_method]
    message = timestamp_text.encode("latin-1") + b"\n" + body
    valid = False
    for secret in source.signature_secret:
        expected = hmac.new(secret.get_secret_value().encode(), message, digest).digest()
        valid |= given is not None and hmac.compare_digest(given, expected)
    if not valid:
        raise AuthFailure(401, "bad-signature", "The x-signature does not match the body.")


def sign(secret: str, timestamp: str, body: bytes, method: str = "HS256") -> str:
    """The platform's x-signature for a body: Base64URL(HMAC(secret, timestamp + "\\n" + body))."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"\n" + body, DIGESTS[method]).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def parse_timestamp(text: str) -> datetime | None:
    """Unix seconds, unix milliseconds or ISO 8601; ``None`` when it is none of them or lies
    outside the years a datetime can hold."""
    text = text.strip()
    try:
        number = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    if number != number or abs(number) > 1e14:  # NaN or absurd
        return None
    if abs(number) > 1e11:
        number /= 1000
    try:
        return datetime.fromtimestamp(number, UTC)
    except (ValueError, OverflowError, OSError):  # before year 1 or after 9999
        return None


def _age_seconds(timestamp_text: str, now: datetime) -> float | None:
    """How long ago the timestamp was, or ``None`` when it cannot be read or compared."""
    signed_at = parse_timestamp(timestamp_text)
    if signed_at is None:
        return None
    try:
        return (now - signed_at).total_seconds()
    except OverflowError:  # an offset that pushes year 1 or 9999 out of range
        return None


def _matches_any(given: str | None, secrets: Sequence[SecretStr]) -> bool:
    given_bytes = (given or "").encode("utf-8", "surrogateescape")
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(given_bytes, secret.get_secret_value().encode())
    return matched and given is not None


def _only(values: list[str]) -> str | None:
    """The one value given, or ``None`` when it is missing or repeated."""
    return values[0] if len(values) == 1 else None


def _basic_credentials(headers: Headers) -> str | None:
    scheme, _, encoded = (_only(headers.getlist("authorization")) or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):  # binascii.Error, or text beyond ASCII
        return None


def _decode_base64url(text: str) -> bytes | None:
    cleaned = text.strip().replace("+", "-").replace("/", "_").rstrip("=")
    try:
        return base64.urlsafe_b64decode(cleaned + "=" * (-len(cleaned) % 4))
    except (binascii.Error, ValueError):
        return None


def _parse_ip(text: str | None) -> IPAddress | None:
    if not text:
        return None
    try:
        address = ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _in_any(address: IPAddress, networks: Sequence[Network]) -> bool:
    return any(address in network for network in networks)
