"""Hostile input: generated requests across paths, methods, headers, queries and bodies.

No answer is a 5xx, every 4xx is problem+json, nothing is logged as an error, and the
quarantine holds exactly the bodies answered 400/422. Both backends are fuzzed, with what one of
them stores and the other refuses in mind: NaN, Infinity and out-of-range numbers, NUL in
strings, Content-Types and caller addresses (behind a trusted proxy) longer than their columns.
The number of examples follows the hypothesis profile: ``ci`` (CI=true) generates over 10,000
requests in all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import SourceConfig
from receivers.kinds import KINDS
from receivers.sources import HeaderCheck
from receivers.store import queries
from relay.simulator import factories
from tests.conftest import TOKEN, running_client

pytestmark = pytest.mark.slow

CI_EXAMPLES = 1700  # 3 tests x 2 backends, the last with 2 requests each: 13,600 requests
EXAMPLES = CI_EXAMPLES if os.environ.get("CI", "").lower() == "true" else 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

KNOWN_PATHS = sorted({f"/hooks{path}" for kind in KINDS for path in kind.paths})
PATHS = st.one_of(
    st.sampled_from(KNOWN_PATHS),
    st.sampled_from(KNOWN_PATHS).map(lambda p: p.replace("/hooks", "/hooks/nosuch")),
    st.text(alphabet="/abcdefghijklmnopqrstuvwxyz-_.%~0123456789", max_size=40).map(
        lambda p: "/" + p
    ),
)
METHODS = st.sampled_from(
    ["POST", "POST", "POST", "GET", "GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=25,
)
FACTORIES = [
    ("/hooks/sms/inbound", factories.sms_inbound),
    ("/hooks/sms/dlr", factories.sms_dlr),
    ("/hooks/numinfo/gnp", factories.numinfo_gnp),
    ("/hooks/numinfo/gnv", factories.numinfo_gnv),
    ("/hooks/conversations", factories.conversations_status),
    ("/hooks/chat-api", factories.conversations_inbound),
    ("/hooks/tts/events", factories.tts_event),
]
"""Each kind's realistic payload, with the path it is posted to."""
NUMBER_TOKENS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-0", "9" * 40, "0.1e999999"]
)
"""Number tokens that json.dumps never writes: NaN and Infinity (not JSON, but some encoders
write them), numbers beyond a float's range or precision, a long integer."""
NUMBER_PLACEHOLDER = "\u0000number\u0000"


@st.composite
def callback(draw: st.DrawFn) -> tuple[str, bytes]:
    """A realistic payload at its kind's path (now and then another receiver's), then either
    mutated (a key dropped, a value of the wrong type, junk added) or with one value written as
    a raw number token (mostly in place of one of its numbers: a number field of the model)."""
    path, factory = draw(st.sampled_from(FACTORIES))
    body: dict[str, Any] = factory()
    if draw(st.integers(0, 3)) == 0:
        path = draw(st.sampled_from(KNOWN_PATHS))
    keys = sorted(body)
    if draw(st.booleans()):
        numbers = [key for key in keys if type(body[key]) in (int, float)]
        pick_from = numbers if numbers and draw(st.booleans()) else [*keys, "extraNumber"]
        body[draw(st.sampled_from(pick_from))] = NUMBER_PLACEHOLDER
        text = json.dumps(body).replace(json.dumps(NUMBER_PLACEHOLDER), draw(NUMBER_TOKENS))
        return path, text.encode()
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["drop", "retype", "add"]))
        key = draw(st.sampled_from(keys))
        if action == "drop":
            body.pop(key, None)
        elif action == "retype":
            body[key] = draw(JSON)
        else:
            body[draw(st.text(max_size=10))] = draw(JSON)
    return path, json.dumps(body).encode()


