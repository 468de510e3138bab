"""Hostile input: generated requests across paths, methods, headers, queries and bodies.

No answer is a 5xx, every 4xx is problem+json, nothing is logged as an error, and the
quarantine holds exactly the bodies answered 400/422. The number of examples follows the
hypothesis profile: ``ci`` (CI=true) generates over 10,000 requests in all.
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
from receivers.store import queries
from relay.simulator import factories
from tests.conftest import TOKEN, running_client

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
METHODS = st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=25,
)
FACTORIES = [
    factories.sms_inbound,
    factories.sms_dlr,
    factories.numinfo_gnp,
    factories.numinfo_gnv,
    factories.conversations_status,
    factories.conversations_inbound,
    factories.tts_event,
]


@st.composite
def mutated_payload(draw: st.DrawFn) -> bytes:
    """A realistic payload, then a key dropped, a value of the wrong type, or junk added."""
    body: dict[str, Any] = draw(st.sampled_from(FACTORIES))()
    keys = sorted(body)
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["drop", "retype", "add"]))
        key = draw(st.sampled_from(keys))
        if action == "drop":
            body.pop(key, None)
        elif action == "retype":
            body[key] = draw(JSON)
        else:
            body[draw(st.text(max_size=10))] = draw(JSON)
    return json.dumps(body).encode()


BODIES = st.one_of(
    mutated_payload(),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1, 200).map(lambda depth: b"[" * depth + b"]" * depth),
)
HEADER_VALUES = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "content-type": st.sampled_from(["application/json", "text/plain", "", "x/y; a=b"]),
        "x-forwarded-for": HEADER_VALUES,
        "x-signature": HEADER_VALUES,
        "x-request-timestamp": HEADER_VALUES,
        "authorization": HEADER_VALUES,
        "x-callback-key": HEADER_VALUES,
    },
)
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
        if answer.status_code >= 400:
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
    headers: dict[str, str],
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
    """A receiver whose quarantine and store are checked against every answer at the end."""
    observed = Observed()
    async with make_client() as client:
        client.observed = observed
        yield client
    await assert_store_matches(engine, observed)


@FUZZ
@given(path=st.sampled_from(KNOWN_PATHS), headers=HEADERS, query=QUERIES, body=BODIES)
async def test_fuzz_every_mechanism_refuses_garbage_credentials(
    engine: AsyncEngine,
    path: str,
    headers: dict[str, str],
    query: dict[str, str],
    body: bytes,
) -> None:
    sources = {
        "default": SourceConfig(
            token="right-token", basic_auth="u:p", signature_secret="sig", allow_ips=["127.0.0.0/8"]
        )
    }
    async with running_client(engine, sources) as client:
        answer = await client.post(path, params=query, headers=headers, content=body)
    assert answer.status_code in (401, 404, 405, 413), answer.text
    assert answer.headers["content-type"] == "application/problem+json"


@FUZZ
@given(
    body=mutated_payload(),
    path=st.sampled_from(KNOWN_PATHS),
    query=st.dictionaries(
        st.sampled_from(["requestId", "status", "message", "parts"]),
        st.text(max_size=20),
        max_size=3,
    ),
)
async def test_fuzz_payload_mutations_and_get_queries(
    client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    path: str,
    query: dict[str, str],
) -> None:
    posted = await client.post(
        path, params={"token": TOKEN}, content=body, headers={"content-type": "application/json"}
    )
    got = await client.get(path, params={"token": TOKEN, **query})
    client.observed.check(posted, body)  # type: ignore[attr-defined]
    client.observed.check(got, b"")  # type: ignore[attr-defined]  # (GET: raw from the URL)
    no_errors_logged(caplog)
