"""The ``nats`` destination against real NATS servers: the machine's (127.0.0.1:4222, with
JetStream) and private ``nats-server`` processes (without JetStream, with a password, or with
JetStream stopped and started again). Messages are read back with JetStream consumers."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StreamConfig
from pydantic import ValidationError
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from relay.destinations.errors import DestinationRefused
from relay.destinations.nats_config import NatsDestinationConfig
from relay.destinations.nats_jetstream import JETSTREAM_DISABLED, NatsDestination
from relay.destinations.outbound import envelope_bytes
from relay.destinations.outcome import Outcome
from relay.destinations.signing import generate_secret
from relay.outbox.tables import SUCCEEDED
from relay.server.runtime import start
from relay.settings import Settings
from relay.store import inspect
from scripts import broker_nats
from tests.conftest import REDIS_URL, TOKEN
from tests.nats_support import (
    NATS_URL,
    connect,
    connection_names,
    create_stream,
    own_stream,
    private_server,
    read_stream,
    shared_server,
    start_private_server,
    stream_count,
)
from tests.store_support import child_environment
from tests.support import free_port, pause_process, stop_process
from tests.test_destinations import EVENT_ID, outbound
from tests.test_relay_e2e import (
    all_succeeded,
    eventually,
    post_events,
    quick_settings,
    serving,
    worker_on,
)

SECRET = generate_secret()
PASSWORD = "pw-that-must-not-leak-5c1e"
CLI_TIMEOUT_S = 60


@pytest.fixture
async def nats_client() -> AsyncIterator[Client]:
    async with shared_server() as client:
        yield client


@pytest.fixture
def js(nats_client: Client) -> JetStreamContext:
    return nats_client.jetstream()


@pytest.fixture
async def stream(js: JetStreamContext) -> AsyncIterator[str]:
    """A stream of this test's own capturing ``NAME.>``: its name."""
    async with own_stream(js) as name:
        yield name


def nats_config(
    subject: str = "relay-test.{kind}", url: str = NATS_URL, **options: Any
) -> NatsDestinationConfig:
    return NatsDestinationConfig(type="nats", url=url, subject=subject, **options)


@asynccontextmanager
async def destination(config: NatsDestinationConfig) -> AsyncIterator[NatsDestination]:
    """A started destination, closed afterwards."""
    sender = NatsDestination("events", config)
    try:
        await sender.start()
        yield sender
    finally:
        await sender.aclose()


async def until(
    attempt: Callable[[], Awaitable[Outcome]], done: Callable[[Outcome], bool], timeout: float
) -> Outcome:
    """Attempt again until an outcome is ``done``; that outcome."""
    last: list[Outcome] = []

    async def check() -> bool:
        last[:] = [await attempt()]
        return done(last[0])

    await eventually(check, timeout=timeout)
    return last[0]


# --- publishing and reading back ----------------------------------------------------------------


@pytest.mark.parametrize("body_format", ["envelope", "raw"])
async def test_published_through_jetstream_with_headers_and_signature(
    js: JetStreamContext, stream: str, body_format: str
) -> None:
    config = nats_config(
        f"{stream}.{{kind}}.{{source}}.{{event}}", secret=SECRET, format=body_format
    )
    event = outbound()
    async with destination(config) as sender:
        outcome = await sender.deliver(event, timeout=5)

    assert outcome.ok and outcome.error is None and outcome.duration_ms > 0
    [message] = await read_stream(js, stream, 1)
    assert message.subject == f"{stream}.conversations.status.default.messagestatus__delivered"
    headers = message.headers or {}
    if body_format == "envelope":
        assert message.data == envelope_bytes(event)
        assert json.loads(message.data)["id"] == EVENT_ID
        assert headers["content-type"] == "application/json"
    else:
        assert message.data == event.raw_body
        assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers["webhook-id"] == EVENT_ID
    assert headers["Nats-Msg-Id"] == f"events:{EVENT_ID}"  # the destination's name, the event
    assert headers["kind"] == "conversations.status"
    assert headers["source"] == "default"
    assert headers["event"] == "messagestatus::delivered"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert Webhook(SECRET).verify(message.data, headers) == json.loads(message.data)


