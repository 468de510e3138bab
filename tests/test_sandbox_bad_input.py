"""Hostile and empty input to the sandbox's API: every refusal is an RFC 7807 problem naming
what is wrong (401, 400 with the field, 404, 405, 413), never a 500, and nothing is recorded."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receivers.problems import Problem
from relay.sandbox.sms_request import parse_sms
from tests.sandbox_support import API_KEY, START, sandbox_api, sms_fields

PROBLEM = "application/problem+json"
ROUTES = [
    ("POST", "/messaging/v1/sms"),
    ("GET", "/messaging/v1/sms"),
    ("GET", "/messaging/v1/messages/x"),
    ("POST", "/messaging/v1/conversion"),
    ("GET", "/_sandbox/messages"),
    ("GET", "/_sandbox/messages/wait"),
    ("GET", "/_sandbox/callbacks"),
    ("POST", "/_sandbox/callbacks/x/resend"),
    ("POST", "/_sandbox/reset"),
    ("GET", "/_sandbox/numbers"),
    ("GET", "/_sandbox/idle"),
]


def assert_problem(answer: httpx.Response, status: int, field: str | None = None) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    body = answer.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if field is not None:
        assert [e["field"] for e in body["errors"]] == [field]
        assert body["detail"].startswith(f"{field.strip('()')}: ")


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "headers",
    [[], [("apikey", "")], [("apikey", "wrong")], [("apikey", API_KEY), ("apikey", API_KEY)]],
    ids=["missing", "empty", "wrong", "repeated"],
)
async def test_every_route_wants_the_api_key_once(
    method: str, path: str, headers: list[tuple[str, str]]
) -> None:
    async with sandbox_api() as api:
        client = httpx.AsyncClient(
            transport=api.client._transport, base_url=str(api.client.base_url)
        )
        async with client:
            answer = await client.request(method, path, headers=headers, json=sms_fields())
        assert_problem(answer, 401)
        assert answer.headers["www-authenticate"] == "apikey"
        assert api.sandbox.state.messages == {}


async def test_a_key_with_non_ascii_bytes_is_refused() -> None:
    async with sandbox_api() as api:
        answer = await api.client.post(
            "/messaging/v1/sms", headers={"apikey": "ключ".encode()}, json=sms_fields()
        )
    assert_problem(answer, 401)


HUGE = "9" * 20_000
UNSENDABLE_URLS = [
    "http://example.com/a\tb",
    "http://example.com/\r\nX-Injected: 1",
    "http://example.com/\x00",
    "http://example.com:abc/",
    "http://example.com:99999/",
    "http://example.com:-1/",
    "http://example.com:0/",
    "http://exa mple.com/",
]
"""URLs httpx cannot send (or should not): refused at the API, not failing at each send."""
LOOSE_NUMBERS = ["1_0", " 10 ", "10\n", "\u0661\u0660", "\uff11\uff10", "+", "1e1", "0x10"]
"""What Python's int() or float() accept (or nearly) that no client means: only ASCII digits."""
BAD_FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("to", {"to": None}),
    ("to", {"to": ""}),
    ("to", {"to": 4915112345678}),
    ("to", {"to": ["+4915112345678"]}),
    ("to", {"to": "004915112345678"}),
    ("to", {"to": "+49 151 1234"}),
    ("to", {"to": "+0123456789"}),
    ("to", {"to": "+" + HUGE}),
    ("from", {"from": None}),
    ("from", {"from": ""}),
    ("from", {"from": "TwelveLetter"}),
    ("from", {"from": "+12"}),
    ("from", {"from": "ACME<script>"}),
    ("from", {"from": {"name": "ACME"}}),
    ("message", {"message": None}),
    ("message", {"message": ""}),
    ("message", {"message": 42}),
    ("message", {"message": "x" * 10_001}),
    ("encoding", {"encoding": "UTF8"}),
    ("encoding", {"encoding": 7}),
    ("callbackUrl", {"callbackUrl": "ftp://example.com/x"}),
    ("callbackUrl", {"callbackUrl": "javascript:alert(1)"}),
    ("callbackUrl", {"callbackUrl": "http://"}),
    ("callbackUrl", {"callbackUrl": "example.com/hook"}),
    ("callbackUrl", {"callbackUrl": "http://example.com/" + "a" * 2_000}),
    ("callbackUrl", {"callbackUrl": 5}),
    *[("callbackUrl", {"callbackUrl": url}) for url in UNSENDABLE_URLS],
    ("callbackMethod", {"callbackMethod": "PUT"}),
    ("callbackMethod", {"callbackMethod": True}),
    ("partLimit", {"message": "a" * 161, "partLimit": 1}),
    ("partLimit", {"partLimit": 0}),
    ("partLimit", {"partLimit": "two"}),
    ("partLimit", {"partLimit": 1.5}),
    ("partLimit", {"partLimit": True}),
    ("partLimit", {"partLimit": HUGE}),
    ("partLimit", {"partLimit": 10**400}),
    ("partLimit", {"partLimit": 10_001}),
    ("validity", {"validity": 10**400}),
    ("validity", {"validity": -(10**400)}),
    ("trate", {"trate": 10**400}),
    *[("validity", {"validity": text}) for text in LOOSE_NUMBERS],
    *[("mrate", {"mrate": text}) for text in ("0_5", " 0.5", "1e-1", "nan", "inf", "\u0660.5")],
    ("validity", {"validity": "0"}),
    ("validity", {"validity": "-5"}),
    ("validity", {"validity": "ten"}),
    ("validity", {"validity": "43201"}),
    ("sendDateTime", {"sendDateTime": "tomorrow"}),
    ("sendDateTime", {"sendDateTime": "2020-01-01T00:00:00Z"}),
    ("sendDateTime", {"sendDateTime": "2099-01-01T00:00:00Z"}),
    ("sendDateTime", {"sendDateTime": "2" * 100}),
    ("trate", {"trate": 1.5}),
    ("mrate", {"mrate": "NaN"}),
    ("flash", {"flash": "maybe"}),
    ("reference", {"reference": "r" * 256}),
    ("gateway", {"gateway": ["a"]}),
]


