"""Standard Webhooks signatures (``webhook-signature``), with several secrets during rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24


def secret_key(secret: str) -> bytes:
    """The key bytes of a ``whsec_<base64>`` secret; ValueError when it is malformed."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f'a webhook secret must start with "{SECRET_PREFIX}"')
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except ValueError:
        raise ValueError(f"a webhook secret must be {SECRET_PREFIX} followed by base64") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(
            f"a webhook secret must hold at least {MIN_SECRET_BYTES} random bytes "
            f"(this one holds {len(key)})"
        )
    return key


def generate_secret(size: int = 32) -> str:
    """A new random ``whsec_`` secret."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(size)).decode()


class Signer:
    """Signs bodies with every configured secret: ``v1,<sig> v1,<sig>``, one per secret.

    Consumers holding any one of the secrets can verify, so secrets can be rotated without a gap.
    Signing uses ``standardwebhooks``; it only signs text, so a body that is not UTF-8 is signed
    over its bytes the same way (what the spec says), which byte-based verifiers accept.
    """

    def __init__(self, secrets_: Sequence[str]) -> None:
        if not secrets_:
            raise ValueError("a signer needs at least one secret")
        self._keys = [secret_key(secret) for secret in secrets_]
        self._webhooks = [Webhook(key) for key in self._keys]

    def signature(self, msg_id: str, timestamp: int, body: bytes) -> str:
        """The ``webhook-signature`` header value for ``body`` sent at ``timestamp`` (Unix s)."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return " ".join(_sign_bytes(key, msg_id, timestamp, body) for key in self._keys)
        moment = datetime.fromtimestamp(timestamp, UTC)
        return " ".join(webhook.sign(msg_id, moment, text) for webhook in self._webhooks)


def _sign_bytes(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
