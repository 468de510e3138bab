"""`relay sandbox`: prints its base URL and API key (generated unless given, never printed
elsewhere), serves the API; bad options and config are one clear line. `relay sandbox numbers`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from relay.cli import main
from relay.sandbox.numbers import NUMBERS
from tests.sandbox_support import sms_fields
from tests.store_support import child_environment
from tests.support import stop_process


@contextmanager
def running_sandbox(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """`relay sandbox --port 0 ...` in a child process: its base URL, key and process."""
    environment = {k: v for k, v in child_environment().items() if not k.startswith("RELAY_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "relay", "sandbox", "--port", "0", *args],
        env=environment | (env or {}),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url_line, key_line = process.stdout.readline(), process.stdout.readline()
        if not url_line:
            stop_process(process)
            raise AssertionError(f"the sandbox did not start: {process.communicate()[1]}")
        assert url_line.startswith("relay sandbox: http://127.0.0.1:"), url_line
        assert key_line.startswith("API key: "), key_line
        yield url_line.split(": ", 1)[1].strip(), key_line.split(": ", 1)[1].strip(), process
    finally:
        stop_process(process)


def test_the_sandbox_serves_with_a_generated_key_printed_once() -> None:
    with running_sandbox() as (base_url, key, process):
        assert len(key) >= 24
        answer = httpx.post(
            f"{base_url}/messaging/v1/sms", json=sms_fields(), headers={"apikey": key}, timeout=10
        )
        assert answer.status_code == 200
        assert answer.json()["href"].startswith(f"{base_url}/messaging/v1/messages/")
        refused = httpx.post(f"{base_url}/messaging/v1/sms", json=sms_fields(), timeout=10)
        assert refused.status_code == 401
        stop_process(process)
        out, err = process.communicate()
    assert key not in out + err


def test_two_sandboxes_get_different_keys() -> None:
    with running_sandbox() as (_, first, _p), running_sandbox() as (_, second, _q):
        assert first != second


def test_a_given_key_from_the_environment_is_used() -> None:
    with running_sandbox(env={"RELAY_SANDBOX_API_KEY": "my-own-key"}) as (base_url, key, _):
        assert key == "my-own-key"
        answer = httpx.get(
            f"{base_url}/_sandbox/numbers", headers={"apikey": "my-own-key"}, timeout=10
        )
        assert answer.status_code == 200


def test_the_config_file_sets_chaos_and_the_options_override_it(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.toml"
    config.write_text('api_key = "from-file"\n[chaos]\napi-429 = 1.0\nretry_after = 3\n')
    with running_sandbox("--config", str(config)) as (base_url, key, _):
        assert key == "from-file"
        answer = httpx.post(
            f"{base_url}/messaging/v1/sms", json=sms_fields(), headers={"apikey": key}, timeout=10
        )
        assert (answer.status_code, answer.headers["retry-after"]) == (429, "3")
    with running_sandbox("--config", str(config), "--chaos", "api-429=0") as (base_url, key, _):
        answer = httpx.post(
            f"{base_url}/messaging/v1/sms", json=sms_fields(), headers={"apikey": key}, timeout=10
        )
        assert answer.status_code == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time-scale", "0"], "--time-scale"),
        (["--time-scale", "-1"], "--time-scale"),
        (["--time-scale", "1e-300"], "--time-scale"),
        (["--time-scale", "1e-9"], "--time-scale"),
        (["--time-scale", "nan"], "--time-scale"),
        (["--time-scale", "inf"], "--time-scale"),
        (["--time-scale", "fast"], "--time-scale"),
        (["--port", "70000"], "--port"),
        (["--port", ""], "--port"),
        (["--chaos", "meteor"], "--chaos"),
        (["--chaos", "duplicate=2"], "--chaos"),
        (["--chaos", "duplicate=0_5"], "--chaos"),
        (["--chaos", "duplicate=nan"], "--chaos"),
        (["--chaos", "duplicate=lots"], "--chaos"),
        (["--seed", "x"], "--seed"),
    ],
)
def test_bad_options_are_refused_before_start(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["sandbox", *args])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not toml [", "is not valid TOML"),
        ('colour = "red"\n', "colour"),
        ('api_key = ""\n', "api_key"),
        ("api_key = 5\n", "api_key"),
        ('inbound_url = "ftp://x"\n', "inbound_url"),
        ("time_scale = 0\n", "time_scale"),
        ("time_scale = 1e-9\n", "time_scale"),
        ("time_scale = nan\n", "time_scale"),
        ("[chaos]\nduplicate = 3\n", "chaos.duplicate"),
        ("[chaos]\nmeteor = 1\n", "chaos.meteor"),
        ('chaos = "all"\n', "chaos"),
        ('validity = "soon"\n', "validity"),
        ('validity = "0s"\n', "validity"),
        ('validity = "-1h"\n', "validity"),
        ('validity = "31d"\n', "validity"),
        ("validity = 3600\n", "validity"),
        ('api_key = "a\\tb-long-enough"\n', "api_key"),
        ('api_key = "s\u00e9same-ouvre-toi"\n', "api_key"),
        ('api_key = "\u2603-snowman-key"\n', "api_key"),
    ],
)
def test_a_bad_config_file_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "sandbox.toml"
    config.write_text(content)
    result = CliRunner().invoke(main, ["sandbox", "--config", str(config)])
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null", "."])
def test_a_config_that_is_not_a_regular_file_is_refused(special: str) -> None:
    result = CliRunner().invoke(main, ["sandbox", "--config", special])
    assert result.exit_code in (1, 2), result.output
    assert "config" in result.output


def test_a_config_file_over_a_mebibyte_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.toml"
    config.write_text("# " + "x" * (1024 * 1024) + "\n")
    result = CliRunner().invoke(main, ["sandbox", "--config", str(config)])
    assert result.exit_code == 1 and "larger than" in result.output


def test_a_missing_config_file_is_one_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["sandbox", "--config", str(tmp_path / "nope.toml")])
    assert result.exit_code == 1 and "does not exist" in result.output


def test_an_inbound_url_that_is_not_http_is_refused() -> None:
    result = CliRunner().invoke(main, ["sandbox", "--inbound-url", "file:///etc/passwd"])
    assert result.exit_code == 1 and "inbound_url" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inbound-url", ""], "inbound_url"),
        (["--inbound-url", "http://"], "inbound_url"),
        (["--inbound-url", "http://127.0.0.1:99999/in"], "inbound_url"),
        (["--inbound-url", "http://127.0.0.1:abc/in"], "inbound_url"),
        (["--inbound-url", "http://127.0.0.1/in\tx"], "inbound_url"),
        (["--inbound-url", "http://127.0.0.1/in\r\nX: 1"], "inbound_url"),
        (["--api-key", ""], "api_key"),
        (["--api-key", "   "], "api_key"),
        (["--host", "256.1.1.1"], "cannot listen"),
        (["--host", ""], "host"),
    ],
)
def test_empty_and_bad_values_are_one_clear_error(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["sandbox", "--port", "0", *args])
    assert result.exit_code == 1, result.output
    assert message in result.output


def test_a_port_in_use_is_one_clear_error() -> None:
    with running_sandbox() as (base_url, _, _p):
        port = base_url.rsplit(":", 1)[1]
        result = CliRunner().invoke(main, ["sandbox", "--port", port])
    assert result.exit_code == 1 and "cannot listen" in result.output


def test_numbers_lists_every_magic_number() -> None:
    result = CliRunner().invoke(main, ["sandbox", "numbers"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["NUMBER", "PRODUCT", "OUTCOME"]
    assert [line.split()[0] for line in lines[1 : len(NUMBERS) + 1]] == [n.number for n in NUMBERS]
    assert "(any other)" in lines[-1] and "delivered" in lines[-1]
    assert "reserved" not in result.output  # every product in the table is served


def test_numbers_json_is_the_table() -> None:
    result = CliRunner().invoke(main, ["sandbox", "numbers", "--json"])
    rows = json.loads(result.output)
    assert [r["number"] for r in rows] == [n.number for n in NUMBERS]
    undeliverable = next(r for r in rows if r["number"] == "+99900000001")
    assert (undeliverable["outcome"], undeliverable["errorCode"]) == ("undeliverable", "001")
