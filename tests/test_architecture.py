"""docs/architecture.md stays true to the code: the route of one callback names files that exist
and functions or classes they define, every path it quotes exists, and ``receivers`` never
imports ``relay``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROUTE_HEADING = "## The route of one callback"
MAX_ROUTE_FILES = 12
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([^`]+)`\s*\|([^|]*)\|")
QUOTED_PATH = re.compile(r"`((?:receivers|relay|tests|scripts)/[A-Za-z0-9_./]*)`")


def route_rows(text: str) -> list[tuple[str, list[str]]]:
    """(file, names) of each row of the route table: the section under ``ROUTE_HEADING``."""
    section = text.split(ROUTE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        found = ROW.match(line)
        if found:
            rows.append((found.group(2), re.findall(r"`([^`]+)`", found.group(3))))
    return rows


def defined_names(source: str) -> set[str]:
    """The top-level functions and classes of a module, and ``Class.method`` for each method."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return names


def missing_from_route(text: str, root: Path) -> list[str]:
    """What the route table names that the code under ``root`` does not have."""
    missing = []
    for file, names in route_rows(text):
        path = root / file
        if not path.is_file():
            missing.append(f"{file}: no such file")
            continue
        if not names:
            missing.append(f"{file}: the row names no function or class")
        defined = defined_names(path.read_text(encoding="utf-8"))
        missing += [f"{file}: no {name}" for name in names if name not in defined]
    return missing


def relay_imports(root: Path) -> list[str]:
    """Each import of ``relay`` (or a module under it) in the ``receivers`` package."""
    found = []
    for path in sorted((root / "receivers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            found += [
                f"{path.relative_to(root)}:{node.lineno} imports {module}"
                for module in modules
                if module == "relay" or module.startswith("relay.")
            ]
    return found


def test_the_route_of_one_callback_names_files_and_the_functions_they_define() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    rows = route_rows(text)
    assert 0 < len(rows) <= MAX_ROUTE_FILES
    assert len({file for file, _ in rows}) == len(rows)
    assert missing_from_route(text, ROOT) == []


def test_a_vanished_file_or_function_is_found(tmp_path: Path) -> None:
    (tmp_path / "relay").mkdir()
    (tmp_path / "relay" / "step.py").write_text(
        "class Step:\n    async def run(self): ...\n\ndef helper(): ...\n"
    )
    text = (
        f"{ROUTE_HEADING}\n\n| # | File | Step | What |\n|---|---|---|---|\n"
        "| 1 | `relay/step.py` | `Step.run`, `helper` | fine |\n"
        "| 2 | `relay/step.py` | `Step.gone`, `gone` | a name went |\n"
        "| 3 | `relay/moved.py` | `anything` | the file went |\n"
        "| 4 | `relay/step.py` | | nothing named |\n\n## Next\n"
        "| 5 | `relay/other.py` | `ignored` | another section |\n"
    )
    assert missing_from_route(text, tmp_path) == [
        "relay/step.py: no Step.gone",
        "relay/step.py: no gone",
        "relay/moved.py: no such file",
        "relay/step.py: the row names no function or class",
    ]


def test_every_path_the_architecture_quotes_exists() -> None:
    quoted = set(QUOTED_PATH.findall(ARCHITECTURE.read_text(encoding="utf-8")))
    assert quoted
    assert sorted(path for path in quoted if not (ROOT / path).exists()) == []


def test_receivers_never_imports_relay() -> None:
    assert relay_imports(ROOT) == []


def test_an_import_of_relay_in_receivers_is_found(tmp_path: Path) -> None:
    (tmp_path / "receivers" / "inner").mkdir(parents=True)
    (tmp_path / "receivers" / "ok.py").write_text("import relaying\nfrom . import relay\n")
    (tmp_path / "receivers" / "inner" / "bad.py").write_text(
        "import os\n\n\ndef late():\n    from relay.outbox import Due\n    import relay\n"
    )
    assert relay_imports(tmp_path) == [
        "receivers/inner/bad.py:5 imports relay.outbox",
        "receivers/inner/bad.py:6 imports relay",
    ]
