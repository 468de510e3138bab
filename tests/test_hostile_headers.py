"""Header-level attacks on the checks: X-Forwarded-For split over several lines, Forwarded,
repeated credentials, and timestamps that no datetime can hold."""

from __future__ import annotations

import itertools
import json
import logging
from datetime import UTC, datetime
from ipaddress import ip_address, ip_network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from receivers import HeaderCheck, SourceConfig
from receivers.auth import AuthFailure, check_signature, client_address, sign
from receivers.handler import _forwarded_for
from relay.simulator import factories
from tests.conftest import ClientFactory

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SECRET = "hostile-hmac-secret-0123456789"
TOKEN = "hostile-token-0123456789"
PLATFORM = "203.0.113.0/24"
PROXY = "10.0.0.2"
ATTACKER = "198.51.100.1"


def forwarded_lines(*lines: str) -> list[tuple[str, str]]:
    return [("x-forwarded-for", line) for line in lines]


@pytest.mark.slow
async def test_a_forwarded_for_line_appended_by_the_proxy_is_read(
    make_client: ClientFactory,
) -> None:
    """HAProxy's `option forwardfor` appends a line of its own: the caller's forged line comes
    first, the proxy's (the real peer) last. The nearest untrusted hop of all lines counts."""
    source = SourceConfig(allow_ips=[PLATFORM])
    async with make_client(
        {"default": source}, client_ip=PROXY, trusted_proxies=("10.0.0.0/8",)
    ) as client:
        forged = forwarded_lines("203.0.113.9", ATTACKER)
        answer = await client.post("/hooks/sms/dlr", json=factories.sms_dlr(), headers=forged)
        assert answer.status_code == 403
        honest = forwarded_lines(ATTACKER, "203.0.113.9")  # the platform behind the attacker's
        answer = await client.post("/hooks/sms/dlr", json=factories.sms_dlr(), headers=honest)
        assert answer.status_code == 200


@pytest.mark.slow
async def test_forwarded_is_not_read(make_client: ClientFactory) -> None:
    """Only X-Forwarded-For is believed (behind trusted proxies): a proxy that sets the other
    header would let a caller pick whichever one the proxy leaves alone."""
    source = SourceConfig(allow_ips=[PLATFORM])
    async with make_client(
        {"default": source}, client_ip=PROXY, trusted_proxies=("10.0.0.0/8",)
    ) as client:
        headers = {"forwarded": "for=203.0.113.9;proto=https"}
        answer = await client.post("/hooks/sms/dlr", json=factories.sms_dlr(), headers=headers)
        assert answer.status_code == 403


HOPS = st.lists(
    st.sampled_from(["10.0.0.1", "10.9.9.9", "203.0.113.9", ATTACKER, "2001:db8::1", "junk"]),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200)
@given(hops=HOPS, cuts=st.sets(st.integers(min_value=1, max_value=5)))
def test_forwarded_for_lines_are_one_list(hops: list[str], cuts: set[int]) -> None:
    """However the chain is split into lines, the caller is the same as for one line."""
    bounds = [0, *sorted(c for c in cuts if c < len(hops)), len(hops)]
    lines = [", ".join(hops[a:b]) for a, b in itertools.pairwise(bounds)]
    raw = [(b"x-forwarded-for", line.encode()) for line in lines]
    proxies = (ip_network("10.0.0.0/8"),)
    assert client_address(PROXY, _forwarded_for(raw), proxies) == client_address(
        PROXY, ", ".join(hops), proxies
    )


def test_the_nearest_untrusted_hop_is_the_caller() -> None:
    proxies = (ip_network("10.0.0.0/8"),)
    chain = f"203.0.113.9, {ATTACKER}, 10.0.0.7"
    assert client_address(PROXY, chain, proxies) == ip_address(ATTACKER)