async def test_without_secret_there_is_no_signature(js: JetStreamContext, stream: str) -> None:
    async with destination(nats_config(f"{stream}.{{kind}}")) as sender:
        assert (await sender.deliver(outbound(), timeout=5)).ok
    [message] = await read_stream(js, stream, 1)
    assert "webhook-signature" not in (message.headers or {})


async def test_a_retried_publish_is_dropped_by_the_duplicate_window(
    js: JetStreamContext, stream: str
) -> None:
    """The stored first copy's ack was "lost": the retry is acked as a duplicate, not stored."""
    other_id = "0190f0a8-1111-7000-8000-000000000002"
    async with destination(nats_config(f"{stream}.{{kind}}")) as sender:
        first = await sender.deliver(outbound(), timeout=5)
        retried = await sender.deliver(outbound(attempt=2), timeout=5)
        other = await sender.deliver(outbound(event_id=other_id), timeout=5)

    assert first.ok and retried.ok and other.ok
    assert await stream_count(js, stream) == 2
    messages = await read_stream(js, stream, 2)
    assert [(m.headers or {})["webhook-id"] for m in messages] == [EVENT_ID, other_id]


async def test_two_destinations_publishing_into_one_stream_both_keep_their_message(
    js: JetStreamContext, stream: str
) -> None:
    """The duplicate window is per stream: were the event id alone the message id, the
    second destination's message would be acknowledged as a duplicate and dropped."""
    crm = NatsDestination("crm", nats_config(f"{stream}.crm.{{kind}}"))
    billing = NatsDestination("billing", nats_config(f"{stream}.billing.{{kind}}", format="raw"))
    try:
        outcomes = [await d.deliver(outbound(), timeout=5) for d in (crm, billing, crm)]
    finally:
        await crm.aclose()
        await billing.aclose()

    assert all(o.ok for o in outcomes)
    assert await stream_count(js, stream) == 2  # the retried crm publish was dropped
    messages = await read_stream(js, stream, 2)
    assert sorted(m.subject.split(".")[1] for m in messages) == ["billing", "crm"]


async def test_a_password_with_reserved_characters_is_given_percent_encoded(
    tmp_path: Path,
) -> None:
    password = "Nat$P@ss:w/rd#1%"
    encoded = "Nat%24P%40ss%3Aw%2Frd%231%25"
    store = str(tmp_path / "store")
    with private_server(
        tmp_path, "-js", "-sd", store, "--user", "relay", "--pass", password
    ) as url:
        where = url.removeprefix("nats://")
        client = Client()
        await client.connect(url, user="relay", password=password)
        js = client.jetstream()
        try:
            await js.add_stream(StreamConfig(name="PW", subjects=["pw.>"]))
            async with destination(
                nats_config("pw.{kind}", url=f"nats://relay:{encoded}@{where}")
            ) as sender:
                outcome = await sender.deliver(outbound(), timeout=5)
            assert outcome.ok, outcome.error
            assert await stream_count(js, "PW") == 1
        finally:
            await client.close()


async def test_concurrent_deliveries_each_arrive(js: JetStreamContext, stream: str) -> None:
    ids = [f"0190f0a8-2222-7000-8000-{n:012d}" for n in range(50)]
    async with destination(nats_config(f"{stream}.{{kind}}")) as sender:
        outcomes = await asyncio.gather(
            *(sender.deliver(outbound(event_id=i), timeout=5) for i in ids)
        )
    assert all(o.ok for o in outcomes)
    messages = await read_stream(js, stream, len(ids))
    assert sorted((m.headers or {})["webhook-id"] for m in messages) == ids


