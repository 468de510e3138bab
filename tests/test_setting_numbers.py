"""Numbers in settings: whole numbers are digits or an integer, durations ASCII digits and a unit;
nothing that only looks like one is read as one."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.settings import SettingsError, load_settings
from tests.conftest import TOKEN

COUNTS = ("worker_concurrency", "max_body_bytes", "max_header_bytes", "max_headers")


def _config(tmp_path: Path, lines: str = "") -> Path:
    config = tmp_path / "relay.toml"
    config.write_text(f'{lines}\n[sources.default]\ntoken = "{TOKEN}"\n')
    return config


@pytest.mark.parametrize("key", COUNTS)
@pytest.mark.parametrize(
    "text",
    ["", " ", "true", "1e2", "1_0", "0x10", "+20", "20.0", "\uff12\uff10", "20 30", "9" * 5000],
)
def test_a_count_from_the_environment_is_digits_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, text: str
) -> None:
    variable = f"RELAY_{key.upper()}"
    monkeypatch.setenv(variable, text)
    expected = rf"{key} \(from {variable}\): .*expected a whole number in digits"
    with pytest.raises(SettingsError, match=expected) as err:
        load_settings(_config(tmp_path))
    assert "9" * 100 not in str(err.value)  # a huge value is not repeated whole
    assert "relay.toml" not in str(err.value)  # the file is not to blame


@pytest.mark.parametrize("key", COUNTS)
@pytest.mark.parametrize("value", ["true", "100.0", '"1e2"', "[100]", "-0.0"])
def test_a_count_in_the_file_is_an_integer(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(SettingsError, match=rf"{key}: .*expected a whole number in digits"):
        load_settings(_config(tmp_path, f"{key} = {value}"))


def test_counts_as_digits_or_integers_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_WORKER_CONCURRENCY", " 20 ")
    monkeypatch.setenv("RELAY_MAX_CONNECTIONS", "")  # empty: derived from the files limit
    settings = load_settings(_config(tmp_path, "max_headers = 40\nmax_body_bytes = 4096"))
    assert settings.worker_concurrency == 20
    assert settings.max_headers == 40 and settings.max_body_bytes == 4096
    assert settings.max_connections is None
    monkeypatch.setenv("RELAY_MAX_CONNECTIONS", "1_000")
    with pytest.raises(SettingsError, match="max_connections"):
        load_settings(_config(tmp_path))


@pytest.mark.parametrize(
    "table",
    [
        '[policies.p]\ntype = "delays"\ndelays = ["1s"]\nmax_attempts = true',
        '[policies.p]\ntype = "delays"\ndelays = ["1s"]\nmax_attempts = 3.0',
        '[policies.p]\ntype = "delays"\ndelays = ["1s"]\npause_after = "3"',
        '[destinations.s]\ntype = "redis-stream"\nurl = "redis://127.0.0.1:6379/12"\n'
        'stream = "s"\nmaxlen = true',
    ],
)
def test_nested_whole_numbers_are_integers(tmp_path: Path, table: str) -> None:
    with pytest.raises(SettingsError, match="valid integer"):
        load_settings(_config(tmp_path, table))


def test_a_source_signature_tolerance_is_an_integer(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'[sources.default]\nsignature_secret = "{TOKEN}"\nsignature_tolerance_seconds = true\n'
    )
    with pytest.raises(SettingsError, match="signature_tolerance_seconds"):
        load_settings(config)


@pytest.mark.parametrize("text", ["\uff15s", "1\u066b5s", "true", "", "-1s", "1 fortnight", "1e3s"])
def test_a_duration_from_the_environment_is_ascii_digits_and_a_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("RELAY_SWEEP_INTERVAL", text)
    expected = r"sweep_interval \(from RELAY_SWEEP_INTERVAL\): .*not a duration"
    with pytest.raises(SettingsError, match=expected):
        load_settings(_config(tmp_path))
    monkeypatch.setenv("RELAY_SWEEP_INTERVAL", "1.5s")
    assert load_settings(_config(tmp_path)).sweep_interval.total_seconds() == 1.5


def test_each_error_names_where_its_value_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("relay_destinations", '{"x": {"type": "http", "url": "ftp://h"}}')
    config = _config(tmp_path, "worker_concurrency = 0")
    with pytest.raises(SettingsError) as err:
        load_settings(config)
    assert str(err.value).splitlines() == [
        f"invalid configuration in {config}:",
        "  destinations.x.http.url (from relay_destinations): Value error, url must be an "
        "http:// or https:// URL (not ftp://)",
        "  worker_concurrency: Input should be greater than or equal to 1",
    ]


def test_a_table_variable_is_named_only_for_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variable's JSON table is merged with the file's: an error of the file's own part is
    the file's."""
    table = '[destinations.n]\ntype = "nats"\nurl = "nats://h"\nsubject = "a b"'
    config = _config(tmp_path, table)
    monkeypatch.setenv("RELAY_DESTINATIONS", '{"other": {"type": "http", "url": "http://h"}}')
    with pytest.raises(SettingsError) as err:
        load_settings(config)
    assert str(err.value).splitlines() == [
        f"invalid configuration in {config}:",
        "  destinations.n.nats.subject: Value error, the subject cannot hold ' '",
    ]
    monkeypatch.setenv("RELAY_DESTINATIONS", '{"n": {"subject": "c d"}}')
    with pytest.raises(SettingsError, match=r"subject \(from RELAY_DESTINATIONS\)") as err:
        load_settings(config)
    assert str(config) not in str(err.value)


def test_a_table_variable_that_changes_a_file_tables_type_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's keys are refused for the type the variable gave their table: both are named."""
    config = _config(tmp_path, '[destinations.crm]\ntype = "http"\nurl = "http://h/x"')
    monkeypatch.setenv("RELAY_DESTINATIONS", '{"crm": {"type": "amqp", "exchange": "x"}}')
    with pytest.raises(SettingsError) as err:
        load_settings(config)
    assert str(err.value).splitlines() == [
        f"invalid configuration in {config}:",
        "  destinations.crm.amqp.url (type 'amqp' from RELAY_DESTINATIONS): Value error, url "
        "must start with amqp:// or amqps://",
    ]
    monkeypatch.setenv("RELAY_DESTINATIONS", '{"crm": {"timeout": "2s"}}')  # the file's type
    config.write_text('[destinations.crm]\ntype = "amqp"\nurl = "http://h/x"\nexchange = "x"')
    with pytest.raises(SettingsError) as err:
        load_settings(config)
    assert "RELAY_DESTINATIONS" not in str(err.value)
    assert "destinations.crm.amqp.url: Value error" in str(err.value)


def test_a_table_variable_that_is_not_json_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_DESTINATIONS", "{bad json")
    with pytest.raises(SettingsError, match=r"^RELAY_DESTINATIONS is not valid JSON"):
        load_settings(_config(tmp_path))
