"""Schemathesis against the receivers' own OpenAPI document, on a real `relay serve`.

Every generated request (valid and invalid bodies, query parameters and headers, for every
operation) must get no 5xx, and every error must be problem+json."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.generation.case import Case

from receivers import ReceiverConfig, SourceConfig
from receivers.openapi import openapi_document
from tests.conftest import TOKEN
from tests.support import free_port
from tests.test_restart import start_server

pytestmark = pytest.mark.slow

SOURCES = {"default": SourceConfig(token=TOKEN)}
schema = schemathesis.openapi.from_dict(openapi_document(ReceiverConfig(sources=SOURCES)))


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("schemathesis")
    config = tmp / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp / "relay.db"}"\n[sources.default]\ntoken = "{TOKEN}"\n'
    )
    port = free_port()
    process = start_server(config, port, tmp / "server.log")
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=30)


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_problem_json(case: Case, base_url: str) -> None:
    params = dict(case.query or {})
    params.setdefault("token", TOKEN)
    response = case.call(base_url=base_url, params=params)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        content_type = response.headers["content-type"]
        assert content_type == ["application/problem+json"], content_type
        assert response.json()["status"] == response.status_code
