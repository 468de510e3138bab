"""``RELAY_*`` environment variables that match no setting nor option: a misspelt one
(``RELAY_DATABSE_URL``) would otherwise be ignored without a word, and the relay would run
with the default it was meant to replace.

What matches: a setting's variable (``RELAY_<KEY>``, in any letter case, as pydantic-settings
reads it), a command option's (``RELAY_LOG_LEVEL``, exactly: click reads it so) and
``RELAY_CONFIG``. Variables of the test suite and the scripts, which share the prefix, are
left alone: those beginning with one of :data:`IGNORED_PREFIXES`. A warning names the variable,
and the one it probably meant when one is close; never its value, which may be a secret."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping

PREFIX = "RELAY_"
IGNORED_PREFIXES = ("RELAY_TEST_", "RELAY_BENCH_", "RELAY_CHAOS_", "RELAY_BACKLOG_")
"""The test suite's variables (``RELAY_TEST_REDIS_URL``...) and the scripts' (the benchmarks',
``scripts/chaos.py``'s, ``scripts/bench_backlog.py``'s): never settings."""
CLOSE_ENOUGH = 0.75
"""How alike (difflib's ratio, on the names without their prefix) a name must be to be
suggested."""
SHOWN_NAME = 80
"""How much of an unknown name a warning repeats."""


def unknown_variables(
    environ: Mapping[str, str], settings: Collection[str], options: Collection[str]
) -> list[str]:
    """One warning per ``RELAY_*`` variable of ``environ`` that matches neither one of the
    ``settings`` (field names, read without letter case) nor one of the ``options``' variables
    (exact names), sorted by name."""
    fields = {name.lower() for name in settings}
    candidates = sorted({PREFIX + name.upper() for name in fields} | set(options))
    warnings = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper.startswith(IGNORED_PREFIXES):
            continue
        if name in options or upper.removeprefix(PREFIX).lower() in fields:
            continue
        warnings.append(_warning(name, candidates))
    return warnings


def option_variables(params: Iterable[object]) -> set[str]:
    """The environment variables of click parameters (``envvar``, a name or a list)."""
    found: set[str] = set()
    for param in params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            found.add(envvar)
        elif isinstance(envvar, list | tuple):
            found.update(str(name) for name in envvar)
    return found


def _warning(name: str, candidates: list[str]) -> str:
    shown = _shown(name)
    meant = _closest(name.upper(), candidates)
    if meant is not None:
        return f"{shown} matches no setting and is ignored: did you mean {meant}?"
    return (
        f"{shown} matches no setting and is ignored (the RELAY_ variables: "
        "docs/configuration.md, Environment variables)"
    )


def _closest(name: str, candidates: list[str]) -> str | None:
    stems = {candidate.removeprefix(PREFIX): candidate for candidate in candidates}
    close = difflib.get_close_matches(
        name.removeprefix(PREFIX), list(stems), n=1, cutoff=CLOSE_ENOUGH
    )
    return stems[close[0]] if close else None


def _shown(name: str) -> str:
    """The name as a terminal or a log can show it: escapes for what is not printable (a
    terminal's escape sequences), cut after :data:`SHOWN_NAME` characters."""
    cut = name[:SHOWN_NAME]
    text = cut if cut.isprintable() else cut.encode("unicode_escape").decode("ascii")
    return text + ("..." if len(name) > SHOWN_NAME else "")
