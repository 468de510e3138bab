"""How the commands print lists and records: a table (rich's) with a header row and a column
per field, or a record's fields one per line.

On a terminal, the header is bold and a long cell wraps within the terminal's width. Anywhere
else (a pipe, a file, a test) there is no colour, no box drawing and no wrapping: one line per
row, every cell starting at its header's column, so the output can be grepped and cut. Every
cell is :func:`relay.commands.escape.escaped` (the values are often caller-given: paths, keys,
reasons) and shown as text, never read as rich's markup."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from relay.commands.escape import escaped

GAP = 2
"""Spaces between two columns."""
UNBOUNDED_WIDTH = 1_000_000
"""The width a table may take where nothing bounds it (not a terminal): no cell is wrapped."""
MISSING = "-"
"""What an empty cell shows (every cell shows something: a column never starts blank)."""


def cell(value: Any) -> str:
    """A value as a table shows it: ``-`` for none or empty, a time in UTC to the second."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, datetime):
        utc = value.astimezone(UTC) if value.tzinfo is not None else value
        return utc.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def moment(iso: str | None, *, milliseconds: bool = False) -> str:
    """An ISO 8601 time (as the JSON output has it) as a table shows it, in UTC, to the
    second or to the millisecond."""
    if not iso:
        return MISSING
    value = datetime.fromisoformat(iso).astimezone(UTC)
    if milliseconds:
        return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"
    return cell(value)


def table_lines(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, terminal: bool, width: int
) -> list[str]:
    """The lines of a table of ``rows`` under ``headers``, ``width`` columns wide at most on
    a ``terminal`` (elsewhere, as wide as its cells)."""
    table = Table(
        box=None,
        padding=(0, GAP, 0, 0),
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
        header_style="bold" if terminal else "",
    )
    for header in headers:
        table.add_column(header, no_wrap=not terminal, overflow="fold")
    for row in rows:
        table.add_row(*(Text(escaped(cell(value))) for value in row))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width if terminal else UNBOUNDED_WIDTH,
        force_terminal=terminal,
        no_color=not terminal,
        color_system="standard" if terminal else None,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
    )
    console.print(table)
    return [line.rstrip() for line in buffer.getvalue().splitlines()]


def echo_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a table on standard output (see the module's docstring)."""
    stream = sys.stdout
    terminal = _is_terminal(stream)
    width = shutil.get_terminal_size().columns
    for line in table_lines(headers, rows, terminal=terminal, width=width):
        click.echo(line)


def echo_fields(fields: Iterable[tuple[str, Any]]) -> None:
    """Print a record's fields, ``name: value`` one per line, the values aligned."""
    pairs = [(name, escaped(cell(value))) for name, value in fields]
    width = max((len(name) for name, _ in pairs), default=0) + 1
    for name, value in pairs:
        click.echo(f"{name + ':':<{width}} {value}")


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False
