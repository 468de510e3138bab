"""The lower bounds of pyproject.toml's ranges work: a selection of the suite passes with every
direct dependency at its lower bound, in a virtual environment of its own
(scripts/check_lowest.sh; it installs from the package registry)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parent.parent


def registry_unreachable(into: Path) -> str | None:
    """Why pip cannot download from the package registry (None when it can)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), "sniffio"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()[-500:]


@pytest.mark.slow
def test_the_suite_passes_at_the_lowest_versions(tmp_path: Path) -> None:
    unreachable = registry_unreachable(tmp_path / "download")
    if unreachable:
        service_missing("the package registry", RuntimeError(unreachable))
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_lowest.sh"), "-x"],
        cwd=ROOT,
        env={**os.environ, "LOWEST_VENV": str(tmp_path / "venv")},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
