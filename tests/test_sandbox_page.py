"""The sandbox's watching page: reachable only with the API key (login form to a signed cookie,
or the apikey header), escapes whatever a receiver answered, sends a callback again through a
CSRF-checked form, and carries the console's strict Content-Security-Policy."""

from __future__ import annotations

import re

import httpx
import pytest

from relay.console.web import SECURITY_HEADERS as CONSOLE_HEADERS
from relay.sandbox.page import ATTEMPTS_SHOWN, COOKIE, PAGE, SECURITY_HEADERS
from tests.sandbox_support import API_KEY, Api, sandbox_api
from tests.support import Answer, Sink

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
FORM = {"content-type": "application/x-www-form-urlencoded"}


async def log_in(api: Api) -> httpx.AsyncClient:
    """A browser-like client of the same app, logged in with the key (no apikey header)."""
    browser = httpx.AsyncClient(transport=api.client._transport, base_url="https://sandbox.test")
    answer = await browser.post(f"{PAGE}/login", data={"apikey": API_KEY})
    assert answer.status_code == 303
    return browser


def cookie_header(value: str) -> dict[str, str]:
    return {"cookie": f"{COOKIE}={value}"}


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, html
    return found[1]


async def test_without_the_key_the_page_shows_only_the_login_form() -> None:
    async with sandbox_api() as api:
        await api.send(message="secret text")
        api.client.headers.pop("apikey")
        answer = await api.client.get(PAGE)
    assert answer.status_code == 401
    assert 'action="/_sandbox/page/login"' in answer.text
    assert "secret text" not in answer.text


@pytest.mark.parametrize("key", ["", "wrong", API_KEY + "x", "ключ", "a" * 5000])
async def test_a_wrong_key_does_not_log_in(key: str) -> None:
    async with sandbox_api() as api:
        api.client.headers.pop("apikey")
        answer = await api.client.post(f"{PAGE}/login", data={"apikey": key})
    assert answer.status_code in (400, 401, 413)
    assert COOKIE not in answer.headers.get("set-cookie", "")


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"apikey=" + API_KEY.encode(), {"content-type": "application/json"}, 400),
        (b"apikey=%FF", FORM, 400),
        (f"apikey={API_KEY}&apikey={API_KEY}".encode(), FORM, 400),
        (b"a=1&" * 2000, FORM, 413),
        (b"", FORM, 401),
    ],
)
async def test_a_malformed_login_form_is_refused(
    body: bytes, headers: dict[str, str], status: int
) -> None:
    async with sandbox_api() as api:
        api.client.headers.pop("apikey")
        answer = await api.client.post(f"{PAGE}/login", content=body, headers=headers)
    assert answer.status_code == status
    assert COOKIE not in answer.headers.get("set-cookie", "")


async def test_the_login_sets_a_strict_http_only_cookie_and_the_page_lists_everything(
    sink: Sink,
) -> None:
    async with sandbox_api() as api:
        await api.send(callbackUrl=sink.url(), message="hello page")
        await api.client.get("/nis/v1/gnp", params={"msisdn": "+99900000010"})
        await api.client.post(
            "/tts/v1/calls",
            json={
                "from": "+4930123456",
                "to": "+4915112345678",
                "message": "hi",
                "language": "de_de",
            },
        )
        await api.sandbox.scheduler.idle()
        api.client.headers.pop("apikey")
        login = await api.client.post(f"{PAGE}/login", data={"apikey": API_KEY})
        cookie = login.headers["set-cookie"]
        page = await api.client.get(PAGE, headers=cookie_header(login.cookies[COOKIE]))
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert f"path={PAGE}" in cookie.lower()
    assert API_KEY not in cookie
    assert page.status_code == 200
    for shown in ("hello page", "DELIVERED", "GNP +99900000010", "Call to +4915112345678"):
        assert shown in page.text
    assert page.text.count("Send again") == 3  # ACCEPTED, BUFFERED, DELIVERED reports


async def test_api_clients_read_the_page_with_the_apikey_header() -> None:
    async with sandbox_api() as api:
        await api.send(message="via header")
        answer = await api.client.get(PAGE)
    assert answer.status_code == 200
    assert "via header" in answer.text


async def test_a_forged_or_foreign_cookie_is_not_a_session() -> None:
    async with sandbox_api() as api, sandbox_api() as other:
        other.client.headers.pop("apikey")
        foreign = (await other.client.post(f"{PAGE}/login", data={"apikey": API_KEY})).cookies
        api.client.headers.pop("apikey")
        for value in (foreign[COOKIE], "x" * 600, "abc.def", ""):
            answer = await api.client.get(PAGE, headers=cookie_header(value))
            assert answer.status_code == 401


