"""A fault that comes back on every call until it is fixed, logged once per change of state.

A router that raises on the events it gets fails again on every hook call and every sweep: one
line with its traceback when it begins and one when it ends, instead of a traceback per call."""

from __future__ import annotations

import logging


class Trouble:
    """The state of one kind of work (``what``) that keeps failing or works, told each outcome."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._failing = False

    def failed(self, error: BaseException) -> None:
        if not self._failing:
            self._failing = True
            self._log.error(
                "%s failed (%s); tried again quietly until it works",
                self._what,
                type(error).__name__,
                exc_info=error,
            )

    def worked(self) -> None:
        if self._failing:
            self._failing = False
            self._log.info("%s works again", self._what)
