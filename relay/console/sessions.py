"""Console logins: password checks in constant time, signed session cookies, CSRF tokens.

A session is a cookie signed with the installation's console key (kept in the database, so
every `relay serve` of one deployment accepts it). It names the user and carries a nonce;
the CSRF token of every form is an HMAC of that nonce. Changing a user's password ends their
sessions (the cookie also carries a fingerprint of the password it was issued under).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from itsdangerous import BadData, URLSafeTimedSerializer

SESSION_COOKIE = "relay_console"
LOGIN_COOKIE = "relay_console_login"
LOGIN_FORM_LIFETIME = timedelta(hours=1)


@dataclass(frozen=True)
class Operator:
    """A logged-in user of the console."""

    name: str
    nonce: str


class Sessions:
    """Issues and checks the console's cookies and tokens for a fixed set of users."""

    def __init__(self, key: str, users: Mapping[str, str], lifetime: timedelta) -> None:
        self._key = key.encode()
        self._users = {name: _digest(password) for name, password in users.items()}
        self._lifetime = lifetime
        self._sessions = URLSafeTimedSerializer(key, salt="relay-console-session")
        self._logins = URLSafeTimedSerializer(key, salt="relay-console-login")

    @property
    def lifetime(self) -> timedelta:
        return self._lifetime

    def password_matches(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s; the same work whether or not the user exists."""
        expected = self._users.get(name, b"\0" * 32)
        return hmac.compare_digest(_digest(password), expected) and name in self._users

    def session_cookie(self, name: str) -> str:
        """A new session for ``name`` (who must exist)."""
        nonce = secrets.token_urlsafe(16)
        return self._sessions.dumps({"u": name, "n": nonce, "f": self._fingerprint(name)})

    def operator(self, cookie: str | None) -> Operator | None:
        """The user of a session cookie: None when it is missing, forged, too old, or was
        issued under a password that has changed since."""
        data = self._load(self._sessions, cookie, self._lifetime)
        if data is None:
            return None
        name, nonce, fingerprint = data.get("u"), data.get("n"), data.get("f")
        if not (isinstance(name, str) and isinstance(nonce, str) and isinstance(fingerprint, str)):
            return None
        if name not in self._users or not hmac.compare_digest(fingerprint, self._fingerprint(name)):
            return None
        return Operator(name, nonce)

    def csrf_token(self, operator: Operator) -> str:
        """The token every form of this session carries."""
        return self._mac("csrf", operator.nonce)

    def csrf_matches(self, operator: Operator, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token, self.csrf_token(operator))

    def login_cookie(self) -> tuple[str, str]:
        """A cookie for the login form and the token its form carries (login CSRF)."""
        nonce = secrets.token_urlsafe(16)
        return self._logins.dumps(nonce), self._mac("login", nonce)

    def login_matches(self, cookie: str | None, token: str | None) -> bool:
        nonce = self._load(self._logins, cookie, LOGIN_FORM_LIFETIME)
        if not isinstance(nonce, str) or token is None:
            return False
        return hmac.compare_digest(token, self._mac("login", nonce))

    def _fingerprint(self, name: str) -> str:
        return self._mac("password", self._users[name].hex())[:22]

    def _mac(self, purpose: str, value: str) -> str:
        message = f"{purpose}:{value}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    @staticmethod
    def _load(serializer: URLSafeTimedSerializer, cookie: str | None, age: timedelta) -> Any:
        if not cookie or len(cookie) > 4096:
            return None
        try:
            return serializer.loads(cookie, max_age=age.total_seconds())
        except (BadData, UnicodeError, ValueError):
            return None


def _digest(password: str) -> bytes:
    return hashlib.sha256(password.encode("utf-8", "surrogatepass")).digest()