async def test_a_receivers_hostile_answer_is_shown_escaped(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(body=HOSTILE.encode())
    async with sandbox_api() as api:
        await api.send(callbackUrl=sink.url(), message=HOSTILE, reference=HOSTILE)
        await api.sandbox.scheduler.idle()
        page = await api.client.get(PAGE)
    assert "<script>" not in page.text
    assert "<img" not in page.text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page.text


async def test_every_answer_carries_the_consoles_security_headers() -> None:
    async with sandbox_api() as api:
        answers = [
            await api.client.get(PAGE),
            await api.client.get(f"{PAGE}/login"),
            await api.client.get(f"{PAGE}/console.css"),
        ]
    for answer in answers:
        for name, value in SECURITY_HEADERS.items():
            assert answer.headers[name] == value
    policy = SECURITY_HEADERS["content-security-policy"]
    assert "script-src" not in policy and "connect-src" not in policy
    assert policy.startswith("default-src 'none'; ") and "style-src 'self'" in policy
    assert {k: v for k, v in SECURITY_HEADERS.items() if k != "content-security-policy"} == {
        k: v for k, v in CONSOLE_HEADERS.items() if k != "content-security-policy"
    }
    assert "<script" not in answers[0].text


async def test_send_again_resends_the_callback_with_the_csrf_token(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.send(callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
        browser = await log_in(api)
        page = await browser.get(PAGE)
        callback_id = re.findall(r"/callbacks/([0-9a-f-]+)/resend", page.text)[0]
        before = len(sink.requests)
        answer = await browser.post(
            f"{PAGE}/callbacks/{callback_id}/resend", data={"csrf": csrf_of(page.text)}
        )
        await api.sandbox.scheduler.idle()
        attempts = api.sandbox.state.callbacks[callback_id].attempts
        await browser.aclose()
    assert answer.status_code == 303
    assert len(sink.requests) == before + 1
    assert attempts[-1].resent


@pytest.mark.parametrize("csrf", [None, "", "0" * 64, "é"])
async def test_send_again_without_the_right_csrf_token_is_refused(
    sink: Sink, csrf: str | None
) -> None:
    async with sandbox_api() as api:
        await api.send(callbackUrl=sink.url())
        await api.sandbox.scheduler.idle()
        browser = await log_in(api)
        callback_id = next(iter(api.sandbox.state.callbacks))
        before = len(sink.requests)
        data = {} if csrf is None else {"csrf": csrf}
        answer = await browser.post(f"{PAGE}/callbacks/{callback_id}/resend", data=data)
        await api.sandbox.scheduler.idle()
        await browser.aclose()
    assert answer.status_code == 403
    assert answer.headers["content-type"] == "application/problem+json"
    assert len(sink.requests) == before


async def test_send_again_without_a_session_is_401_and_unknown_ids_404() -> None:
    async with sandbox_api() as api:
        known = await api.client.post(f"{PAGE}/callbacks/nope/resend", data={})
        api.client.headers.pop("apikey")
        anonymous = await api.client.post(f"{PAGE}/callbacks/nope/resend", data={"csrf": "x"})
    assert (known.status_code, anonymous.status_code) == (404, 401)


async def test_logout_ends_the_session() -> None:
    async with sandbox_api() as api:
        browser = await log_in(api)
        page = await browser.get(PAGE)
        cookie = browser.cookies[COOKIE]
        out = await browser.post(f"{PAGE}/logout", data={"csrf": csrf_of(page.text)})
        again = await api.client.get(PAGE, headers={"apikey": "", **cookie_header(cookie)})
        await browser.aclose()
    assert out.status_code == 303
    assert again.status_code == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", PAGE),
        ("DELETE", f"{PAGE}/login"),
        ("GET", f"{PAGE}/logout"),
        ("GET", f"{PAGE}/callbacks/x/resend"),
    ],
)
async def test_wrong_methods_are_405(method: str, path: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.request(method, path)
    assert answer.status_code == 405


async def test_only_the_latest_attempts_of_a_failing_callback_are_shown(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(status=500, body=b"attempt-answer")
    async with sandbox_api() as api:
        await api.client.get(
            "/nis/v1/gnp", params={"msisdn": "+4915112345678", "callbackUrl": sink.url()}
        )
        await api.sandbox.scheduler.idle()
        [callback] = api.sandbox.state.callbacks.values()
        page = await api.client.get(PAGE)
    hidden = len(callback.attempts) - ATTEMPTS_SHOWN
    assert hidden > 0
    assert page.text.count("attempt-answer") == ATTEMPTS_SHOWN
    assert f"{hidden} earlier attempts not shown" in page.text
