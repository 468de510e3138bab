"""The console's users: passwords checked in constant time, and each password's fingerprint."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from relay.console.config import USER_NAME

FINGERPRINT_LENGTH = 32
"""Hex digits of a password's fingerprint kept with each session (128 bits)."""


class Users:
    """A fixed set of users and their passwords (from ``[console.users]`` or generated)."""

    def __init__(self, key: str, passwords: Mapping[str, str]) -> None:
        self._key = key.encode()
        self._digests = {name: _digest(password) for name, password in passwords.items()}

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._digests)

    def password_matches(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s; the same work whether or not the user exists."""
        expected = self._digests.get(name, b"\0" * 32)
        return hmac.compare_digest(_digest(password), expected) and name in self._digests

    def fingerprint(self, name: str) -> str | None:
        """A MAC, under the installation's key, of ``name``'s password (None for no such
        user): a session remembers the one it was opened under, so a new password ends it."""
        digest = self._digests.get(name)
        if digest is None:
            return None
        mac = hmac.new(self._key, b"password:" + digest, hashlib.sha256)
        return mac.hexdigest()[:FINGERPRINT_LENGTH]


def could_be_user(name: str) -> bool:
    """Whether ``name`` has the shape of a console user name (so may be one)."""
    return USER_NAME.fullmatch(name) is not None


def _digest(password: str) -> bytes:
    return hashlib.sha256(password.encode("utf-8", "surrogatepass")).digest()