@pytest.mark.parametrize(("field", "changes"), BAD_FIELDS)
async def test_a_bad_field_is_a_400_problem_naming_it(field: str, changes: dict[str, Any]) -> None:
    async with sandbox_api() as api:
        answer = await api.send(**changes)
        assert_problem(answer, 400, field)
        assert api.sandbox.state.messages == {}


@pytest.mark.parametrize(
    ("field", "changes"),
    [(f, c) for f, c in BAD_FIELDS if all(isinstance(v, str) or v is None for v in c.values())],
)
async def test_a_bad_query_parameter_is_a_400_problem_naming_it(
    field: str, changes: dict[str, Any]
) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get("/messaging/v1/sms", params=sms_fields(**changes))
    assert_problem(answer, 400, field)


async def test_a_repeated_query_parameter_is_refused() -> None:
    async with sandbox_api() as api:
        params = [*sms_fields().items(), ("to", "+4915112345679")]
        answer = await api.client.get("/messaging/v1/sms", params=params)
    assert_problem(answer, 400, "to")


async def test_badly_encoded_query_parameters_are_a_problem_not_a_crash() -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(
            "/messaging/v1/sms?to=%2B4915112345678&from=ACME&message=%FF%FE&callbackUrl=%00"
        )
    assert_problem(answer, 400, "callbackUrl")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "is empty"),
        (b"   ", "is empty"),
        (b"not json", "is not JSON"),
        (b'{"to": "+4915112345678",', "is not JSON"),
        (b"\xff\xfe{}", "is not UTF-8"),
        (b"[1, 2]", "is not a JSON object"),
        (b'"text"', "is not a JSON object"),
        (b"null", "is not a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, None),
        (b'{"validity": ' + b"9" * 5_000 + b"}", "is not JSON"),
        (b'{"to": "+4915112345678", "from": "ACME", "message": "\\ud800"}', "surrogate"),
    ],
)
async def test_a_body_that_is_not_a_json_object_is_a_400_problem(
    content: bytes, reason: str | None
) -> None:
    async with sandbox_api() as api:
        answer = await api.client.post(
            "/messaging/v1/sms", content=content, headers={"content-type": "application/json"}
        )
    if reason is None:
        assert answer.status_code in (400, 413)
        assert answer.headers["content-type"] == PROBLEM
        return
    assert_problem(answer, 400, "(body)")
    assert reason in answer.json()["detail"]


