"""Constant-time comparison of a token a client sent with the one expected."""

from __future__ import annotations

import hmac


def token_matches(given: str | None, expected: str) -> bool:
    """Whether ``given`` is ``expected``, in constant time; any text may be given (compared
    as UTF-8 bytes: ``hmac.compare_digest`` refuses non-ASCII ``str`` with a TypeError)."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())
