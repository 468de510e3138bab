"""The app describes every receiver in an OpenAPI document at /openapi.json."""

from __future__ import annotations

import httpx
import pytest
from openapi_spec_validator import validate

from receivers import HeaderCheck, SourceConfig
from receivers.kinds import KINDS
from tests.conftest import ClientFactory


@pytest.mark.slow
async def test_openapi_document_is_valid_and_complete(make_client: ClientFactory) -> None:
    sources = {
        "default": SourceConfig(token="t-0123456789abcdef"),
        "eu": SourceConfig(
            signature_secret="s-0123456789abcdef",
            header=HeaderCheck(name="X-Key", value="v-0123456789abcdef"),
        ),
    }
    async with make_client(sources) as client:
        answer = await client.get("/openapi.json")
    assert answer.status_code == 200
    document = answer.json()
    validate(document)
    for prefix in ("/hooks", "/hooks/eu"):
        for kind in KINDS:
            for path in kind.paths:
                item = document["paths"][prefix + path]
                assert {m.lower() for m in kind.methods} <= set(item)
                for operation in item.values():
                    assert {"200", "400", "401", "403", "413", "422", "503"} <= set(
                        operation["responses"]
                    )
    inbound_get = document["paths"]["/hooks/sms/inbound"]["get"]
    names = {p["name"] for p in inbound_get["parameters"]}
    assert {"token", "from", "to", "message", "requestId", "contentList"} <= names
    eu_post = document["paths"]["/hooks/eu/conversations"]["post"]
    assert {"X-Key", "x-signature", "x-request-timestamp"} <= {
        p["name"] for p in eu_post["parameters"]
    }
    assert len(eu_post["requestBody"]["content"]["application/json"]["schema"]["oneOf"]) == 3


async def test_openapi_needs_no_credentials(client: httpx.AsyncClient) -> None:
    assert (await client.get("/openapi.json")).headers["content-type"] == "application/json"
