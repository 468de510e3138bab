"""The login page's two signed cookies: the login form's token (against login CSRF) and the
device cookie, which marks a browser where a user logged in before.

A device cookie names its user and carries a nonce. A login for that user from that browser is
throttled by the cookie's own failures only, never by failures from elsewhere, so a stranger
guessing the user's password cannot lock the user out of the browsers they use (OWASP's
"Slow Down Online Guessing Attacks with Device Cookies"; see :mod:`relay.console.throttle_rule`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from itsdangerous import BadData, URLSafeSerializer, URLSafeTimedSerializer

from relay.console.compare import token_matches

LOGIN_COOKIE = "relay_console_login"
DEVICE_COOKIE = "relay_console_device"
LOGIN_FORM_LIFETIME = timedelta(hours=1)
DEVICE_LIFETIME = timedelta(days=30)
MAX_COOKIE_LENGTH = 4096


@dataclass(frozen=True)
class Device:
    """A browser where ``user`` logged in within :data:`DEVICE_LIFETIME`."""

    user: str
    nonce: str


class LoginCookies:
    """Issues and checks the login page's cookies, signed with the installation's key."""

    def __init__(self, key: str, clock: Callable[[], datetime]) -> None:
        self._key = key.encode()
        self._clock = clock
        self._forms = URLSafeTimedSerializer(key, salt="relay-console-login")
        self._devices = URLSafeSerializer(key, salt="relay-console-device")

    def form_cookie(self) -> tuple[str, str]:
        """A cookie for the login form and the token its form carries (login CSRF)."""
        nonce = secrets.token_urlsafe(16)
        return self._forms.dumps(nonce), self._mac(nonce)

    def form_matches(self, cookie: str | None, token: str | None) -> bool:
        age = LOGIN_FORM_LIFETIME.total_seconds()
        nonce = _load(cookie, lambda value: self._forms.loads(value, max_age=age))
        return isinstance(nonce, str) and token_matches(token, self._mac(nonce))

    def device_cookie(self, user: str) -> str:
        """A new device cookie for ``user``, who just logged in from this browser."""
        issued = int(self._clock().timestamp())
        return self._devices.dumps({"u": user, "n": secrets.token_urlsafe(16), "t": issued})

    def device(self, cookie: str | None) -> Device | None:
        """The device a cookie names: None when it is missing, forged or too old."""
        data = _load(cookie, self._devices.loads)
        if not isinstance(data, dict):
            return None
        user, nonce, issued = data.get("u"), data.get("n"), data.get("t")
        if not (isinstance(user, str) and isinstance(nonce, str) and type(issued) is int):
            return None
        age = self._clock().timestamp() - issued
        if not 0 <= age < DEVICE_LIFETIME.total_seconds():
            return None
        return Device(user, nonce)

    def _mac(self, nonce: str) -> str:
        return hmac.new(self._key, f"login:{nonce}".encode(), hashlib.sha256).hexdigest()


def _load(cookie: str | None, loads: Callable[[str], Any]) -> Any:
    if not cookie or len(cookie) > MAX_COOKIE_LENGTH:
        return None
    try:
        return loads(cookie)
    except (BadData, UnicodeError, ValueError):
        return None
