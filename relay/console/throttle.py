"""Failed console logins per client address: after too many, the address waits."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta

MAX_FAILURES = 10
WINDOW = timedelta(minutes=5)
MAX_TRACKED = 10_000
"""Addresses remembered at most (the oldest are forgotten first)."""


class LoginThrottle:
    """Counts failed logins per address in a sliding window; one instance per console app."""

    def __init__(
        self,
        clock: Callable[[], datetime],
        max_failures: int = MAX_FAILURES,
        window: timedelta = WINDOW,
    ) -> None:
        self._clock = clock
        self._max = max_failures
        self._window = window
        self._failures: OrderedDict[str, list[datetime]] = OrderedDict()

    def retry_after(self, address: str) -> int:
        """Seconds this address must wait before it may try again (0: it may now)."""
        recent = self._recent(address)
        if len(recent) < self._max:
            return 0
        return max(1, int((recent[0] + self._window - self._clock()).total_seconds()) + 1)

    def failed(self, address: str) -> None:
        recent = self._recent(address)
        recent.append(self._clock())
        self._failures[address] = recent[-self._max :]
        self._failures.move_to_end(address)
        while len(self._failures) > MAX_TRACKED:
            self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)

    def _recent(self, address: str) -> list[datetime]:
        since = self._clock() - self._window
        return [moment for moment in self._failures.get(address, []) if moment > since]
