"""Destinations against real services: an HTTP sink served by uvicorn, and Redis (db 14)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from arq.connections import ArqRedis, RedisSettings, create_pool
from pydantic import ValidationError
from redis.asyncio import Redis
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from receivers.store.tables import ReceivedEvent
from relay.destinations import (
    ArqDestination,
    ArqDestinationConfig,
    Destination,
    HttpDestination,
    HttpDestinationConfig,
    Outbound,
    RedisStreamDestination,
    RedisStreamDestinationConfig,
    Signer,
    build_destination,
    envelope,
    envelope_bytes,
    generate_secret,
    new_http_client,
    parse_destination_config,
    parse_retry_after,
    render,
)
from tests.conftest import REDIS_URL
from tests.support import Answer, Sink, free_port

RECEIVED_AT = datetime(2024, 5, 1, 12, 30, 15, 250000, tzinfo=UTC)
PAYLOAD = {"messageId": "m-1", "event": "MessageStatus::delivered", "channel": "WhatsApp"}
LONE_SURROGATE_PAYLOAD = {"message": "hi \ud83d", "to": "+4917398603185"}
"""A concatenated SMS with a missing part may end in half of a surrogate pair."""


EVENT_ID = "0190f0a8-1111-7000-8000-000000000001"


def outbound(**changes: Any) -> Outbound:
    """A Conversations status event to deliver, with ``changes``."""
    values: dict[str, Any] = {
        "event_id": EVENT_ID,
        "kind": "conversations.status",
        "source": "default",
        "received_at": RECEIVED_AT,
        "payload": PAYLOAD,
        "raw_body": json.dumps(PAYLOAD).encode(),
        "content_type": "application/json; charset=utf-8",
        "method": "POST",
        "attempt": 1,
    }
    values.update(changes)
    return Outbound(**values)


def http_destination(sink: Sink, path: str = "/hook", **options: Any) -> HttpDestination:
    config = HttpDestinationConfig(type="http", url=sink.url(path), **options)
    return HttpDestination("sink", config)


@pytest.fixture
def secrets() -> Iterator[list[str]]:
    yield [generate_secret(), generate_secret()]


# --- HTTP: bodies and headers -------------------------------------------------------------------


async def test_envelope_body_and_headers(sink: Sink) -> None:
    destination = http_destination(sink, headers={"Authorization": "Bearer internal"})
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert outcome.ok and outcome.status_code == 200 and outcome.error is None
    assert outcome.response_excerpt == "thanks"
    assert outcome.duration_ms > 0
    [request] = sink.requests
    assert request.method == "POST" and request.path == "/hook"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"] == "callback-relay"
    assert request.headers["authorization"] == "Bearer internal"
    assert "webhook-signature" not in request.headers  # no secret configured
    assert request.body == envelope_bytes(outbound())
    assert json.loads(request.body) == {
        "id": "0190f0a8-1111-7000-8000-000000000001",
        "kind": "conversations.status",
        "source": "default",
        "received_at": "2024-05-01T12:30:15.250000Z",
        "payload": PAYLOAD,
    }


async def test_raw_body_keeps_the_platform_body_and_content_type(sink: Sink) -> None:
    destination = http_destination(sink, format="raw")
    event = outbound(raw_body=b'{"event": "MessageStatus::delivered"}')
    try:
        outcome = await destination.deliver(event, timeout=5)
    finally:
        await destination.aclose()

    assert outcome.ok
    [request] = sink.requests
    assert request.body == b'{"event": "MessageStatus::delivered"}'
    assert request.headers["content-type"] == "application/json; charset=utf-8"


async def test_raw_body_of_a_get_callback_is_its_query_string_form_encoded(sink: Sink) -> None:
    destination = http_destination(sink, format="raw")
    event = outbound(
        kind="sms.dlr",
        method="get",
        raw_body=b"requestId=r-1&status=DELIVERED",
        content_type=None,
        payload={"requestId": "r-1", "status": "DELIVERED"},
    )
    try:
        outcome = await destination.deliver(event, timeout=5)
    finally:
        await destination.aclose()

    assert outcome.ok
    [request] = sink.requests
    assert request.method == "POST"
    assert request.body == b"requestId=r-1&status=DELIVERED"
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"


async def test_webhook_id_is_stable_across_attempts(sink: Sink) -> None:
    destination = http_destination(sink)
    try:
        first = await destination.deliver(outbound(attempt=1), timeout=5)
        second = await destination.deliver(outbound(attempt=2), timeout=5)
    finally:
        await destination.aclose()

    assert first.ok and second.ok
    ids = [request.headers["webhook-id"] for request in sink.requests]
    assert ids == ["0190f0a8-1111-7000-8000-000000000001"] * 2
    for request in sink.requests:
        assert abs(int(request.headers["webhook-timestamp"]) - datetime.now(UTC).timestamp()) < 60


@pytest.mark.slow
@pytest.mark.parametrize("body_format", ["envelope", "raw"])
async def test_signature_verifies_with_each_rotated_secret(
    sink: Sink, secrets: list[str], body_format: str
) -> None:
    destination = http_destination(sink, secret=secrets, format=body_format)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert outcome.ok
    [request] = sink.requests
    signatures = request.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2 and all(sig.startswith("v1,") for sig in signatures)
    for secret in secrets:
        assert Webhook(secret).verify(request.body, request.headers) == json.loads(request.body)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(request.body, request.headers)
    tampered = request.body.replace(b"delivered", b"failed")
    with pytest.raises(WebhookVerificationError):
        Webhook(secrets[0]).verify(tampered, request.headers)


async def test_signature_of_a_form_body(sink: Sink, secrets: list[str]) -> None:
    destination = http_destination(sink, secret=secrets[0], format="raw")
    event = outbound(method="GET", raw_body=b"requestId=r-1&text=h%C3%A9", content_type=None)
    try:
        await destination.deliver(event, timeout=5)
    finally:
        await destination.aclose()

    [request] = sink.requests
    # verify() JSON-parses the body unless told not to
    assert Webhook(secrets[0]).verify(request.body, request.headers, json_parse=False) is None


async def test_text_utf8_cannot_encode_is_sent_as_json_escapes_and_signed(
    sink: Sink, secrets: list[str]
) -> None:
    destination = http_destination(sink, secret=secrets)
    try:
        outcome = await destination.deliver(outbound(payload=LONE_SURROGATE_PAYLOAD), timeout=5)
    finally:
        await destination.aclose()

    assert outcome.ok
    [request] = sink.requests
    assert b"\\ud83d" in request.body
    for secret in secrets:
        verified = Webhook(secret).verify(request.body, request.headers)
        assert verified["payload"] == LONE_SURROGATE_PAYLOAD


# --- HTTP: answers ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("status", [200, 201, 202, 204])
async def test_2xx_is_success(sink: Sink, status: int) -> None:
    sink.answers["/hook"] = Answer(status=status, body=b"" if status == 204 else b"ok")
    destination = http_destination(sink)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert outcome.ok and outcome.status_code == status and outcome.error is None
    assert not outcome.gone and outcome.retry_after is None


async def test_redirect_is_a_failure_and_not_followed(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(status=302, headers={"location": sink.url("/elsewhere")})
    client = httpx.AsyncClient(follow_redirects=True)  # even a shared client that would follow
    destination = HttpDestination(
        "sink", HttpDestinationConfig(type="http", url=sink.url()), client=client
    )
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
        await destination.aclose()
        assert not client.is_closed  # a shared client belongs to its maker
    finally:
        await client.aclose()

    assert not outcome.ok and outcome.status_code == 302
    assert outcome.error == "HTTP 302 Found (redirects are not followed)"
    assert [request.path for request in sink.requests] == ["/hook"]


async def test_410_means_gone(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(status=410, body=b"unsubscribed")
    destination = http_destination(sink)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.gone and outcome.status_code == 410
    assert outcome.response_excerpt == "unsubscribed"


@pytest.mark.slow
@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("style", ["seconds", "http-date"])
async def test_retry_after(sink: Sink, status: int, style: str) -> None:
    if style == "seconds":
        value = "120"
    else:
        value = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    sink.answers["/hook"] = Answer(status=status, headers={"retry-after": value})
    destination = http_destination(sink)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.status_code == status and not outcome.gone
    assert outcome.retry_after is not None
    assert timedelta(seconds=115) <= outcome.retry_after <= timedelta(seconds=120)


async def test_garbage_retry_after_is_ignored(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(status=429, headers={"retry-after": "soon-ish"})
    destination = http_destination(sink)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.status_code == 429 and outcome.retry_after is None


def test_parse_retry_after() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after("0") == timedelta(0)
    assert parse_retry_after(" 30 ") == timedelta(seconds=30)
    assert parse_retry_after("Wed, 01 May 2024 12:01:00 GMT", now=now) == timedelta(seconds=60)
    assert parse_retry_after("Wed, 01 May 2024 11:00:00 GMT", now=now) == timedelta(0)
    for garbage in (None, "", "-5", "1.5", "9" * 11, "tomorrow", "Wed, 99 May 2024", "x" * 10_000):
        assert parse_retry_after(garbage, now=now) is None


async def test_500_is_a_failure_with_a_1kib_excerpt(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(status=500, body=b"e" * 5000)
    destination = http_destination(sink)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.status_code == 500 and not outcome.gone
    assert outcome.error == "HTTP 500 Internal Server Error"
    assert outcome.response_excerpt == "e" * 1024
    assert outcome.retry_after is None


async def test_excerpt_decodes_leniently(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(status=400, body=b"bad \xff input")
    destination = http_destination(sink)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert outcome.response_excerpt == "bad \ufffd input"


@pytest.mark.slow
async def test_timeout(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(delay=1.0)
    destination = http_destination(sink)
    try:
        outcome = await destination.deliver(outbound(), timeout=0.2)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.status_code is None
    assert outcome.error == "timeout after 0.2s"
    assert 150 <= outcome.duration_ms < 900


async def test_connection_refused() -> None:
    config = HttpDestinationConfig(type="http", url=f"http://127.0.0.1:{free_port()}/hook")
    destination = HttpDestination("nowhere", config)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.status_code is None
    assert outcome.error == "connection refused"


async def test_shared_client_pools_and_keeps_no_cookies(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(headers={"set-cookie": "session=abc; Path=/"})
    client = new_http_client()
    first = build_destination("one", parse_destination_config(_http(sink)), http_client=client)
    second = build_destination("two", parse_destination_config(_http(sink)), http_client=client)
    try:
        assert (await first.deliver(outbound(), timeout=5)).ok
        assert (await second.deliver(outbound(), timeout=5)).ok
    finally:
        await first.aclose()
        await second.aclose()
        assert not client.is_closed
        await client.aclose()

    assert len(sink.requests) == 2
    assert "cookie" not in sink.requests[1].headers


def _http(sink: Sink) -> dict[str, Any]:
    return {"type": "http", "url": sink.url()}


# --- Redis --------------------------------------------------------------------------------------


async def test_redis_stream_xadd_fields(redis: Redis) -> None:
    config = RedisStreamDestinationConfig(type="redis-stream", url=REDIS_URL, stream="events")
    destination = RedisStreamDestination("stream", config)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert outcome.ok and outcome.error is None and outcome.status_code is None
    [(_, fields)] = await redis.xrange("events")
    assert fields == {
        b"id": b"0190f0a8-1111-7000-8000-000000000001",
        b"kind": b"conversations.status",
        b"source": b"default",
        b"received_at": b"2024-05-01T12:30:15.250000Z",
        b"body": envelope_bytes(outbound()),
        b"content_type": b"application/json",
    }


async def test_redis_stream_raw_format(redis: Redis) -> None:
    config = RedisStreamDestinationConfig(
        type="redis-stream", url=REDIS_URL, stream="raw", format="raw"
    )
    destination = RedisStreamDestination("stream", config)
    event = outbound(method="GET", raw_body=b"a=1&b=2", content_type=None)
    try:
        assert (await destination.deliver(event, timeout=5)).ok
    finally:
        await destination.aclose()

    [(_, fields)] = await redis.xrange("raw")
    assert fields[b"body"] == b"a=1&b=2"
    assert fields[b"content_type"] == b"application/x-www-form-urlencoded"


async def test_redis_stream_relays_text_utf8_cannot_encode(redis: Redis) -> None:
    config = RedisStreamDestinationConfig(type="redis-stream", url=REDIS_URL, stream="events")
    destination = RedisStreamDestination("stream", config)
    try:
        assert (await destination.deliver(outbound(payload=LONE_SURROGATE_PAYLOAD), timeout=5)).ok
    finally:
        await destination.aclose()

    [(_, fields)] = await redis.xrange("events")
    assert json.loads(fields[b"body"])["payload"] == LONE_SURROGATE_PAYLOAD


async def test_redis_stream_is_trimmed_approximately(redis: Redis) -> None:
    config = RedisStreamDestinationConfig(
        type="redis-stream", url=REDIS_URL, stream="capped", maxlen=10
    )
    destination = RedisStreamDestination("stream", config)
    try:
        for number in range(500):
            outcome = await destination.deliver(outbound(event_id=f"e-{number}"), timeout=5)
            assert outcome.ok
    finally:
        await destination.aclose()

    length = await redis.xlen("capped")
    assert 10 <= length < 500  # "~": whole macro nodes are trimmed, so usually a bit over 10
    [(_, last)] = await redis.xrevrange("capped", count=1)
    assert last[b"id"] == b"e-499"


async def test_redis_stream_connection_refused() -> None:
    url = f"redis://127.0.0.1:{free_port()}/14"
    config = RedisStreamDestinationConfig(type="redis-stream", url=url, stream="events")
    destination = RedisStreamDestination("stream", config)
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.error == "connection refused"


# --- arq ----------------------------------------------------------------------------------------


@pytest.fixture
async def arq_pool(redis: Redis) -> AsyncIterator[ArqRedis]:
    pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    yield pool
    await pool.aclose()


async def test_arq_enqueues_once_per_event(arq_pool: ArqRedis) -> None:
    config = ArqDestinationConfig(
        type="arq", url=REDIS_URL, function="handle_event", queue_name="relay:test"
    )
    destination = ArqDestination("jobs", config)
    try:
        first = await destination.deliver(outbound(), timeout=5)
        second = await destination.deliver(outbound(attempt=2), timeout=5)
    finally:
        await destination.aclose()

    assert first.ok and second.ok  # the second is deduplicated by job id
    [job] = await arq_pool.queued_jobs(queue_name="relay:test")
    assert job.function == "handle_event"
    assert job.job_id == "0190f0a8-1111-7000-8000-000000000001"
    assert job.args == (envelope(outbound()),)
    assert await arq_pool.queued_jobs() == []  # not on the default queue


async def test_arq_job_id_prefix(arq_pool: ArqRedis) -> None:
    config = ArqDestinationConfig(
        type="arq", url=REDIS_URL, function="f", queue_name="q", job_id_prefix="audit:"
    )
    destination = ArqDestination("jobs", config)
    try:
        assert (await destination.deliver(outbound(), timeout=5)).ok
    finally:
        await destination.aclose()

    [job] = await arq_pool.queued_jobs(queue_name="q")
    assert job.job_id == "audit:0190f0a8-1111-7000-8000-000000000001"


async def test_arq_relays_text_utf8_cannot_encode(arq_pool: ArqRedis) -> None:
    config = ArqDestinationConfig(type="arq", url=REDIS_URL, function="f", queue_name="q")
    destination = ArqDestination("jobs", config)
    try:
        assert (await destination.deliver(outbound(payload=LONE_SURROGATE_PAYLOAD), timeout=5)).ok
    finally:
        await destination.aclose()

    [job] = await arq_pool.queued_jobs(queue_name="q")
    assert job.args[0]["payload"] == LONE_SURROGATE_PAYLOAD


async def test_arq_connection_refused() -> None:
    url = f"redis://127.0.0.1:{free_port()}/14"
    destination = ArqDestination("jobs", ArqDestinationConfig(type="arq", url=url, function="f"))
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()

    assert not outcome.ok and outcome.error == "connection refused"
    assert outcome.duration_ms < 2000  # arq's own connection retries are off


# --- building and configuring -------------------------------------------------------------------


async def test_build_destination_by_type() -> None:
    built = [
        build_destination("h", parse_destination_config({"type": "http", "url": "https://a.b/"})),
        build_destination(
            "s",
            parse_destination_config({"type": "redis-stream", "url": REDIS_URL, "stream": "s"}),
        ),
        build_destination(
            "a", parse_destination_config({"type": "arq", "url": REDIS_URL, "function": "f"})
        ),
    ]
    assert [type(destination) for destination in built] == [
        HttpDestination,
        RedisStreamDestination,
        ArqDestination,
    ]
    for destination in built:
        assert isinstance(destination, Destination)
        await destination.aclose()


def test_config_defaults() -> None:
    config = parse_destination_config({"type": "http", "url": "https://hooks.example/in"})
    assert isinstance(config, HttpDestinationConfig)
    assert config.kinds == ["*"] and config.policy == "platform" and config.format == "envelope"
    assert config.timeout == timedelta(seconds=5) and config.timeout_seconds == 5.0
    assert config.secret == [] and config.headers == {}
    stream = parse_destination_config({"type": "redis-stream", "url": REDIS_URL, "stream": "s"})
    assert isinstance(stream, RedisStreamDestinationConfig) and stream.maxlen == 100_000
    arq = parse_destination_config({"type": "arq", "url": REDIS_URL, "function": "f"})
    assert isinstance(arq, ArqDestinationConfig) and arq.queue_name == "arq:queue"
    timed = parse_destination_config({"type": "http", "url": "https://a.b/", "timeout": "250ms"})
    assert timed.timeout_seconds == 0.25


def test_one_secret_or_several() -> None:
    secret = generate_secret()
    one = parse_destination_config({"type": "http", "url": "https://a.b/", "secret": secret})
    assert isinstance(one, HttpDestinationConfig)
    assert [item.get_secret_value() for item in one.secret] == [secret]
    assert secret not in repr(one)


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_destination_config(data)
    return "\n".join(
        error["msg"] for error in caught.value.errors(include_input=False, include_url=False)
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"type": "smtp", "url": "x"},
            "type 'smtp' is not a destination type (known: http, redis-stream, arq, amqp, nats, "
            "mqtt)",
        ),
        ({"url": "https://a.b/"}, "type is missing: one of http, redis-stream, arq"),
        ({"type": "http", "url": "ftp://a.b/"}, "must be an http:// or https:// URL"),
        ({"type": "http", "url": "https:///path"}, "must name a host"),
        ({"type": "http", "url": "https://a.b/", "extra": 1}, "Extra inputs are not permitted"),
        ({"type": "http", "url": "https://a.b/", "format": "xml"}, "'envelope' or 'raw'"),
        ({"type": "http", "url": "https://a.b/", "secret": "s3cret"}, 'start with "whsec_"'),
        ({"type": "http", "url": "https://a.b/", "secret": "whsec_!!"}, "followed by base64"),
        ({"type": "http", "url": "https://a.b/", "secret": "whsec_c2hvcnQ="}, "at least 24"),
        (
            {"type": "http", "url": "https://a.b/", "headers": {"Webhook-Signature": "x"}},
            "is set by the relay",
        ),
        ({"type": "http", "url": "https://a.b/", "headers": {"a b": "x"}}, "not a valid HTTP"),
        ({"type": "http", "url": "https://a.b/", "headers": {"x-a": "1\r\n2"}}, "one line"),
        ({"type": "http", "url": "https://a.b/", "kinds": []}, "kinds cannot be empty"),
        ({"type": "http", "url": "https://a.b/", "kinds": ["smss.*"]}, "matches no kind"),
        ({"type": "http", "url": "https://a.b/", "events": []}, "cannot be empty"),
        ({"type": "http", "url": "https://a.b/", "timeout": "0s"}, "more than zero"),
        ({"type": "http", "url": "https://a.b/", "timeout": "soon"}, "not a duration"),
        ({"type": "http", "url": "https://a.b/", "timeout": float("inf")}, "cannot exceed 3650"),
        ({"type": "http", "url": "https://a.b/", "timeout": 1e300}, "cannot exceed 3650 days"),
        ({"type": "http", "url": "https://a.b/", "timeout": "1000000d"}, "cannot exceed 3650"),
        ({"type": "redis-stream", "url": "http://a.b/", "stream": "s"}, "redis://"),
        ({"type": "redis-stream", "url": "redis://a/x", "stream": "s"}, "database number"),
        ({"type": "redis-stream", "url": REDIS_URL, "stream": ""}, "at least 1 character"),
        ({"type": "redis-stream", "url": REDIS_URL, "stream": "s", "maxlen": 0}, "greater than 0"),
        ({"type": "arq", "url": "https://a.b/", "function": "f"}, "redis://"),
        ({"type": "arq", "url": REDIS_URL}, "Field required"),
    ],
)
def test_config_validation(data: dict[str, Any], message: str) -> None:
    assert message in _error(data)


def test_validation_errors_do_not_echo_secrets() -> None:
    secret = "whsec_" + "A" * 8
    with pytest.raises(ValidationError) as caught:
        parse_destination_config({"type": "http", "url": "https://a.b/", "secret": [secret]})
    messages = caught.value.errors(include_input=False, include_url=False)
    assert secret not in json.dumps(messages, default=str)


# --- filters ------------------------------------------------------------------------------------


def _filters(**filters: Any) -> HttpDestinationConfig:
    config = parse_destination_config({"type": "http", "url": "https://a.b/", **filters})
    assert isinstance(config, HttpDestinationConfig)
    return config


def test_wants_everything_by_default() -> None:
    config = _filters()
    assert config.wants("sms.dlr", "default", {})
    assert config.wants("conversations.status", "acme", PAYLOAD)


def test_wants_kind_globs() -> None:
    config = _filters(kinds=["sms.*", "tts.event"])
    assert config.wants("sms.inbound", "default", {})
    assert config.wants("sms.dlr", "default", {})
    assert config.wants("tts.event", "default", {})
    assert not config.wants("conversations.status", "default", PAYLOAD)
    assert not config.wants("SMS.dlr", "default", {})  # kind names are exact lowercase


def test_wants_events_without_letter_case() -> None:
    config = _filters(kinds=["conversations.*"], events=["messagestatus::*", "MOMESSAGE"])
    assert config.wants("conversations.status", "default", PAYLOAD)
    assert config.wants("conversations.inbound", "default", {"event": "MoMessage"})
    assert not config.wants("conversations.event", "default", {"event": "Call::ringing"})
    assert not config.wants("conversations.event", "default", {})  # no event field: rejected
    assert not config.wants("conversations.event", "default", {"event": 7})


def test_wants_channels_without_letter_case() -> None:
    config = _filters(channels=["whatsapp", "SMS"])
    assert config.wants("conversations.status", "default", PAYLOAD)  # "WhatsApp"
    assert config.wants("conversations.inbound", "default", {"event": "x", "channel": "sms"})
    assert not config.wants("conversations.inbound", "default", {"channel": "viber"})
    assert not config.wants("sms.dlr", "default", {"status": "DELIVERED"})  # no channel field


def test_wants_sources() -> None:
    config = _filters(sources=["acme", "globex"])
    assert config.wants("sms.dlr", "acme", {})
    assert config.wants("sms.dlr", "globex", {})
    assert not config.wants("sms.dlr", "default", {})
    assert not config.wants("sms.dlr", "ACME", {})  # source names are exact


def test_filters_combine() -> None:
    config = _filters(kinds=["conversations.status"], sources=["acme"], channels=["whatsapp"])
    assert config.wants("conversations.status", "acme", PAYLOAD)
    assert not config.wants("conversations.status", "other", PAYLOAD)
    assert not config.wants("conversations.inbound", "acme", PAYLOAD)


# --- the outbound form --------------------------------------------------------------------------


def test_outbound_needs_an_aware_time_and_keeps_it_in_utc() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        outbound(received_at=datetime(2024, 5, 1, 12, 0))
    local = datetime(2024, 5, 1, 16, 30, tzinfo=timezone(timedelta(hours=2)))
    event = outbound(received_at=local)
    assert event.received_at.tzinfo is UTC
    assert envelope(event)["received_at"] == "2024-05-01T14:30:00.000000Z"


def test_envelope_bytes_are_compact_utf8() -> None:
    event = outbound(payload={"text": "héllo ✓"})
    data = envelope_bytes(event)
    assert b", " not in data and b": " not in data
    assert "héllo ✓".encode() in data


def test_envelope_bytes_escape_only_what_utf8_cannot_encode() -> None:
    payload = {"text": "héllo ✓ \ud83d", "emoji": "\U0001f600"}
    data = envelope_bytes(outbound(payload=payload))
    assert b"\\ud83d" in data  # the lone surrogate as a JSON escape ...
    assert json.loads(data.decode("utf-8"))["payload"] == payload  # ... parsed back losslessly


def test_outbound_from_a_stored_event() -> None:
    row = ReceivedEvent(
        id="e-1",
        source="default",
        kind="sms.dlr",
        dedup_key="r-1|delivered",
        received_at=RECEIVED_AT,
        payload={"requestId": "r-1"},
        raw_body=b"requestId=r-1",
        content_type=None,
        method="GET",
    )
    event = Outbound.from_event(row, attempt=3)
    assert (event.event_id, event.kind, event.source, event.attempt) == (
        "e-1",
        "sms.dlr",
        "default",
        3,
    )
    assert event.raw_body == b"requestId=r-1" and event.method == "GET"
    assert render(event, "raw") == (b"requestId=r-1", "application/x-www-form-urlencoded")


def test_a_body_that_is_not_utf8_is_signed_over_its_bytes(secrets: list[str]) -> None:
    body = b"text=caf\xe9"
    signer = Signer(secrets)
    signatures = signer.signature("e-1", 1714566615, body).split(" ")
    for secret, signature in zip(secrets, signatures, strict=True):
        key = base64.b64decode(secret.removeprefix("whsec_"))
        digest = hmac.new(key, b"e-1.1714566615." + body, hashlib.sha256).digest()
        assert signature == "v1," + base64.b64encode(digest).decode()
    # the same scheme as standardwebhooks for text bodies
    text_signature = signer.signature("e-1", 1714566615, b"{}").split(" ")[0]
    moment = datetime.fromtimestamp(1714566615, UTC)
    assert text_signature == Webhook(secrets[0]).sign("e-1", moment, "{}")
