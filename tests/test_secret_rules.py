"""Secrets an attacker could guess or leave out are refused at start-up: empty, blank or short
tokens, passwords, header values and HMAC keys, and address lists that hold every address."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import ReceiverConfig, SourceConfig
from receivers.sources import MIN_SECRET_LENGTH
from relay.server.bootstrap import generated_token
from relay.settings import SettingsError, load_settings

GOOD = "a-long-random-secret-0123456789"

REFUSED = [
    ('token = ""', "token is empty"),
    ('token = "   "', "token is empty"),
    (f'token = ["{GOOD}", ""]', "token is empty"),
    ('token = "short-token"', f"token is shorter than {MIN_SECRET_LENGTH} characters"),
    (f'token = " {GOOD}"', "token starts or ends with white space"),
    ('signature_secret = ""', "signature_secret is empty"),
    ('signature_secret = "0123456789abcde"', "signature_secret is shorter than"),
    ('basic_auth = ":"', "with a user name"),
    (f'basic_auth = ":{GOOD}"', "with a user name"),
    ('basic_auth = "platform:"', "basic_auth password is empty"),
    ('basic_auth = "platform:pw"', "basic_auth password is shorter than"),
    ('basic_auth = "no-colon"', "with a user name"),
    ('header = { name = "X-Key", value = "" }', "header value is empty"),
    ('header = { name = "X-Key", value = "tiny" }', "header value is shorter than"),
    (f'header = {{ name = "", value = "{GOOD}" }}', "at least 1 character"),
    (f'header = {{ name = "X Key", value = "{GOOD}" }}', "is not an HTTP header name"),
    (f'header = {{ name = "X-Key:", value = "{GOOD}" }}', "is not an HTTP header name"),
    (f'token = "{chr(0x200B) * 16}"', "token holds invisible or control characters"),
    ('token = "aaaaaaaaaaaaaaaaaaaa"', "token has fewer than 8 different characters"),
    ('signature_secret = "abababababababab"', "fewer than 8 different characters"),
    (f'header = {{ name = "Content-Type", value = "{GOOD}" }}', "has a meaning of its own"),
    (f'header = {{ name = "x-signature", value = "{GOOD}" }}', "has a meaning of its own"),
    (f'header = {{ name = "Authorization", value = "{GOOD}" }}', "has a meaning of its own"),
    ('allow_ips = ["0.0.0.0/0"]', "0.0.0.0/0 (all of it), which is every address"),
    ('allow_ips = ["::/0"]', "::/0 (all of it), which is every address"),
    ('allow_ips = ["0.0.0.0/1", "128.0.0.0/1"]', "which is every address"),
    ('allow_ips = ["1.2.3.4/1"]', "'1.2.3.4/1' is not a network address"),
]


def write(tmp_path: Path, source_line: str, top: str = "") -> Path:
    path = tmp_path / "relay.toml"
    path.write_text(f'{top}database_url = "sqlite:///{tmp_path / "r.db"}"\n[sources.default]\n')
    with path.open("a") as file:
        file.write(source_line + "\n")
    return path


@pytest.mark.parametrize(("line", "message"), REFUSED)
def test_a_guessable_or_missing_secret_is_refused_at_start_up(
    tmp_path: Path, line: str, message: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(write(tmp_path, line))
    text = str(refused.value)
    assert message in text
    assert GOOD not in text  # the message names the setting, never its value


def test_good_secrets_are_taken(tmp_path: Path) -> None:
    lines = "\n".join(
        [
            f'token = ["{GOOD}", "{GOOD}-next"]',
            f'basic_auth = "platform:{GOOD}"',
            f'header = {{ name = "X-Callback-Key", value = "{GOOD}" }}',
            f'signature_secret = "{GOOD}"',
            'allow_ips = ["203.0.113.0/24"]',
        ]
    )
    settings = load_settings(write(tmp_path, lines))
    assert settings.sources["default"].token[1].get_secret_value() == f"{GOOD}-next"


@pytest.mark.parametrize(
    "proxies", ['["0.0.0.0/0"]', '["10.0.0.0/8", "::/0"]', '["0.0.0.0/1", "128.0.0.0/1"]']
)
def test_trusting_every_address_as_a_proxy_is_refused(tmp_path: Path, proxies: str) -> None:
    config = write(tmp_path, f'token = "{GOOD}"', top=f"trusted_proxies = {proxies}\n")
    with pytest.raises(SettingsError, match="every address"):
        load_settings(config)
    with pytest.raises(ValueError, match="every address"):
        ReceiverConfig(sources={"default": SourceConfig(token=GOOD)}, trusted_proxies=["0.0.0.0/0"])


def test_trusting_every_address_from_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_TRUSTED_PROXIES", "10.0.0.0/8, 0.0.0.0/0")
    with pytest.raises(SettingsError, match="every address"):
        load_settings(write(tmp_path, f'token = "{GOOD}"'))


@pytest.mark.slow
def test_relay_serve_refuses_an_empty_token_in_one_clear_line(tmp_path: Path) -> None:
    config = write(tmp_path, 'token = ""')
    done = subprocess.run(
        [sys.executable, "-m", "relay", "serve", "--config", str(config), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "sources.default.token: Value error, token is empty" in done.stderr


async def test_the_generated_token_is_long_enough(sqlite_engine: AsyncEngine) -> None:
    token = await generated_token(sqlite_engine)
    assert len(token) >= MIN_SECRET_LENGTH
    assert SourceConfig(token=token).token[0].get_secret_value() == token