BODIES = st.one_of(
    callback().map(lambda addressed: addressed[1]),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1, 200).map(lambda depth: b"[" * depth + b"]" * depth),
)
PRINTABLE = st.characters(min_codepoint=32, max_codepoint=126)
HEADER_VALUES = st.text(alphabet=PRINTABLE, max_size=40)
CONTENT_TYPES = st.one_of(
    st.sampled_from(["application/json", "text/plain", "", "x/y; a=b"]),
    st.text(alphabet=PRINTABLE, min_size=200, max_size=400).map(
        lambda t: "application/json; x=" + t
    ),
)
FORWARDED_FOR = st.one_of(
    HEADER_VALUES,
    st.ip_addresses().map(str),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=40, max_size=120).map(
        lambda zone: "fe80::1%" + zone  # an IPv6 address with a zone id, up to 128 characters
    ),
)
TIMESTAMPS = st.one_of(
    HEADER_VALUES,
    st.integers(-(10**20), 10**20).map(str),
    st.floats().map(str),
    st.datetimes().map(lambda moment: moment.isoformat() + "+14:00"),
)
LONG_VALUES = st.integers(1, 8).map(lambda kib: "x" * (kib * 1024))
HEADER_STRATEGIES = {
    "content-type": CONTENT_TYPES,
    "x-forwarded-for": FORWARDED_FOR,
    "forwarded": FORWARDED_FOR.map(lambda hop: f"for={hop}"),
    "x-signature": HEADER_VALUES,
    "x-request-timestamp": TIMESTAMPS,
    "x-signature-version": st.sampled_from(["v1.0", "V1", "v2", ""]),
    "authorization": HEADER_VALUES.map(lambda value: "Basic " + value) | HEADER_VALUES,
    "x-callback-key": HEADER_VALUES | LONG_VALUES,
}


@st.composite
def header_lines(draw: st.DrawFn) -> list[tuple[str, str]]:
    """Header lines, some of them repeated, some long (as a proxy or an attacker sends them)."""
    names = draw(st.lists(st.sampled_from(sorted(HEADER_STRATEGIES)), max_size=8))
    return [(name, draw(HEADER_STRATEGIES[name])) for name in names]


HEADERS = header_lines()
QUERIES = st.dictionaries(
    st.sampled_from(
        ["token", "requestId", "status", "from", "to", "message", "contentList", "parts", "x"]
    ),
    st.text(max_size=30),
    max_size=5,
)


class Observed:
    """What the fuzzer saw: answers to check the quarantine against."""

    def __init__(self) -> None:
        self.quarantined: dict[str, int] = {}
        self.accepted: set[str] = set()

    def check(self, answer: httpx.Response, body: bytes) -> None:
        if answer.request.method == "GET":  # stored raw: the query string less the token
            pairs = answer.request.url.query.split(b"&")
            body = b"&".join(p for p in pairs if p.partition(b"=")[0] != b"token")
        assert answer.status_code < 500, answer.text
        if answer.status_code >= 400 and answer.request.method != "HEAD":
            assert answer.headers["content-type"] == "application/problem+json", answer.text
            problem = answer.json()
            assert problem["status"] == answer.status_code
            assert problem["type"].startswith("urn:callback-relay:problem:")
            assert problem["title"] and problem["detail"]
            if problem["type"].endswith(("undecodable-body", "invalid-payload")):
                digest = "sha256:" + hashlib.sha256(body).hexdigest()
                self.quarantined[digest] = self.quarantined.get(digest, 0) + 1
        elif answer.status_code == 200:
            self.accepted.add(answer.json()["id"])


async def assert_store_matches(engine: AsyncEngine, observed: Observed) -> None:
    rejected = {r.body_hash: r.count for r in await queries.list_rejected(engine, limit=100_000)}
    assert rejected == observed.quarantined
    stored = {e.id for e in await queries.list_events(engine, limit=100_000)}
    assert stored == observed.accepted


def no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    ours = [r for r in caplog.records if r.name.split(".")[0] in ("receivers", "relay")]
    assert [r.getMessage() for r in ours if r.levelno >= logging.ERROR] == []


