"""The auth matrix: each mechanism missing, wrong and right; HMAC tampered and stale."""

from __future__ import annotations

import base64
import json
import logging
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from freezegun import freeze_time
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import HeaderCheck, SourceConfig
from receivers.auth import client_address, sign
from receivers.store import queries
from relay.simulator import factories
from tests.conftest import ClientFactory

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SECRET = "s3cr3t-hmac-key-for-tests"


def basic(credentials: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


def signed(
    body: bytes,
    *,
    secret: str = SECRET,
    at: datetime = NOW,
    method: str = "HS256",
    timestamp: str | None = None,
) -> dict[str, str]:
    stamp = timestamp if timestamp is not None else str(int(at.timestamp()))
    return {
        "x-request-timestamp": stamp,
        "x-signature": sign(secret, stamp, body, method),
        "x-signature-version": "V1.0",
        "content-type": "application/json",
    }


async def post(client: httpx.AsyncClient, path: str, **kwargs: object) -> int:
    return (await client.post(path, **kwargs)).status_code  # type: ignore[arg-type]


async def test_token(make_client: ClientFactory) -> None:
    async with make_client({"default": SourceConfig(token="tok-0123456789abcdef")}) as client:
        body = factories.sms_inbound()
        assert await post(client, "/hooks/sms/inbound", json=body) == 401
        assert await post(client, "/hooks/sms/inbound?token=tox-0123456789abcdef", json=body) == 401
        assert await post(client, "/hooks/sms/inbound?token=", json=body) == 401
        assert await post(client, "/hooks/sms/inbound?token=tok-0123456789abcdef", json=body) == 200


@pytest.mark.slow
async def test_token_rotation_accepts_every_listed_token(make_client: ClientFactory) -> None:
    async with make_client(
        {"default": SourceConfig(token=["old-0123456789abcdef", "new-0123456789abcdef"])}
    ) as client:
        assert (
            await post(
                client, "/hooks/sms/dlr?token=old-0123456789abcdef", json=factories.sms_dlr()
            )
            == 200
        )
        assert (
            await post(
                client, "/hooks/sms/dlr?token=new-0123456789abcdef", json=factories.sms_dlr()
            )
            == 200
        )
        assert (
            await post(
                client, "/hooks/sms/dlr?token=older-0123456789abcdef", json=factories.sms_dlr()
            )
            == 401
        )


@pytest.mark.slow
async def test_basic_auth(make_client: ClientFactory) -> None:
    async with make_client(
        {"default": SourceConfig(basic_auth="platform:pa:ss-0123456789abcdef")}
    ) as client:
        body = factories.numinfo_gnp()
        missing = await client.post("/hooks/numinfo/gnp", json=body)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Basic")
        assert (
            await post(client, "/hooks/numinfo/gnp", json=body, headers=basic("platform:wrong"))
            == 401
        )
        assert (
            await post(
                client,
                "/hooks/numinfo/gnp",
                json=body,
                headers={"authorization": "Basic !!notbase64"},
            )
            == 401
        )
        assert (
            await post(
                client,
                "/hooks/numinfo/gnp",
                json=body,
                headers={"authorization": "Bearer platform:pa:ss-0123456789abcdef"},
            )
            == 401
        )
        assert (
            await post(
                client,
                "/hooks/numinfo/gnp",
                json=body,
                headers=basic("platform:pa:ss-0123456789abcdef"),
            )
            == 200
        )


@pytest.mark.slow
async def test_custom_header(make_client: ClientFactory) -> None:
    source = SourceConfig(
        header=HeaderCheck(name="X-Callback-Key", value="hdr-value-0123456789abcdef")
    )
    async with make_client({"default": source}) as client:
        body = factories.conversations_status()
        assert await post(client, "/hooks/conversations", json=body) == 401
        assert (
            await post(
                client, "/hooks/conversations", json=body, headers={"x-callback-key": "other"}
            )
            == 401
        )
        assert (
            await post(
                client,
                "/hooks/conversations",
                json=body,
                headers={"X-Callback-Key": "hdr-value-0123456789abcdef"},
            )
            == 200
        )


@pytest.mark.slow
@pytest.mark.parametrize("method", ["HS256", "HS512"])
async def test_hmac_signature(make_client: ClientFactory, method: str) -> None:
    source = SourceConfig(signature_secret=SECRET, signature_method=method)
    body = json.dumps(factories.conversations_inbound()).encode()
    with freeze_time(NOW):
        async with make_client({"default": source}) as client:
            path = "/hooks/conversations"
            assert await post(client, path, content=body) == 401
            assert (
                await post(
                    client, path, content=body, headers=signed(body, secret="wrong", method=method)
                )
                == 401
            )
            tampered = body.replace(b'"messageId"', b'"messageID"')
            assert (
                await post(client, path, content=tampered, headers=signed(body, method=method))
                == 401
            )
            reserialized = json.dumps(json.loads(body), indent=2).encode()
            assert (
                await post(client, path, content=reserialized, headers=signed(body, method=method))
                == 401
            )
            other = "HS512" if method == "HS256" else "HS256"
            assert await post(client, path, content=body, headers=signed(body, method=other)) == 401
            assert (
                await post(client, path, content=body, headers=signed(body, method=method)) == 200
            )


@pytest.mark.slow
async def test_hmac_timestamp_window(make_client: ClientFactory) -> None:
    source = SourceConfig(signature_secret=SECRET)
    body = json.dumps(factories.conversations_status()).encode()
    with freeze_time(NOW):
        async with make_client({"default": source}) as client:
            stale = signed(body, at=NOW - timedelta(minutes=6))
            future = signed(body, at=NOW + timedelta(minutes=6))
            garbage = signed(body, timestamp="yesterday")
            millis = signed(body, timestamp=str(int(NOW.timestamp() * 1000) - 60_000))
            iso = signed(body, timestamp=(NOW - timedelta(minutes=4)).isoformat())
            stale_answer = await client.post("/hooks/conversations", content=body, headers=stale)
            assert stale_answer.status_code == 401
            assert stale_answer.json()["type"].endswith("stale-signature")
            assert await post(client, "/hooks/conversations", content=body, headers=future) == 401
            assert await post(client, "/hooks/conversations", content=body, headers=garbage) == 401
            assert await post(client, "/hooks/conversations", content=body, headers=millis) == 200
            assert await post(client, "/hooks/conversations", content=body, headers=iso) == 200


async def test_hmac_signature_padding_and_version(make_client: ClientFactory) -> None:
    source = SourceConfig(signature_secret=SECRET)
    body = json.dumps(factories.conversations_status()).encode()
    with freeze_time(NOW):
        async with make_client({"default": source}) as client:
            headers = signed(body)
            padded = dict(headers, **{"x-signature": headers["x-signature"] + "="})
            assert await post(client, "/hooks/conversations", content=body, headers=padded) == 200
            unknown_version = dict(headers, **{"x-signature-version": "V9"})
            assert (
                await post(client, "/hooks/conversations", content=body, headers=unknown_version)
                == 401
            )


@pytest.mark.slow
async def test_ip_allowlist_and_forwarded_for(make_client: ClientFactory) -> None:
    source = SourceConfig(allow_ips=["203.0.113.0/24", "2001:db8::/32"])
    body = factories.sms_dlr
    async with make_client({"default": source}, client_ip="203.0.113.9") as allowed:
        assert await post(allowed, "/hooks/sms/dlr", json=body()) == 200
    async with make_client({"default": source}, client_ip="198.51.100.1") as spoofing:
        spoofed = {"x-forwarded-for": "203.0.113.9"}
        assert await post(spoofing, "/hooks/sms/dlr", json=body(), headers=spoofed) == 403
    async with make_client(
        {"default": source}, client_ip="10.0.0.2", trusted_proxies=("10.0.0.0/8",)
    ) as behind_proxy:
        chain = {"x-forwarded-for": "198.51.100.1, 203.0.113.9"}
        assert await post(behind_proxy, "/hooks/sms/dlr", json=body(), headers=chain) == 200
        forged = {"x-forwarded-for": "203.0.113.9, 198.51.100.1"}
        assert await post(behind_proxy, "/hooks/sms/dlr", json=body(), headers=forged) == 403
        assert await post(behind_proxy, "/hooks/sms/dlr", json=body()) == 403


def test_client_address_rules() -> None:
    from ipaddress import ip_address, ip_network

    proxies = [ip_network("10.0.0.0/8")]
    assert client_address("::ffff:203.0.113.9", None, proxies) == ip_address("203.0.113.9")
    assert client_address("10.1.1.1", "not-an-ip", proxies) == ip_address("10.1.1.1")
    assert client_address("10.1.1.1", "10.2.2.2", proxies) == ip_address("10.2.2.2")
    assert client_address(None, "203.0.113.9", proxies) is None


@pytest.mark.slow
async def test_every_configured_check_must_pass(make_client: ClientFactory) -> None:
    source = SourceConfig(
        token="tok-0123456789abcdef", basic_auth="u:p-0123456789abcdef", allow_ips=["127.0.0.0/8"]
    )
    async with make_client({"default": source}) as client:
        body = factories.tts_event
        assert (
            await post(client, "/hooks/tts/events?token=tok-0123456789abcdef", json=body()) == 401
        )
        assert (
            await post(
                client, "/hooks/tts/events", json=body(), headers=basic("u:p-0123456789abcdef")
            )
            == 401
        )
        assert (
            await post(
                client,
                "/hooks/tts/events?token=tok-0123456789abcdef",
                json=body(),
                headers=basic("u:p-0123456789abcdef"),
            )
            == 200
        )


@pytest.mark.slow
async def test_anonymous_source_accepts_anyone(make_client: ClientFactory) -> None:
    async with make_client({"default": SourceConfig(allow_anonymous=True)}) as client:
        assert await post(client, "/hooks/tts/events", json=factories.tts_event()) == 200


def test_source_without_any_check_is_refused() -> None:
    with pytest.raises(ValidationError, match="allow_anonymous"):
        SourceConfig()
    with pytest.raises(ValidationError, match="user:password"):
        SourceConfig(basic_auth="no-colon")


@pytest.mark.slow
async def test_secrets_never_reach_logs_or_the_store(
    make_client: ClientFactory, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    source = SourceConfig(
        token="tok-SECRET-1-0123456789",
        header=HeaderCheck(name="x-key", value="HDR-SECRET-0123456789"),
    )
    caplog.set_level(logging.DEBUG)
    async with make_client({"default": source}) as client:
        await client.post(
            "/hooks/sms/inbound?token=WRONG-SECRET",
            json=factories.sms_inbound(),
            headers={"x-key": "HDR-SECRET-0123456789"},
        )
        ok = await client.get(
            "/hooks/sms/inbound?token=tok-SECRET-1-0123456789&from=%2B1&to=%2B2&message=hi&requestId=r1",
            headers={"x-key": "HDR-SECRET-0123456789"},
        )
    assert ok.status_code == 200
    stored = await queries.get_event(engine, ok.json()["id"])
    assert stored is not None and b"SECRET" not in stored.raw_body
    assert "SECRET" not in json.dumps(stored.payload)
    ours = [r for r in caplog.records if r.name.split(".")[0] in ("receivers", "relay")]
    assert ours, "the refused callback is logged"
    assert all("SECRET" not in record.getMessage() for record in ours)
    assert "SECRET" not in repr(source)