async def test_a_huge_body_is_a_413_problem() -> None:
    async with sandbox_api() as api:
        answer = await api.send(message="a" * 70_000)
    assert_problem(answer, 413)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/messaging/v1/sms"),
        ("DELETE", "/messaging/v1/sms"),
        ("POST", "/messaging/v1/messages/x"),
        ("GET", "/messaging/v1/conversion"),
        ("DELETE", "/_sandbox/messages"),
        ("HEAD", "/messaging/v1/sms"),
        ("HEAD", "/messaging/v1/messages/x"),
        ("GET", "/_sandbox/reset"),
    ],
)
async def test_a_wrong_method_is_a_405_problem(method: str, path: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.request(method, path, params=sms_fields())
        assert answer.status_code == 405
        assert answer.headers["allow"]
        if method != "HEAD":
            assert_problem(answer, 405)
        assert api.sandbox.state.messages == {}


@pytest.mark.parametrize(
    "path", ["/", "/messaging/v1/sms/", "/messaging/v2/sms", "/nis/v1/gnx", "/_sandbox"]
)
async def test_an_unknown_path_is_a_404_problem(path: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(path)
    assert_problem(answer, 404)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "requestId"),
        ({"requestId": ""}, "requestId"),
        ({"requestId": 7}, "requestId"),
        ({"requestId": "x", "delivered": "yes"}, "delivered"),
        ({"requestId": "x", "timestamp": "soon"}, "timestamp"),
        ({"requestId": "x", "timestamp": 5}, "timestamp"),
    ],
)
async def test_a_bad_conversion_is_a_400_problem_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    async with sandbox_api() as api:
        answer = await api.client.post("/messaging/v1/conversion", json=body)
    assert_problem(answer, 400, field)


@pytest.mark.parametrize(
    "value",
    ["nonsense", "api-429, nonsense", ",", "x" * 201],
    ids=["unknown", "mixed", "empty", "huge"],
)
async def test_a_bad_chaos_header_is_a_400_problem(value: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.post(
            "/messaging/v1/sms", json=sms_fields(), headers={"x-sandbox-chaos": value}
        )
        assert_problem(answer, 400, "X-Sandbox-Chaos")
        assert api.sandbox.state.messages == {}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=5,
)
FIELD_NAMES = [
    "to",
    "from",
    "message",
    "encoding",
    "gateway",
    "conversion",
    "sendDateTime",
    "validity",
    "reference",
    "callbackUrl",
    "callbackMethod",
    "partLimit",
    "trate",
    "mrate",
    "upperCased",
    "keepEmojis",
    "flash",
]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELD_NAMES), JSON_VALUES))
def test_any_json_fields_are_accepted_or_a_400_naming_a_field(fields: dict[str, Any]) -> None:
    base = sms_fields()
    for candidate in (fields, {**base, **fields}):
        try:
            parse_sms(candidate, START)
        except Problem as problem:
            assert problem.status == 400
            assert problem.extra["errors"][0]["field"] in FIELD_NAMES


async def test_a_client_that_leaves_mid_body_is_a_closed_request_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with sandbox_api() as api:
        app = api.client._transport.app  # type: ignore[attr-defined]
        incoming = [
            {"type": "http.request", "body": b'{"to": "+49', "more_body": True},
            {"type": "http.disconnect"},
        ]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return incoming.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/messaging/v1/sms",
            "raw_path": b"/messaging/v1/sms",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"apikey", API_KEY.encode()), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8100),
        }
        await app(scope, receive, send)
        assert sent[0]["status"] == 400
        assert api.sandbox.state.messages == {}
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