REPEATED = [
    ("token", {"params": [("token", TOKEN), ("token", TOKEN)]}),
    ("token", {"params": [("token", "wrong-token-0123456789"), ("token", TOKEN)]}),
    ("header", {"headers": [("x-callback-key", TOKEN), ("x-callback-key", TOKEN)]}),
    ("basic", {"headers": [("authorization", "Basic eDp5"), ("authorization", "Basic eDp5")]}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("mechanism", "request_options"), REPEATED)
async def test_a_credential_given_twice_is_refused(
    make_client: ClientFactory, mechanism: str, request_options: dict[str, object]
) -> None:
    source = {
        "token": SourceConfig(token=TOKEN),
        "header": SourceConfig(header=HeaderCheck(name="X-Callback-Key", value=TOKEN)),
        "basic": SourceConfig(basic_auth=f"x:{TOKEN}"),
    }[mechanism]
    async with make_client({"default": source}) as client:
        answer = await client.post(
            "/hooks/sms/dlr",
            json=factories.sms_dlr(),
            **request_options,  # type: ignore[arg-type]
        )
    assert answer.status_code == 401


def signed_headers(body: bytes, stamp: str) -> list[tuple[str, str]]:
    return [
        ("content-type", "application/json"),
        ("x-request-timestamp", stamp),
        ("x-signature", sign(SECRET, stamp, body)),
    ]


async def test_repeated_signature_headers_are_refused(make_client: ClientFactory) -> None:
    body = json.dumps(factories.conversations_status()).encode()
    stamp = str(int(NOW.timestamp()))
    headers = signed_headers(body, stamp)
    source = SourceConfig(signature_secret=SECRET)
    async with make_client({"default": source}, clock=lambda: NOW) as client:
        ok = await client.post("/hooks/conversations", content=body, headers=headers)
        assert ok.status_code == 200
        for name, value in headers[1:]:
            twice = [*headers, (name, value)]
            answer = await client.post("/hooks/conversations", content=body, headers=twice)
            assert answer.status_code == 401, name


BAD_TIMESTAMPS = [
    "-99999999999",
    "99999999999",
    "-1e14",
    "1e14",
    "253402300800",  # 10000-01-01
    "-62135596801",  # before year 1
    "nan",
    "inf",
    "-inf",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "0001-01-01T00:00:00",
    "",
    " ",
    "1" * 400,
]


@pytest.mark.slow
@pytest.mark.parametrize("stamp", BAD_TIMESTAMPS)
async def test_an_unreadable_or_out_of_range_timestamp_is_a_401(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture, stamp: str
) -> None:
    body = json.dumps(factories.conversations_status()).encode()
    source = SourceConfig(signature_secret=SECRET)
    with caplog.at_level(logging.WARNING):
        async with make_client({"default": source}, clock=lambda: NOW) as client:
            answer = await client.post(
                "/hooks/conversations", content=body, headers=signed_headers(body, stamp)
            )
    assert answer.status_code == 401
    assert answer.headers["content-type"] == "application/problem+json"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@settings(max_examples=500)
@given(stamp=st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40))
def test_any_timestamp_text_passes_or_is_a_401(stamp: str) -> None:
    """Whatever the header holds, the check answers (never an unexpected exception)."""
    body = b"{}"
    headers = Headers(
        raw=[(k.encode(), v.encode("latin-1")) for k, v in signed_headers(body, stamp.strip())]
    )
    try:
        check_signature(SourceConfig(signature_secret=SECRET), headers, body, NOW)
    except AuthFailure as failure:
        assert failure.status == 401


@pytest.mark.slow
@pytest.mark.parametrize(
    "authorization", [b"Basic \xc3\xa9", b"Basic \xff\xfe", b"Basic \xe9t\xe9", b"\xc3\xa9"]
)
async def test_basic_auth_beyond_ascii_is_a_401(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture, authorization: bytes
) -> None:
    """Base64 is ASCII: other bytes are wrong credentials, not a server error."""
    source = SourceConfig(basic_auth=f"platform:{TOKEN}")
    with caplog.at_level(logging.WARNING):
        async with make_client({"default": source}) as client:
            answer = await client.post(
                "/hooks/sms/dlr",
                json=factories.sms_dlr(),
                headers=[(b"authorization", authorization)],
            )
    assert answer.status_code == 401
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
