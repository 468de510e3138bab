"""The documentation: README is a short front page, and the docs/ site builds strictly."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
README_MAX_LINES = 300
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def build_site(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project`` (its mkdocs.yml and docs/) into ``site``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = build_site(ROOT, tmp_path / "site")
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}{built.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as index:
        index.write("\nSee [a page that is not there](no-such-page.md).\n")

    built = build_site(tmp_path, tmp_path / "site")

    output = built.stdout + built.stderr
    assert built.returncode != 0, f"a link to a missing page did not fail the build:\n{output}"
    assert "no-such-page.md" in output


def test_readme_is_a_short_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_shows_the_command_ci_runs() -> None:
    commands = [
        line.strip()
        for line in CI_RUN.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    tests = [command for command in commands if "python3 -m pytest" in command]
    assert len(tests) == 1, f".ci/run runs {tests!r}"
    test_command = tests[0]
    assert commands[-1] == test_command, ".ci/run runs README's test command, then nothing"
    readme_lines = [line.strip() for line in README.read_text(encoding="utf-8").splitlines()]
    assert test_command in readme_lines, f"README.md does not show {test_command!r}"


def test_readme_links_point_to_files_that_exist() -> None:
    targets = MARKDOWN_LINK.findall(README.read_text(encoding="utf-8"))
    local = [t for t in targets if "://" not in t and not t.startswith(("#", "mailto:"))]
    assert local, "README.md links to no documentation page"
    missing = [t for t in local if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
