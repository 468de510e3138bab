"""The code blocks of README.md and docs/*.md, and how the test suite runs each of them.

Every fenced block has a language. A block gets its runner from its language and content
(:func:`runner_of`); one that has none must be in :data:`NOT_RUN`, with the reason. So a new
snippet is either run by the suite or knowingly left out. The conventions are written for
contributors in docs/development.md ("Snippets")."""

from __future__ import annotations

import base64
import re
import secrets
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/*.md")
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<language>[^\n`]*)\n(?P<text>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)
MARKER = re.compile(r"<!--\s*snippet:\s*(?P<instruction>.*?)\s*-->\s*$")
CONTINUES = "continues the block above"
"""The marker of a TOML block that is a part of the configuration of the TOML block above it
on the same page (e.g. a key added to a destination shown before)."""

RUNNERS = (
    "shown",
    "json",
    "yaml",
    "relay-config",
    "pytest-config",
    "help",
    "consumer",
    "pytest",
    "signature",
)
"""What :func:`runner_of` answers: each is a test of tests/test_snippets.py or
tests/test_broker_snippets.py, parametrized with the blocks it runs."""

SHOWN = {"text": "what a program prints, or a diagram: shown, not pasted"}
"""Languages whose blocks are never run, with the reason."""

NOT_RUN: dict[tuple[str, str], str] = {
    ("README.md", "python3 -m pip install -e . && python3 -m relay serve"): (
        "installs the package, then serves until stopped: tests/test_default_source.py runs "
        "`python3 -m relay serve` on a fresh database and reads what it prints"
    ),
    ("README.md", "python3 -m pip install -e '.[test]' && python3 -m pytest"): (
        "the suite itself: .ci/run runs exactly this line (tests/test_docs.py checks it)"
    ),
    ("docs/development.md", "python3 -m pip install -e '.[test]' && python3 -m pytest"): (
        "the suite itself: .ci/run runs exactly this line (tests/test_docs.py checks it)"
    ),
    ("docs/development.md", "python3 -m pytest -m 'not slow'"): (
        "a selection of the suite: the suite cannot run itself"
    ),
    ("docs/development.md", "python3 -m mkdocs build --strict      # into site/"): (
        "tests/test_docs.py builds the site as this line does; `mkdocs serve` runs until stopped"
    ),
    (
        "docs/operations.md",
        "export RELAY_CONFIG=/etc/callback-relay/relay.toml   # sources, destinations, policies",
    ): (
        "a deployment's start: its hosts' addresses and a process manager (honcho) that is not "
        "a dependency"
    ),
    ("docs/destinations.md", "async def handle_platform_event(ctx, envelope):"): (
        "a skeleton whose body is the reader's; tests/test_destinations.py checks that the arq "
        "destination enqueues function(envelope)"
    ),
    (
        "README.md",
        "RELAY_SANDBOX_API_KEY=dev-key relay sandbox --time-scale 0.001 &  # +99900000001: "
        "undeliverable",
    ): (
        "serves until stopped and needs an app on port 8000: tests/test_sandbox_cli.py starts "
        "`relay sandbox` with the key from the environment, tests/test_sandbox_e2e.py sends SMS "
        "through it to a real `relay serve`"
    ),
    (
        "docs/simulator.md",
        "RELAY_SANDBOX_API_KEY=dev-key relay sandbox --port 8100 --time-scale 0.001 &",
    ): (
        "serves until stopped and needs an app on port 8000: tests/test_sandbox_cli.py starts "
        "`relay sandbox` with the key from the environment, tests/test_sandbox_e2e.py sends SMS "
        "through it to a real `relay serve`"
    ),
    ("docs/simulator.md", 'host = "127.0.0.1"'): (
        "a `relay sandbox --config` file, not the relay's settings: "
        "tests/test_sandbox_docs.py loads this very block as the sandbox's settings"
    ),
}
"""Blocks the suite does not run, by page and first line, with the reason."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    """The page, relative to the project's root (``docs/relay.md``)."""
    line: int
    """The line of its opening fence."""
    language: str
    text: str
    """Its content, without the indentation of its fence."""
    marker: str | None = None
    """The instruction of a ``<!-- snippet: ... -->`` comment on the line above its fence."""

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""

    @property
    def name(self) -> str:
        """``page:line``, for test ids and messages."""
        return f"{self.page}:{self.line}"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and the documentation's pages."""
    return [path for pattern in PAGES for path in sorted(root.glob(pattern))]


def blocks_of(text: str, page: str) -> list[Block]:
    """The fenced blocks of one page's markdown ``text``."""
    found = []
    lines = text.splitlines()
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        indent = match["indent"]
        body = "".join(
            row[len(indent) :] if row.startswith(indent) else row
            for row in match["text"].splitlines(keepends=True)
        )
        above = lines[line - 2].strip() if line >= 2 else ""
        marker = MARKER.fullmatch(above)
        found.append(
            Block(
                page,
                line,
                match["language"].strip(),
                body,
                marker["instruction"] if marker else None,
            )
        )
    return found


def all_blocks(root: Path = ROOT) -> list[Block]:
    """Every fenced block of README.md and docs/*.md."""
    return [
        block
        for path in pages(root)
        for block in blocks_of(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    ]


def command_lines(block: Block) -> Iterator[list[str]]:
    """A shell block's commands as words, without comments, brackets of optional parts
    (``[--since T]``) or redirections."""
    for line in block.text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for stop in (">", "|", "&&"):
            if stop in words:
                words = words[: words.index(stop)]
        words = [word.strip("[]") for word in words]
        if words:
            yield [word for word in words if word]


def relay_arguments(words: list[str]) -> list[str] | None:
    """The arguments of a ``relay ...`` or ``python3 -m relay ...`` command, else None."""
    if words[:1] == ["relay"]:
        return words[1:]
    if words[:3] == ["python3", "-m", "relay"]:
        return words[3:]
    return None


def script_of(words: list[str]) -> str | None:
    """The script of a ``python3 scripts/NAME.py ...`` command, else None."""
    if len(words) >= 2 and words[0] == "python3" and re.fullmatch(r"scripts/\w+\.py", words[1]):
        return words[1]
    return None


def with_placeholders_filled(text: str) -> str:
    """The block with its ``"..."`` secrets made real: a random token, a ``whsec_`` key."""
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    text = text.replace('"whsec_..."', f'"whsec_{key}"')
    return text.replace('"..."', f'"{secrets.token_urlsafe(32)}"')


def runner_of(block: Block) -> str | None:
    """How the suite runs ``block``, or None when nothing does (or :data:`NOT_RUN` names it,
    e.g. a TOML block that is not the relay's settings)."""
    if (block.page, block.first_line) in NOT_RUN:
        return None
    if block.language in SHOWN:
        return "shown"
    if block.language == "json":
        return "json"
    if block.language == "yaml":
        return "yaml"
    if block.language == "toml":
        return "pytest-config" if "tool" in _toml_or_empty(block.text) else "relay-config"
    if block.language == "sh":
        commands = list(command_lines(block))
        checkable = all(
            relay_arguments(words) is not None or script_of(words) for words in commands
        )
        return "help" if commands and checkable else None
    if block.language == "python":
        if re.search(r"^async def consume\(", block.text, re.M):
            return "consumer"
        if re.search(r"^(async )?def test_", block.text, re.M):
            return "pytest"
        if block.text.startswith("platform.target("):
            return "signature"
    return None


def _toml_or_empty(text: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def unaccounted(blocks: list[Block]) -> list[str]:
    """The blocks that no runner runs and :data:`NOT_RUN` does not name, with what to do."""
    problems = []
    for block in blocks:
        if block.marker is not None and (block.marker != CONTINUES or block.language != "toml"):
            problems.append(
                f"{block.name}: unknown marker {block.marker!r} (the one known: "
                f"<!-- snippet: {CONTINUES} --> above a toml block)"
            )
        if not block.language:
            problems.append(
                f"{block.name}: a block without a language: say what it is (sh, python, toml, "
                f"json, yaml; text for output or a diagram)"
            )
        elif runner_of(block) is None and (block.page, block.first_line) not in NOT_RUN:
            problems.append(
                f"{block.name}: no test runs this {block.language} block "
                f"({block.first_line!r}): give it a runner in tests/snippet_support.py, or add "
                f"it to NOT_RUN with the reason"
            )
    return problems


def blocks_run_by(runner: str, blocks: list[Block] | None = None) -> list[Block]:
    """The blocks that ``runner`` runs."""
    return [block for block in blocks or all_blocks() if runner_of(block) == runner]


def toml_above(block: Block, blocks: list[Block]) -> Block:
    """The nearest TOML block above ``block`` on its page."""
    above = [
        other
        for other in blocks
        if other.page == block.page and other.line < block.line and other.language == "toml"
    ]
    assert above, f"{block.name}: no TOML block above it"
    return above[-1]