async def test_hostile_event_values_cannot_reach_another_subject(
    js: JetStreamContext, stream: str
) -> None:
    hostile = {"messageId": "m.*>", "event": "A.b > *$", "channel": "SMS"}
    event = outbound(payload=hostile, source="de\r\nfault.>", raw_body=b"{}")
    config = nats_config(f"{stream}.{{source}}.{{event}}.{{platform_id}}")
    async with destination(config) as sender:
        outcome = await sender.deliver(event, timeout=5)
    assert outcome.ok, outcome.error
    [message] = await read_stream(js, stream, 1)
    assert message.subject == f"{stream}.de__fault__.a_b_____.m___"
    headers = message.headers or {}
    assert headers["event"] == "a.b > *$" and headers["source"] == "de__fault.>"


async def test_one_connection_per_destination_also_after_a_restart(tmp_path: Path) -> None:
    """Concurrent deliveries share the destination's one connection; a restarted server sees
    that connection come back (nats-py reconnected it), and no second one."""
    port, monitor = free_port(), free_port()
    options = ("-js", "-sd", str(tmp_path / "store"), "-m", str(monitor))
    url = f"nats://127.0.0.1:{port}"
    ids = [f"0190f0a8-3333-7000-8000-{n:012d}" for n in range(50)]
    process = start_private_server(tmp_path, port, *options)
    try:
        client = await connect(url)
        try:
            name = await create_stream(client.jetstream())
        finally:
            await client.close()
        async with destination(nats_config(f"{name}.{{kind}}", url=url)) as sender:
            first = await asyncio.gather(
                *(sender.deliver(outbound(event_id=i), timeout=5) for i in ids[:25])
            )
            before = await asyncio.to_thread(connection_names, monitor)
            stop_process(process)
            process = start_private_server(tmp_path, port, *options)
            await until(
                lambda: sender.deliver(outbound(event_id=ids[25]), timeout=3),
                lambda o: o.ok,
                timeout=10,
            )
            second = await asyncio.gather(
                *(sender.deliver(outbound(event_id=i), timeout=5) for i in ids[26:])
            )
            after = await asyncio.to_thread(connection_names, monitor)
    finally:
        stop_process(process)
    assert all(o.ok for o in first + second)
    assert before == after == ["callback-relay:events"]


# --- what cannot succeed ------------------------------------------------------------------------


async def test_a_subject_no_stream_captures_is_a_failed_attempt(nats_client: Client) -> None:
    """Core NATS would take the message and drop it: JetStream says nobody keeps it."""
    root = f"relay-test-nostream-{uuid.uuid4().hex[:12]}"
    async with destination(nats_config(f"{root}.{{kind}}")) as sender:
        outcome = await sender.deliver(outbound(), timeout=5)
    assert not outcome.ok and not outcome.down  # this event's subject: not the server's down
    assert outcome.error == f"no JetStream stream captures subject '{root}.conversations.status'"


async def test_a_message_the_stream_refuses_is_a_failed_attempt_in_its_words(
    js: JetStreamContext,
) -> None:
    name = f"relay-test-{uuid.uuid4().hex[:12]}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"], max_msg_size=64))
    try:
        async with destination(nats_config(f"{name}.{{kind}}")) as sender:
            outcome = await sender.deliver(outbound(), timeout=5)
        assert await stream_count(js, name) == 0
    finally:
        await js.delete_stream(name)
    assert not outcome.ok and outcome.error is not None and not outcome.down
    assert outcome.error.startswith("JetStream refused the message: message size exceeds")


@pytest.mark.parametrize(
    ("limits", "words", "down"),
    [
        ({"max_msgs": 1}, "maximum messages exceeded", True),
        ({"max_bytes": 600}, "maximum bytes exceeded", True),
        (
            {"max_msgs_per_subject": 1, "discard_new_per_subject": True},
            "maximum messages per subject exceeded",
            False,  # a limit of one event's subject: that message's failure
        ),
    ],
)
async def test_a_full_stream_is_down_and_a_full_subject_is_that_messages_failure(
    js: JetStreamContext, limits: dict[str, Any], words: str, down: bool
) -> None:
    name = f"relay-test-{uuid.uuid4().hex[:12]}"
    config = StreamConfig(name=name, subjects=[f"{name}.>"], discard=DiscardPolicy.NEW, **limits)
    await js.add_stream(config)
    try:
        async with destination(nats_config(f"{name}.{{kind}}")) as sender:
            first = await sender.deliver(outbound(event_id="first"), timeout=5)
            second = await sender.deliver(outbound(event_id="second"), timeout=5)
    finally:
        await js.delete_stream(name)
    assert first.ok
    assert (second.ok, second.error, second.down) == (
        False,
        f"JetStream refused the message: {words} (error 10077)",
        down,
    )


