"""Reading what the commands print: the tables of :mod:`relay.commands.tables` as rows of
cells, after checking that every cell starts at its header's column."""

from __future__ import annotations

import re

from relay.commands.tables import GAP

COLUMN_START = re.compile(rf"(?:^| {{{GAP}}})(\S)")


def header_starts(header: str) -> list[int]:
    """Where each column of a header line starts (headers are apart by :data:`GAP` spaces at
    least, and hold single spaces at most)."""
    return [match.start(1) for match in COLUMN_START.finditer(header)]


def table(text: str, *, first: str) -> list[dict[str, str]]:
    """The rows of the table whose header line starts with ``first`` in ``text``, as
    ``{header: cell}``; fails unless every row's cell starts at its header's column, right
    after a gap."""
    lines = text.splitlines()
    [at] = [n for n, line in enumerate(lines) if line.startswith(first)]
    header, rows = lines[at], []
    starts = header_starts(header)
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    for line in lines[at + 1 :]:
        if not line.strip():
            break
        for start, name in zip(starts, names, strict=True):
            assert line[start : start + 1].strip(), f"no {name} cell at column {start}: {line!r}"
            assert start == 0 or line[start - GAP : start] == " " * GAP, (
                f"the {name} cell does not start right after a gap: {line!r}"
            )
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows
