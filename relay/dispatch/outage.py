"""One line when a service that a process keeps using is lost, one when it is back.

A process calls its database and the queue's Redis in loops (polls, jobs, sweeps, callbacks): an
outage of either would otherwise be a traceback per call. :class:`Outage` turns it into two
lines, whatever the number of calls that failed meanwhile: ``<service> lost: <reason>`` (WARNING,
the reason on one line, without a traceback or a credential) and ``<service> back after
<duration>`` (INFO). The traceback of the first failure is logged at DEBUG only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from relay.destinations.errors import describe_error

log = logging.getLogger("relay.outage")  # stable: users filter on it


class Outage:
    """Whether ``service`` is lost, since when and why; :meth:`lost` and :meth:`back` log its
    two transitions, once each per outage. ``clock`` gives seconds (monotonic)."""

    def __init__(
        self,
        service: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.service = service
        self._clock = clock
        self._log = logger
        self._since: float | None = None
        self.reason: str | None = None
        """Why the service is lost (None while it answers)."""

    @property
    def ongoing(self) -> bool:
        """Whether the service is lost now."""
        return self._since is not None

    def lost(self, error: BaseException) -> bool:
        """A call failed with ``error``: the WARNING line when the service was answering until
        now (True), nothing more while it is lost already (False)."""
        if self._since is not None:
            return False
        self._since = self._clock()
        self.reason = describe_error(error)
        self._log.warning("%s lost: %s", self.service, self.reason)
        self._log.debug("%s lost on this error", self.service, exc_info=error)
        return True

    def back(self) -> float | None:
        """A call succeeded: the INFO line and the outage's length in seconds when the service
        was lost (None when it was not)."""
        if self._since is None:
            return None
        lasted = max(self._clock() - self._since, 0.0)
        self._since = self.reason = None
        self._log.info("%s back after %s", self.service, duration_text(lasted))
        return lasted


def duration_text(seconds: float) -> str:
    """``0.4 s``, ``12.0 s``, ``2 min 5 s``, ``3 h 20 min``: how long an outage lasted."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s"