async def test_a_server_that_does_not_answer_fails_the_attempt_at_its_timeout(
    tmp_path: Path,
) -> None:
    port = free_port()
    options = ("-js", "-sd", str(tmp_path / "store"))
    process = start_private_server(tmp_path, port, *options)
    url = f"nats://127.0.0.1:{port}"
    try:
        client = await connect(url)
        try:
            name = await create_stream(client.jetstream())
        finally:
            await client.close()
        async with destination(nats_config(f"{name}.{{kind}}", url=url)) as sender:
            pause_process(process)
            try:
                began = time.monotonic()
                outcome = await sender.deliver(outbound(), timeout=1)
                took = time.monotonic() - began
            finally:
                process.send_signal(signal.SIGCONT)
            recovered = await sender.deliver(outbound(attempt=2), timeout=5)
    finally:
        stop_process(process)
    assert (outcome.ok, outcome.error, outcome.down) == (False, "timeout after 1.0s", True)
    assert 0.9 < took < 3
    assert recovered.ok


async def test_a_wrong_password_is_a_failed_attempt_without_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with private_server(tmp_path, "--user", "relay", "--pass", "right-password") as url:
        where = url.removeprefix("nats://")
        wrong = NatsDestination("events", nats_config(url=f"nats://relay:{PASSWORD}@{where}"))
        try:
            await wrong.start()
            outcome = await wrong.deliver(outbound(), timeout=3)
        finally:
            await wrong.aclose()
        right = NatsDestination("events", nats_config(url=f"nats://relay:right-password@{where}"))
        try:
            with pytest.raises(DestinationRefused) as refused:  # in, but no JetStream there
                await right.start()
        finally:
            await right.aclose()

    assert not outcome.ok and outcome.error is not None and outcome.down
    assert "authorization" in outcome.error.lower()
    assert PASSWORD not in outcome.error and PASSWORD not in caplog.text
    assert "right-password" not in str(refused.value) and "right-password" not in caplog.text


async def test_a_server_without_jetstream_is_refused_at_start(tmp_path: Path) -> None:
    with private_server(tmp_path) as url:  # no -js
        sender = NatsDestination("events", nats_config(url=url))
        try:
            with pytest.raises(DestinationRefused) as refused:
                await sender.start()
        finally:
            await sender.aclose()
    reason = str(refused.value)
    assert f"the NATS server at {url} has JetStream disabled" in reason
    assert "no acknowledgement" in reason and "-js" in reason and "stream" in reason


async def test_a_server_found_later_without_jetstream_fails_each_attempt_with_the_reason(
    tmp_path: Path,
) -> None:
    """Down at start (no error), then a server without JetStream comes up on that port: the
    connection made in the background finds it, and each attempt says what is wrong."""
    port = free_port()
    sender = NatsDestination("events", nats_config(url=f"nats://127.0.0.1:{port}"))
    try:
        await sender.start()
        assert (await sender.deliver(outbound(), timeout=2)).error == "connection refused"
        with private_server(tmp_path, port=port):
            outcome = await until(
                lambda: sender.deliver(outbound(), timeout=2),
                lambda o: o.error != "connection refused",
                timeout=10,
            )
    finally:
        await sender.aclose()
    assert not outcome.ok and outcome.error == JETSTREAM_DISABLED and outcome.down


