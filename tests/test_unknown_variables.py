"""A ``RELAY_*`` variable that matches no setting nor option is warned about once at start,
by its name (and the one it probably meant), never by its value."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from relay.cli import main
from relay.commands.common import unknown_variable_warnings
from relay.settings import Settings
from relay.unknown_variables import SHOWN_NAME, option_variables, unknown_variables
from tests.conftest import TOKEN

OPTIONS = {"RELAY_LOG_LEVEL", "RELAY_PORT", "RELAY_CONFIG"}
SECRET = "postgresql://relay:s3cret-pa55@db/relay"


def warned(environ: dict[str, str]) -> list[str]:
    return unknown_variables(environ, Settings.model_fields, OPTIONS)


def test_a_misspelt_setting_is_named_with_the_one_it_probably_meant() -> None:
    assert warned({"RELAY_DATABSE_URL": SECRET, "RELAY_REDIS_URI": SECRET}) == [
        "RELAY_DATABSE_URL matches no setting and is ignored: did you mean RELAY_DATABASE_URL?",
        "RELAY_REDIS_URI matches no setting and is ignored: did you mean RELAY_REDIS_URL?",
    ]


def test_a_misspelt_option_is_named_with_the_option_it_probably_meant() -> None:
    assert warned({"RELAY_LOG_LEVL": "debug"}) == [
        "RELAY_LOG_LEVL matches no setting and is ignored: did you mean RELAY_LOG_LEVEL?"
    ]


def test_a_name_close_to_nothing_is_named_without_a_guess() -> None:
    [warning] = warned({"RELAY_FOO": "1"})
    assert warning.startswith("RELAY_FOO matches no setting and is ignored (")
    assert "did you mean" not in warning


@pytest.mark.parametrize(
    "name",
    [
        "RELAY_DATABASE_URL",
        "relay_database_url",  # pydantic-settings reads settings in any letter case
        "Relay_Max_Body_Bytes",
        "RELAY_LOG_LEVEL",
        "RELAY_CONFIG",
        "RELAY_TEST_REDIS_URL",  # the test suite's
        "RELAY_TEST_",
        "RELAY_BENCH_AMQP_URL",  # the scripts'
        "RELAY_CHAOS_REDIS_URL",
        "RELAY_BACKLOG_REDIS_URL",
        "PATH",
        "XRELAY_FOO",
    ],
)
def test_what_matches_a_setting_an_option_or_the_suites_is_not_warned_about(name: str) -> None:
    assert warned({name: "x"}) == []


def test_an_option_s_variable_is_read_in_its_own_letter_case_only() -> None:
    """click reads ``RELAY_LOG_LEVEL`` exactly: ``relay_log_level`` is ignored, so said."""
    assert warned({"relay_log_level": "debug"}) == [
        "relay_log_level matches no setting and is ignored: did you mean RELAY_LOG_LEVEL?"
    ]


@pytest.mark.parametrize("value", ["", SECRET, "\x1b[31m", "x" * 100_000])
def test_the_value_is_never_told(value: str) -> None:
    [warning] = warned({"RELAY_SECRET_TOKEN": value})
    assert warning.startswith("RELAY_SECRET_TOKEN matches no setting")
    if value:
        assert value not in warning


def test_a_name_that_a_terminal_would_obey_is_escaped_and_a_huge_one_cut() -> None:
    hostile = "RELAY_\x1b]0;owned\x07\x1b[2J\u202e\udcff"
    [escaped] = warned({hostile: "x"})
    assert escaped.startswith("RELAY_\\x1b]0;owned\\x07\\x1b[2J\\u202e\\udcff matches no setting")
    assert escaped.isprintable()
    [cut] = warned({"RELAY_" + "A" * 100_000: "x"})
    assert cut.startswith("RELAY_" + "A" * (SHOWN_NAME - 6) + "... matches no setting")
    assert len(cut) < SHOWN_NAME + 200


def test_one_warning_per_variable_sorted_by_name() -> None:
    assert [w.split()[0] for w in warned({"RELAY_ZZZ": "", "RELAY_": "", "RELAY_AAA": ""})] == [
        "RELAY_",
        "RELAY_AAA",
        "RELAY_ZZZ",
    ]


def test_every_option_of_every_command_and_every_setting_is_known() -> None:
    options = option_variables(_all_params())
    assert {"RELAY_LOG_LEVEL", "RELAY_PORT", "RELAY_METRICS_HOST", "RELAY_LOOP"} <= options
    environ = {name: "x" for name in options} | {
        f"RELAY_{field.upper()}": "x" for field in Settings.model_fields
    }
    with click.Context(main):
        assert unknown_variable_warnings(environ | {"RELAY_CONFIG": "x"}) == []
        assert unknown_variable_warnings(environ | {"RELAY_LOOPS": "x"}) == [
            "RELAY_LOOPS matches no setting and is ignored: did you mean RELAY_LOOP?"
        ]


def _all_params() -> Iterator[object]:
    stack = [main]
    while stack:
        command = stack.pop()
        yield from command.params
        stack.extend(getattr(command, "commands", {}).values())


def test_a_command_warns_on_standard_error_before_it_runs(tmp_path: Path) -> None:
    database = tmp_path / "relay.db"
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{database}"\n[sources.default]\ntoken = "{TOKEN}"\n'
    )
    result = CliRunner().invoke(
        main,
        ["events", "list", "--config", str(config)],
        env={"RELAY_DATABSE_URL": SECRET},
    )
    assert result.exit_code == 1  # no database there yet
    assert result.stderr.splitlines()[0] == (
        "warning: RELAY_DATABSE_URL matches no setting and is ignored: "
        "did you mean RELAY_DATABASE_URL?"
    )
    assert SECRET not in result.output


@pytest.fixture
def root_logger() -> Iterator[None]:
    """Put the root logger back as it was after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_the_worker_warns_in_its_log_once(root_logger: None, tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(f'database_url = "sqlite:///{tmp_path / "r.db"}"\n')
    result = CliRunner().invoke(  # no redis_url: it stops right after its start
        main,
        ["worker", "--log-format", "json", "--config", str(config)],
        env={"RELAY_REDIS_URI": SECRET},
    )
    assert result.exit_code == 1
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [(line["level"], line["logger"], line["message"]) for line in lines] == [
        (
            "warning",
            "relay.settings",
            "RELAY_REDIS_URI matches no setting and is ignored: did you mean RELAY_REDIS_URL?",
        )
    ]
    assert SECRET not in result.output
