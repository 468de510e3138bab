"""The ``retention`` setting: off by default, a duration of at least 15 days (the platform's
longest retry window and a day), from the file or ``RELAY_RETENTION``; anything else refused
with one clear line per error."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from relay.settings import SettingsError, load_settings
from tests.conftest import TOKEN


def _config(tmp_path: Path, lines: str = "") -> Path:
    config = tmp_path / "relay.toml"
    config.write_text(f'{lines}\n[sources.default]\ntoken = "{TOKEN}"\n')
    return config


def test_retention_is_off_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(_config(tmp_path)).retention is None
    monkeypatch.setenv("RELAY_RETENTION", "  ")  # empty: as if not set
    assert load_settings(_config(tmp_path, 'retention = "30d"')).retention is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('retention = "30d"', timedelta(days=30)),
        ('retention = "15d"', timedelta(days=15)),
        ('retention = "360h"', timedelta(days=15)),
        ("retention = 2592000", timedelta(days=30)),  # seconds
        ('retention = "3650d"', timedelta(days=3650)),
    ],
)
def test_a_retention_of_at_least_15_days_is_read(
    tmp_path: Path, line: str, expected: timedelta
) -> None:
    assert load_settings(_config(tmp_path, line)).retention == expected


def test_the_environment_sets_the_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_RETENTION", "90d")
    assert load_settings(_config(tmp_path, 'retention = "30d"')).retention == timedelta(days=90)


@pytest.mark.parametrize("value", ['"14d"', '"14.9d"', '"359h"', "0", '"0s"', "86400"])
def test_a_retention_shorter_than_the_platform_retries_is_refused(
    tmp_path: Path, value: str
) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(_config(tmp_path, f"retention = {value}"))
    message = str(err.value)
    assert "retention: " in message and "must be at least 15 days" in message
    assert "up to 14 days" in message and "stored and relayed again" in message


@pytest.mark.parametrize(
    "value",
    [
        '"soon"',
        '"-30d"',
        '"30 days"',
        "true",
        "[30]",
        '"1e9d"',
        '"3651d"',
        '"9' + "9" * 5000 + 'd"',
    ],
)
def test_a_retention_that_is_not_a_duration_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(SettingsError, match="retention: ") as err:
        load_settings(_config(tmp_path, f"retention = {value}"))
    assert "9" * 100 not in str(err.value)  # a huge value is not repeated whole


@pytest.mark.parametrize("text", ["14d", "soon", "\udcff", "9" * 5000])
def test_a_bad_retention_from_the_environment_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("RELAY_RETENTION", text)
    with pytest.raises(SettingsError, match=r"retention \(from RELAY_RETENTION\): "):
        load_settings(_config(tmp_path))
