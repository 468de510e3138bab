"""The ``platform_api`` pytest fixture: a sandbox on 127.0.0.1 for the app under test, with a
clock the test moves; used from a user's sync and async tests in a new project (a real pytest
run), and in-process against a real receiver."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from relay.sandbox.settings import ChaosSettings, SandboxSettings
from relay.sandbox.testing import PlatformApi
from tests.snippet_support import ROOT
from tests.support import Sink

USER_TESTS = '''
import httpx


def send_sms(base_url, api_key, to, text):
    """The app under test: it sends an SMS through the platform's API."""
    answer = httpx.post(
        f"{base_url}/messaging/v1/sms",
        headers={"apikey": api_key},
        json={"to": to, "from": "ACME", "message": text},
    )
    answer.raise_for_status()
    return answer.json()["requestId"]


def test_an_undeliverable_sms(platform_api):
    request_id = send_sms(platform_api.base_url, platform_api.api_key, "+99900000001", "hi")
    assert platform_api.wait_for(to="+99900000001")["status"] == "ACCEPTED"
    platform_api.advance(10)  # seconds of platform time, run at once
    message = platform_api.wait_for(to="+99900000001", status="UNDELIVERABLE")
    assert (message["requestId"], message["errorCode"]) == (request_id, "001")
    assert [m["status"] for m in platform_api.messages] == ["UNDELIVERABLE"]


async def test_a_call_not_answered(platform_api):
    async with httpx.AsyncClient(
        base_url=platform_api.base_url, headers={"apikey": platform_api.api_key}
    ) as client:
        started = await client.post(
            "/tts/v1/calls",
            json={
                "from": "+4930123456",
                "to": "+99900000020",
                "message": "Hello",
                "language": "en_gb",
            },
        )
        await platform_api.advance_async(60)
        events = await client.get(f"/tts/v1/calls/{started.json()['callId']}/events")
    assert [e["status"] for e in events.json()] == ["started", "ringing", "hangup"]
'''
PYPROJECT = """
[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
"""


def test_a_users_sync_and_async_tests_pass_in_a_new_project(tmp_path: Path) -> None:
    (tmp_path / "test_app.py").write_text(USER_TESTS, encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_app.py"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    assert "2 passed in" in output, output


async def test_callbacks_reach_a_real_receiver_as_the_clock_is_advanced(sink: Sink) -> None:
    api = PlatformApi()
    try:
        async with httpx.AsyncClient(base_url=api.base_url, headers={"apikey": api.api_key}) as c:
            await c.post(
                "/messaging/v1/sms",
                json={
                    "to": "+4915112345678",
                    "from": "ACME",
                    "message": "hi",
                    "callbackUrl": sink.url(),
                },
            )
        await api.advance_async(0)
        assert [json.loads(b)["status"] for b in sink.bodies()] == ["ACCEPTED"]
        await api.advance_async(3)
        assert [json.loads(b)["status"] for b in sink.bodies()] == [
            "ACCEPTED",
            "BUFFERED",
            "DELIVERED",
        ]
        callbacks = api.callbacks
        assert [c["attempts"][0]["statusCode"] for c in callbacks] == [200, 200, 200]
        assert (await api.wait_for_async(status="DELIVERED"))["to"] == "+4915112345678"
    finally:
        api.stop()


def test_wait_for_fails_the_test_when_nothing_matches() -> None:
    api = PlatformApi()
    try:
        with pytest.raises(AssertionError, match="no SMS matched"):
            api.wait_for(to="+4915112345678", timeout=0)
    finally:
        api.stop()


def test_a_receiver_that_never_answers_fails_advance_clearly_and_leaves_the_fixture_usable() -> (
    None
):
    silent = socket.socket()  # listens, never accepts: the request is sent, never answered
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    api = PlatformApi()
    try:
        body = {
            "to": "+4915112345678",
            "from": "ACME",
            "message": "hi",
            "callbackUrl": f"http://127.0.0.1:{silent.getsockname()[1]}/never",
        }
        httpx.post(f"{api.base_url}/messaging/v1/sms", headers={"apikey": api.api_key}, json=body)
        with pytest.raises(AssertionError, match=r"advance\(2 days.*did not finish within 0.5 s"):
            api.advance(timedelta(hours=49), timeout=0.5)
        assert [m["to"] for m in api.messages] == ["+4915112345678"]  # still answers
    finally:
        api.stop()
        silent.close()


@pytest.mark.parametrize(
    ("delta", "error"),
    [(True, TypeError), ("5", TypeError), (None, TypeError), (float("nan"), ValueError),
     (float("inf"), ValueError), (-1, ValueError), (timedelta(seconds=-1), ValueError)],
)  # fmt: skip
def test_advance_refuses_what_is_not_a_step_forward(delta: object, error: type) -> None:
    api = PlatformApi()
    try:
        with pytest.raises(error):
            api.advance(delta)  # type: ignore[arg-type]
    finally:
        api.stop()


@pytest.mark.parametrize("timeout", [float("nan"), -1, 1e9, True, "1"])
def test_wait_for_refuses_a_timeout_it_cannot_wait(timeout: object) -> None:
    api = PlatformApi()
    try:
        with pytest.raises((TypeError, ValueError)):
            api.wait_for(text="hi", timeout=timeout)  # type: ignore[arg-type]
    finally:
        api.stop()


def test_reset_forgets_and_stop_closes_the_port() -> None:
    api = PlatformApi()
    headers = {"apikey": api.api_key}
    body = {"to": "+4915112345678", "from": "ACME", "message": "hi"}
    httpx.post(f"{api.base_url}/messaging/v1/sms", headers=headers, json=body)
    api.wait_for(text="hi")
    api.reset()
    assert api.messages == []
    api.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{api.base_url}/messaging/v1/sms", headers=headers, json=body)


def test_the_fixture_is_registered_by_the_plugin(pytestconfig: pytest.Config) -> None:
    plugin = pytestconfig.pluginmanager.get_plugin("relay_platform")
    assert plugin is not None and hasattr(plugin, "platform_api")


def test_a_sandbox_of_ones_own_settings() -> None:
    settings = SandboxSettings(api_key="my-key", chaos=ChaosSettings(api_500=1.0))
    api = PlatformApi(settings)
    try:
        answer = httpx.post(
            f"{api.base_url}/messaging/v1/sms",
            headers={"apikey": "my-key"},
            json={"to": "+4915112345678", "from": "ACME", "message": "hi"},
        )
    finally:
        api.stop()
    assert api.api_key == "my-key"
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/problem+json"
