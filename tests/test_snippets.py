"""Every code block of README.md and docs/*.md is run by the suite, or named with the reason
it is not: configurations load through the relay's settings, commands exist with the options
shown, the pytest examples pass as a real pytest in a new project. The broker consumers run in
tests/test_broker_snippets.py."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from relay.cli import main
from relay.settings import Settings
from relay.simulator.testing import PlatformSimulator
from tests.snippet_support import (
    CONTINUES,
    NOT_RUN,
    ROOT,
    RUNNERS,
    Block,
    all_blocks,
    blocks_of,
    blocks_run_by,
    command_lines,
    relay_arguments,
    runner_of,
    script_of,
    toml_above,
    unaccounted,
    with_placeholders_filled,
)

BLOCKS = all_blocks()
ASYNC_UNSUPPORTED = "async def functions are not natively supported"
EXAMPLE_APP = """
import pytest

from tests.test_platform_plugin import make_app


@pytest.fixture
def my_app():
    return make_app()
"""
"""The temporary project's conftest.py: the examples' `my_app`, from the plugin's own tests."""


def ids(block: Block) -> str:
    return block.name


def merged(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the tables and keys of ``part`` added (tables merged, keys replaced)."""
    result = dict(base)
    for key, value in part.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def configuration(block: Block) -> dict[str, Any]:
    """The configuration a TOML block shows: with the block above it when marked so."""
    data = tomllib.loads(with_placeholders_filled(block.text))
    if block.marker == CONTINUES:
        data = merged(configuration(toml_above(block, BLOCKS)), data)
    return data


def test_every_block_is_run_or_named_with_the_reason_it_is_not() -> None:
    assert BLOCKS, "no code block found in README.md and docs/"
    problems = unaccounted(BLOCKS)
    assert not problems, "\n".join(problems)


def test_every_block_named_as_not_run_is_still_there() -> None:
    present = {(block.page, block.first_line) for block in BLOCKS}
    stale = [f"{page}: {line!r}" for page, line in NOT_RUN if (page, line) not in present]
    assert not stale, f"NOT_RUN names blocks that are gone: {stale}"


def test_a_new_block_that_nothing_runs_is_reported() -> None:
    page = (
        "Some text.\n\n```python\nprint('hello')\n```\n\n"
        "- a list\n\n  ```\n  untagged output\n  ```\n"
    )
    blocks = blocks_of(page, "docs/new.md")

    problems = unaccounted(blocks)

    assert [block.line for block in blocks] == [3, 9]
    assert blocks[1].text == "untagged output\n"
    assert len(problems) == 2
    assert "docs/new.md:3: no test runs this python block" in problems[0]
    assert "docs/new.md:9: a block without a language" in problems[1]


def test_a_marker_above_a_block_is_read() -> None:
    page = "```toml\na = 1\n```\n<!-- snippet: continues the block above -->\n```toml\nb = 2\n```\n"
    first, second = blocks_of(page, "README.md")
    assert first.marker is None
    assert second.marker == CONTINUES
    assert not unaccounted([first, second])


def test_an_unknown_marker_is_reported() -> None:
    page = "<!-- snippet: continue the block above -->\n```toml\nb = 2\n```\n"
    problems = unaccounted(blocks_of(page, "README.md"))
    assert len(problems) == 1
    assert "README.md:2: unknown marker 'continue the block above'" in problems[0]


@pytest.mark.parametrize("block", blocks_run_by("json", BLOCKS), ids=ids)
def test_json_blocks_parse(block: Block) -> None:
    json.loads(block.text)


@pytest.mark.parametrize("block", blocks_run_by("yaml", BLOCKS), ids=ids)
def test_yaml_blocks_parse(block: Block) -> None:
    assert yaml.safe_load(block.text)


@pytest.mark.parametrize("block", blocks_run_by("relay-config", BLOCKS), ids=ids)
def test_configuration_blocks_are_valid_settings(
    block: Block, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("RELAY_"):
            monkeypatch.delenv(name)
    Settings(**configuration(block))  # raises the ValidationError the relay describes


@functools.cache
def script_help(script: str) -> str:
    """``python3 scripts/NAME.py --help``'s output (once per script: each takes seconds)."""
    ran = subprocess.run(
        [sys.executable, script, "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, f"{script} --help:\n{ran.stdout}{ran.stderr}"
    return ran.stdout


@pytest.mark.parametrize("block", blocks_run_by("help", BLOCKS), ids=ids)
def test_commands_exist_with_the_options_shown(block: Block) -> None:
    for words in command_lines(block):
        arguments = relay_arguments(words)
        if arguments is not None:
            result = CliRunner().invoke(main, [*arguments, "--help"])
            shown = result.output
            assert result.exit_code == 0, f"{' '.join(words)}:\n{shown}"
        else:
            script = script_of(words)
            assert script is not None
            arguments = words[2:]
            shown = script_help(script)
        options = [word.split("=", 1)[0] for word in arguments if word.startswith("--")]
        unknown = [option for option in options if option not in shown]
        assert not unknown, f"{' '.join(words)}: its --help does not know {unknown}"


@pytest.mark.parametrize("block", blocks_run_by("signature", BLOCKS), ids=ids)
def test_a_signature_shown_is_the_code_s(block: Block) -> None:
    [statement] = ast.parse(block.text).body
    call = statement.value  # type: ignore[attr-defined]
    shown = [(arg.id, inspect.Parameter.empty) for arg in call.args] + [
        (keyword.arg, ast.literal_eval(keyword.value)) for keyword in call.keywords
    ]
    method = getattr(PlatformSimulator, call.func.attr)
    parameters = list(inspect.signature(method).parameters.values())[1:]  # after self
    assert shown == [(parameter.name, parameter.default) for parameter in parameters]


def pytest_config() -> str:
    """The pytest configuration the docs show for async tests (a pyproject.toml)."""
    [block] = blocks_run_by("pytest-config", BLOCKS)
    return block.text


def run_pytest(
    project: Path, test_code: str, pyproject: str | None
) -> subprocess.CompletedProcess[str]:
    """``pytest`` in a new project holding ``test_code`` (and ``pyproject``), with the
    installed plugins: callback-relay's `platform` fixture, pytest-asyncio."""
    (project / "conftest.py").write_text(EXAMPLE_APP, encoding="utf-8")
    (project / "test_example.py").write_text(test_code, encoding="utf-8")
    if pyproject is not None:
        (project / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_example.py"],
        cwd=project,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def async_example() -> Block:
    [example] = [b for b in blocks_run_by("pytest", BLOCKS) if "async def test_" in b.text]
    return example


@pytest.mark.slow
@pytest.mark.parametrize("block", blocks_run_by("pytest", BLOCKS), ids=ids)
def test_pytest_examples_pass_in_a_new_project(block: Block, tmp_path: Path) -> None:
    is_async = "async def test_" in block.text
    ran = run_pytest(tmp_path, block.text, pytest_config() if is_async else None)
    tests = block.text.count("def test_")
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    assert f"{tests} passed in" in output, output
    if is_async:  # the configuration shown leaves pytest-asyncio nothing to warn about
        assert "Warning" not in output, output


@pytest.mark.slow
@pytest.mark.parametrize("mark", ["asyncio", "anyio"])
def test_the_async_example_runs_with_the_marks_the_docs_name(mark: str, tmp_path: Path) -> None:
    marked = f"import pytest\n\npytestmark = pytest.mark.{mark}\n\n{async_example().text}"
    ran = run_pytest(tmp_path, marked, pyproject=None)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    assert re.search(r"^\d+ passed", output, re.M), output


@pytest.mark.slow
def test_the_async_example_fails_without_a_plugin_set_up(tmp_path: Path) -> None:
    ran = run_pytest(tmp_path, async_example().text, pyproject=None)
    assert ran.returncode != 0
    assert ASYNC_UNSUPPORTED in ran.stdout + ran.stderr


def test_every_runner_runs_some_block() -> None:
    """A runner that matches nothing hints at blocks that moved out of its reach."""
    assert {runner_of(block) for block in BLOCKS} - {None} == set(RUNNERS)