async def test_a_server_that_goes_away_and_comes_back_needs_no_restart(tmp_path: Path) -> None:
    """Attempts fail at once while it is down (nothing waits in the client's buffer), and the
    same destination delivers again once the server is back (nats-py reconnected)."""
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    server = broker_nats.start_server(tmp_path, port)
    try:
        client = await connect(url)
        try:
            name = await create_stream(client.jetstream())
        finally:
            await client.close()
        async with destination(nats_config(f"{name}.{{kind}}", url=url)) as sender:
            assert (await sender.deliver(outbound(event_id="before"), timeout=3)).ok
            broker_nats.stop_server(server)
            began = time.monotonic()
            down = await sender.deliver(outbound(event_id="during"), timeout=3)
            assert time.monotonic() - began < 1
            server = broker_nats.start_server(tmp_path, port)
            back = await until(
                lambda: sender.deliver(outbound(event_id="during", attempt=2), timeout=3),
                lambda o: o.ok,
                timeout=10,
            )
        client = await connect(url)
        try:
            js = client.jetstream()
            messages = await read_stream(js, name, 2)
        finally:
            await client.close()
    finally:
        broker_nats.stop_server(server)
    assert not down.ok and down.error is not None
    assert back.ok
    assert [(m.headers or {})["webhook-id"] for m in messages] == ["before", "during"]


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"url": "http://127.0.0.1:4222"}, "url must start with nats:// or tls://"),
        ({"url": ""}, "url must start with"),
        ({"url": "nats://"}, "url must name a host"),
        ({"url": "nats://:4222"}, "url must name a host"),
        ({"url": "nats://127.0.0.1:42x"}, "invalid port"),
        ({"url": "nats://h:4222/?x=1"}, "cannot hold a query"),
        ({"url": "nats://a:4222/path"}, "cannot hold a path"),
        ({"url": "nats://a:4222,"}, "joined by single commas"),
        ({"url": "nats://a:4222,,nats://b:4222"}, "joined by single commas"),
        ({"url": "nats://a:4222, nats://b:4222"}, "cannot hold spaces"),
        ({"url": "nats://a:4222,tls://b:4222"}, "all nats:// or all tls://"),
        ({"url": "nats://u:p@a:4222,nats://u:q@b:4222"}, "the same user and password"),
        ({"url": "nats://u:p@a:4222,nats://b:4x"}, "invalid port"),
        ({"url": ",".join(["nats://a:4222"] * 33)}, "more than 32 servers"),
        ({"subject": ""}, "cannot be empty"),
        ({"subject": "a.*"}, "cannot hold '*'"),
        ({"subject": "a.>"}, "cannot hold '>'"),
        ({"subject": "a b"}, "cannot hold ' '"),
        ({"subject": "a..{kind}"}, "cannot start or end with '.'"),
        ({"subject": ".{kind}"}, "cannot start or end with '.'"),
        ({"subject": "a.{kind}."}, "cannot start or end with '.'"),
        ({"subject": "a\n{kind}"}, "control characters"),
        ({"subject": "a.{nope}"}, "is not a template field"),
        ({"subject": "a.{kind"}, "is not a valid template"),
        ({"subject": "a" * 1100}, "over the limit of 1024"),
    ],
)
def test_hostile_settings_are_refused(changes: dict[str, Any], message: str) -> None:
    data = {"type": "nats", "url": NATS_URL, "subject": "x.{kind}"} | changes
    with pytest.raises(ValidationError, match=message.replace("*", r"\*").replace(".", r"\.")):
        NatsDestinationConfig(**data)


def test_a_server_list_is_shown_without_credentials() -> None:
    config = nats_config(url=f"tls://relay:{PASSWORD}@a:4222,tls://b:4222")
    assert config.target() == "tls://a:4222,tls://b:4222 subject relay-test.{kind}"


