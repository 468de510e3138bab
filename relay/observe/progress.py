"""Progress bars for long commands: drawn on standard error, and only when it is a terminal, so
that a pipe, a file or a CI log never gets a bar or its control characters.

Every command shows its progress through :class:`Bar` (click's own progress bar underneath);
lines printed with :meth:`Bar.echo` appear above the bar instead of inside it.
"""

from __future__ import annotations

import io
import sys
from types import TracebackType
from typing import IO, TYPE_CHECKING, TextIO, cast

import click

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

BEFORE_LINE = "\r\x1b[2K"
"""Moves to the start of the bar's line and erases it, before a line is printed above it."""


def is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is an interactive terminal (False when it cannot tell)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _Screen(io.TextIOBase):
    """What the bar draws on: ``stream``, taken for a terminal (the caller decided it is one),
    remembering the bar's last frame so that it can be drawn again after a line above it."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self.frame = ""

    def isatty(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text.startswith("\r"):  # click draws every frame from the start of the line
            self.frame = text
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


class Bar:
    """A progress bar of ``total`` steps labelled ``label`` on ``stream`` (default: standard
    error) when ``terminal`` (default: when ``stream`` is one); otherwise nothing at all.

    The total may come later (:meth:`update` with ``total``): the bar appears once it is known.
    Use it as a context manager; leaving it ends the bar's line."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        stream: IO[str] | None = None,
        terminal: bool | None = None,
    ) -> None:
        self.label = label
        self._total = total
        target = stream if stream is not None else sys.stderr
        shown = is_terminal(target) if terminal is None else terminal
        self._screen = _Screen(target) if shown else None
        self._bar: ProgressBar[int] | None = None
        self._done = 0

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn (the stream is a terminal)."""
        return self._screen is not None

    def __enter__(self) -> Bar:
        self._draw()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def advance(self, steps: int = 1) -> None:
        """``steps`` more are done."""
        self.update(self._done + steps)

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` steps of ``total`` (default: the total known so far) are done."""
        self._done = done
        if total is not None:
            self._total = total
        self._draw()

    def echo(self, line: str, *, err: bool = False, file: IO[str] | None = None) -> None:
        """Print ``line`` (on standard output, standard error with ``err``, or ``file``) above
        the bar: the bar's line is erased first and drawn again below it."""
        screen = self._screen if self._bar is not None else None
        if screen is not None:
            screen.stream.write(BEFORE_LINE)
        click.echo(line, file=file, err=err)
        if screen is not None:
            screen.write(screen.frame)
            screen.flush()

    def close(self) -> None:
        """End the bar (its line stays, finished) and stop drawing."""
        if self._bar is not None:
            self._bar.render_finish()
        self._bar = self._screen = None

    def _draw(self) -> None:
        if self._screen is None or self._total is None:
            return
        if self._bar is None:
            bar = click.progressbar(
                length=self._total,
                label=self.label,
                file=cast(TextIO, self._screen),
                show_pos=True,
            )
            self._bar = bar.__enter__()  # drawn at 0; close() ends it
        resized = self._bar.length != self._total
        self._bar.length = self._total
        if self._done > self._bar.pos:
            self._bar.update(self._done - self._bar.pos)
        elif resized:
            self._bar.render_progress()
