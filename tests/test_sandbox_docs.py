"""docs/simulator.md's sandbox blocks that tests/test_snippets.py does not run: the
``--config`` file is valid sandbox settings."""

from __future__ import annotations

from pathlib import Path

from relay.sandbox.settings import load_sandbox_settings
from tests.snippet_support import NOT_RUN, ROOT, blocks_of


def test_the_config_block_is_valid_sandbox_settings(tmp_path: Path) -> None:
    page = "docs/simulator.md"
    [block] = [
        b
        for b in blocks_of((ROOT / page).read_text(encoding="utf-8"), page)
        if (page, b.first_line) in NOT_RUN and b.language == "toml"
    ]
    path = tmp_path / "sandbox.toml"
    path.write_text(block.text, encoding="utf-8")
    settings = load_sandbox_settings(path, {})
    assert settings.time_scale == 0.001
    assert settings.chaos.rate("api-429") == 0.05