async def test_the_servers_of_a_list_are_tried_in_turn(tmp_path: Path) -> None:
    """A cluster's seeds: the destination delivers through whichever of them answers."""
    down = f"nats://relay:{PASSWORD}@127.0.0.1:{free_port()}"
    with private_server(
        tmp_path, "-js", "-sd", str(tmp_path / "js"), "--user", "relay", "--pass", PASSWORD
    ) as url:
        client = await connect(url, user="relay", password=PASSWORD)
        try:
            stream = await create_stream(client.jetstream())
            up = url.replace("nats://", f"nats://relay:{PASSWORD}@", 1)
            for number, servers in enumerate((f"{down},{up}", f"{up},{down}")):
                event = outbound(event_id=f"seeds-{number}")
                async with destination(nats_config(f"{stream}.x", url=servers)) as sender:
                    outcome = await until(
                        partial(sender.deliver, event, timeout=2), lambda o: o.ok, 15
                    )
                assert outcome.ok and PASSWORD not in str(outcome)
            assert await stream_count(client.jetstream(), stream) == 2
        finally:
            await client.close()


# --- a relay worker -----------------------------------------------------------------------------


def nats_settings(database_url: str, url: str, subject: str, **extra: Any) -> Settings:
    """Relay settings with one ``nats`` destination (1 s timeout, retried every second)."""
    table = {"type": "nats", "url": url, "subject": subject, "secret": SECRET}
    return quick_settings(database_url, {"events": table}, first_retry="1s", then="1s", **extra)


@pytest.mark.slow
async def test_events_arrive_once_each_through_a_relay_worker(
    engine: AsyncEngine, database_url: str, redis: Redis, js: JetStreamContext, stream: str
) -> None:
    settings = nats_settings(
        database_url, NATS_URL, f"{stream}.{{kind}}.{{source}}", redis_url=REDIS_URL
    )
    runtime = await start(settings)
    async with serving(runtime) as client, worker_on(settings, engine):
        ids = await post_events(client, 10)
        await eventually(lambda: all_succeeded(engine, 10))
    messages = await read_stream(js, stream, 10)
    assert sorted((m.headers or {})["webhook-id"] for m in messages) == sorted(ids)
    assert await stream_count(js, stream) == 10
    for message in messages:
        headers = message.headers or {}
        verified = Webhook(SECRET).verify(message.data, headers)
        assert headers["Nats-Msg-Id"] == f"events:{verified['id']}"
        assert message.subject == f"{stream}.{headers['kind']}.default"


@pytest.mark.slow
async def test_server_stopped_and_started_again_loses_nothing(
    engine: AsyncEngine, database_url: str, redis: Redis, tmp_path: Path
) -> None:
    """nats-server (JetStream, its store on disk) is stopped with deliveries under way and
    started again on the same port and store: every event is in the stream once."""
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    server = broker_nats.start_server(tmp_path, port)
    try:
        client = await connect(url)
        try:
            name = await create_stream(client.jetstream())
        finally:
            await client.close()
        settings = nats_settings(database_url, url, f"{name}.{{kind}}", redis_url=REDIS_URL)
        runtime = await start(settings)
        async with serving(runtime) as receiver, worker_on(settings, engine):
            ids = await post_events(receiver, 10)
            await eventually(lambda: all_succeeded(engine, 10))
            broker_nats.stop_server(server)
            ids |= await post_events(receiver, 10)

            async def retried_while_down() -> bool:
                """Every new delivery failed twice: its first attempt and a retry."""
                rows = await inspect.list_deliveries(engine, limit=100)
                waiting = [r for r in rows if r["status"] != SUCCEEDED]
                return len(waiting) == 10 and all(
                    r["attempts"] >= 2 and "connection" in (r["last_error"] or "") for r in waiting
                )

            await eventually(retried_while_down)
            server = broker_nats.start_server(tmp_path, port)
            await eventually(lambda: all_succeeded(engine, 20))
        client = await connect(url)
        try:
            js = client.jetstream()
            messages = await read_stream(js, name, 20)
            count = await stream_count(js, name)
        finally:
            await client.close()
    finally:
        broker_nats.stop_server(server)
    assert count == 20
    assert sorted((m.headers or {})["webhook-id"] for m in messages) == sorted(ids)