@FUZZ
@given(path=PATHS, method=METHODS, headers=HEADERS, query=QUERIES, body=BODIES)
async def test_fuzz_requests_with_a_valid_token(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
    path: str,
    method: str,
    headers: list[tuple[str, str]],
    query: dict[str, str],
    body: bytes,
) -> None:
    query = {**query, "token": TOKEN}
    answer = await client.request(
        method, path, params=query, headers=headers, content=body if method != "GET" else None
    )
    observed = client.observed  # type: ignore[attr-defined]
    observed.check(answer, body)
    no_errors_logged(caplog)


@pytest.fixture
async def client(make_client: Any, engine: AsyncEngine) -> Any:
    """A receiver behind a trusted proxy (so X-Forwarded-For is what gets stored) whose
    quarantine and store are checked against every answer at the end."""
    observed = Observed()
    async with make_client(trusted_proxies=["127.0.0.0/8"]) as client:
        client.observed = observed
        yield client
    await assert_store_matches(engine, observed)


GUARDED_SOURCES = {
    "default": SourceConfig(
        token="right-token-0123456789",
        basic_auth="u:p-0123456789abcdef",
        signature_secret="sig-0123456789abcdef",
        allow_ips=["127.0.0.0/8"],
    ),
    "token": SourceConfig(token="right-token-0123456789"),
    "basic": SourceConfig(basic_auth="u:p-0123456789abcdef"),
    "keyed": SourceConfig(header=HeaderCheck(name="X-Callback-Key", value="right-key-0123456789")),
    "signed": SourceConfig(signature_secret="sig-0123456789abcdef"),
    "walled": SourceConfig(allow_ips=["192.0.2.0/24"]),
}
"""Every mechanism at once (the default source), and each alone."""
GUARDED_PATHS = [
    path if name == "default" else path.replace("/hooks", f"/hooks/{name}", 1)
    for name in GUARDED_SOURCES
    for path in KNOWN_PATHS
]


@pytest.fixture
async def guarded_client(engine: AsyncEngine) -> Any:
    """A receiver of :data:`GUARDED_SOURCES`; garbage credentials store nothing."""
    async with running_client(engine, GUARDED_SOURCES) as client:
        yield client
    assert await queries.list_events(engine) == []
    assert await queries.list_rejected(engine) == []


@FUZZ
@given(
    path=st.sampled_from(GUARDED_PATHS),
    method=METHODS,
    headers=HEADERS,
    query=QUERIES,
    body=BODIES,
)
async def test_fuzz_every_mechanism_refuses_garbage_credentials(
    guarded_client: httpx.AsyncClient,
    path: str,
    method: str,
    headers: list[tuple[str, str]],
    query: dict[str, str],
    body: bytes,
) -> None:
    """Every method at every receiver of every mechanism, with garbage credentials."""
    answer = await guarded_client.request(
        method, path, params=query, headers=headers, content=body if method != "GET" else None
    )
    takes_get = path.endswith(("/sms/inbound", "/sms/dlr"))
    if method not in ("POST", "GET") or (method == "GET" and not takes_get):
        assert answer.status_code == 405, answer.text
    else:
        refused = 403 if path.startswith("/hooks/walled/") else 401
        assert answer.status_code in (refused, 413), answer.text
    if method != "HEAD":
        assert answer.headers["content-type"] == "application/problem+json"


@FUZZ
@given(
    target=callback(),
    headers=HEADERS,
    query=st.dictionaries(
        st.sampled_from(["requestId", "status", "message", "parts"]),
        st.text(max_size=20),
        max_size=3,
    ),
)
async def test_fuzz_payloads_at_their_receivers_and_get_queries(
    client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    target: tuple[str, bytes],
    headers: list[tuple[str, str]],
    query: dict[str, str],
) -> None:
    path, body = target
    headers = [("content-type", "application/json"), *headers]
    posted = await client.post(path, params={"token": TOKEN}, content=body, headers=headers)
    got = await client.get(path, params={"token": TOKEN, **query})
    client.observed.check(posted, body)  # type: ignore[attr-defined]
    client.observed.check(got, b"")  # type: ignore[attr-defined]  # (GET: raw from the URL)
    no_errors_logged(caplog)
