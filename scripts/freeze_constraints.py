"""Write constraints.txt: the exact versions of everything `pip install '.[test]'` installs,
as this environment has them (the set the suite was run with).

The requirements are read from pyproject.toml (the runtime ones and every extra), then
followed through the installed distributions' own requirements (their extras and environment
markers included), so that the file holds the transitive dependencies too and nothing else of
the environment. Run it in the environment that passed the suite:

    python3 scripts/freeze_constraints.py > constraints.txt
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "callback-relay"


def project_requirements() -> list[Requirement]:
    """pyproject.toml's runtime requirements and those of every extra (not the project's own)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    texts = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        texts += extra
    return [r for r in map(Requirement, texts) if canonicalize_name(r.name) != PROJECT]


def applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether ``requirement`` holds here, for a distribution installed with ``extras``."""
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate(default_environment() | {"extra": extra})
        for extra in extras or {""}
    )


def frozen() -> dict[str, str]:
    """Installed name and version of every distribution the requirements pull in."""
    versions: dict[str, str] = {}
    wanted: list[tuple[Requirement, set[str]]] = [(r, set()) for r in project_requirements()]
    seen: set[tuple[str, frozenset[str]]] = set()
    while wanted:
        requirement, parent_extras = wanted.pop()
        if not applies(requirement, parent_extras):
            continue
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"{requirement.name} is not installed: install '.[test]' first")
        versions[distribution.metadata["Name"]] = distribution.version
        extras = set(requirement.extras)
        for text in distribution.requires or []:
            wanted.append((Requirement(text), extras))
    return versions


def main() -> None:
    print("# The exact versions the suite is run with: pip install -c constraints.txt ...")
    print("# Written by scripts/freeze_constraints.py (see docs/development.md#dependencies).")
    for name, version in sorted(frozen().items(), key=lambda item: item[0].lower()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
