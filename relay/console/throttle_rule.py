"""Whom a console login attempt is counted against, and how long a count makes the next wait.

OWASP's device cookies, with growing delays instead of fixed lockouts:

- a login from a browser holding a device cookie for the user it logs in as is counted against
  that cookie only: failures made elsewhere never delay it;
- any other login is counted against its client address (an IPv6 address by its /64, which one
  host usually holds whole) and against the user name it tries, so that neither one address
  guessing many users' passwords nor many addresses guessing one user's get far.

A key's first :data:`FREE_FAILURES` failures cost nothing; from then on each failure makes the
key's next attempt wait :data:`FIRST_DELAY`, doubling up to :data:`LONGEST_DELAY`. A key is
forgotten :data:`FORGET_AFTER` after its last attempt. Pure values: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from ipaddress import IPv4Address, IPv6Address, ip_network

from relay.console.login_cookies import Device
from relay.console.users import could_be_user

FREE_FAILURES = 5
FIRST_DELAY = timedelta(seconds=1)
LONGEST_DELAY = timedelta(minutes=15)
FORGET_AFTER = timedelta(days=1)
IPV6_PREFIX = 64


@dataclass(frozen=True)
class LoginAttempt:
    """The throttle's keys of one login attempt (sorted: rows are locked in this order)."""

    keys: tuple[str, ...]
    """Every key the attempt is counted against; it waits for the longest of their delays."""
    device_key: str | None = None
    """The device cookie's key: a success forgets it (the browser gets a new cookie)."""


def delay_after(failures: int) -> timedelta:
    """How long a key with ``failures`` counted failures makes its next attempt wait."""
    if failures < FREE_FAILURES:
        return timedelta(0)
    doublings = min(failures - FREE_FAILURES, 32)  # 2**32 s is past any longest delay
    return min(LONGEST_DELAY, FIRST_DELAY * 2**doublings)


def login_attempt(
    user: str, address: IPv4Address | IPv6Address | None, device: Device | None
) -> LoginAttempt:
    """The keys a login as ``user`` from ``address`` (with ``device``'s cookie, if any) is
    counted against."""
    if device is not None and device.user == user:
        key = f"device:{_bounded(device.nonce)}"
        return LoginAttempt((key,), device_key=key)
    keys = [address_key(address)]
    if could_be_user(user):
        keys.append(f"user:{user}")
    return LoginAttempt(tuple(sorted(keys)))


def address_key(address: IPv4Address | IPv6Address | None) -> str:
    """The key of a client address: IPv4 as it is, IPv6 by its /64 (IPv4-mapped as IPv4)."""
    if address is None:
        return "address:unknown"
    if isinstance(address, IPv6Address):
        if address.ipv4_mapped is not None:
            return f"address:{address.ipv4_mapped}"
        return f"address:{ip_network((address, IPV6_PREFIX), strict=False)}"
    return f"address:{address}"


def _bounded(text: str) -> str:
    """``text`` when it is short, else its hash (a key fits its column whatever came in)."""
    return text if len(text) <= 64 else "#" + hashlib.sha256(text.encode()).hexdigest()[:32]