async def run_relay(*args: str, cwd: Path) -> tuple[int, str]:
    """``python -m relay ARGS`` in a process of its own: its exit code and output."""
    env = {k: v for k, v in child_environment().items() if not k.startswith("RELAY_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "relay",
        *args,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(CLI_TIMEOUT_S):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


@pytest.mark.slow
async def test_relay_worker_and_serve_refuse_a_server_without_jetstream(
    tmp_path: Path, redis: Redis
) -> None:
    with private_server(tmp_path) as url:
        where = url.removeprefix("nats://")
        table = (
            f'[sources.default]\ntoken = "{TOKEN}"\n'
            f'[destinations.events]\ntype = "nats"\nsubject = "x.{{kind}}"\n'
            f'url = "nats://relay:{PASSWORD}@{where}"\n'
        )
        worker_config = tmp_path / "worker.toml"
        worker_config.write_text(
            f'database_url = "sqlite:///{tmp_path / "w.db"}"\nredis_url = "{REDIS_URL}"\n' + table
        )
        serve_config = tmp_path / "serve.toml"  # embedded mode: the worker runs in serve
        serve_config.write_text(f'database_url = "sqlite:///{tmp_path / "s.db"}"\n' + table)
        worker = await run_relay("worker", "--config", str(worker_config), cwd=tmp_path)
        serve = await run_relay(
            "serve", "--config", str(serve_config), "--port", str(free_port()), cwd=tmp_path
        )

    reason = f"destination 'events': the NATS server at {url} has JetStream disabled"
    code, output = worker
    assert code == 1, output
    assert f"Error: {reason}" in output and "Traceback" not in output
    code, output = serve
    assert code == 1, output  # the server's own start-up report, then the same one line
    assert f"Error: {reason}" in output
    assert "Traceback" not in output and "startup failed" not in output
    assert output.count(reason) == 1
    for _, output in (worker, serve):
        assert PASSWORD not in output


# --- the bench/chaos kit ------------------------------------------------------------------------


async def test_kit_prepares_publishes_consumes_and_cleans_up(nats_client: Client) -> None:
    name = f"relay-kit-{uuid.uuid4().hex[:12]}"
    table = broker_nats.destination(NATS_URL, name)
    config = NatsDestinationConfig(**table)
    assert config.format == "envelope" and config.subject == f"{name}.{{kind}}.{{source}}"
    messages = [
        (f"id-{n}", b"{}", {"webhook-id": f"id-{n}", "kind": "sms.dlr", "source": "default"})
        for n in range(40)
    ]
    await broker_nats.prepare(NATS_URL, name)
    try:
        consumer = asyncio.create_task(broker_nats.consume(NATS_URL, name, 41, 5.0))
        confirmed = await broker_nats.publish(NATS_URL, name, messages, 8)
        again = await broker_nats.publish(NATS_URL, name, messages[:1], 1)  # a duplicate id
        sender = NatsDestination("events", config)
        try:
            relayed = await sender.deliver(outbound(event_id="id-relayed"), timeout=5)
        finally:
            await sender.aclose()
        received = await consumer
        js = nats_client.jetstream()
        assert await stream_count(js, name) == 41
        await broker_nats.prepare(NATS_URL, name)  # again: empty
        assert await stream_count(js, name) == 0
    finally:
        await broker_nats.cleanup(NATS_URL, name)
    assert len(confirmed) == 40 and len(again) == 1 and relayed.ok
    assert all(time.time() - t < 60 for t in confirmed)
    assert sorted(i for i, _ in received) == sorted([m[0] for m in messages] + ["id-relayed"])
    assert [t for _, t in received] == sorted(t for _, t in received)
    assert name not in [s.config.name for s in await nats_client.jetstream().streams_info()]
    await broker_nats.cleanup(NATS_URL, name)  # nothing left: no error


def test_kit_exposes_exactly_the_kit() -> None:
    public = {
        name
        for name, value in vars(broker_nats).items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == broker_nats.__name__
    }
    kit = {"destination", "prepare", "consume", "publish", "cleanup"}
    assert public == kit | {"start_server", "stop_server"}
