"""TLS to NATS (``tls://``) and MQTT (``mqtts://``) destinations, on private ``nats-server`` and
Mosquitto processes with certificates of a private CA (trusted through ``SSL_CERT_FILE``, as a
deployment would): events arrive over TLS, an untrusted certificate fails the attempt, and a
``tls://`` NATS destination sends nothing, not even its credentials, to a server that does not
switch to TLS (NATS starts every connection in plain text)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvloop
from pydantic import ValidationError

from relay.destinations.amqp import AmqpDestination
from relay.destinations.errors import DestinationRefused
from relay.destinations.mqtt import MqttDestination
from relay.destinations.nats_connect import ConnectOptions
from relay.destinations.nats_jetstream import NatsDestination
from relay.destinations.outcome import Outcome
from tests.amqp_support import amqp_config, outbound
from tests.mqtt_support import mqtt_client, private_broker, subscribed
from tests.nats_support import connect, create_stream, private_server, read_stream
from tests.support import free_port
from tests.test_dest_mqtt import destination as mqtt_destination
from tests.test_dest_mqtt import mqtt_config
from tests.test_dest_nats import destination as nats_destination
from tests.test_dest_nats import nats_config

PASSWORD = "pw/that@must:not-leak"
TOKEN = "tok/en@that-must-not-leak"


@pytest.fixture
def server_files(ca: trustme.CA, tmp_path: Path) -> tuple[Path, Path]:
    """The certificate (chain) and key files of a server at 127.0.0.1, issued by ``ca``."""
    issued = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = tmp_path / "server.pem", tmp_path / "server.key"
    issued.cert_chain_pems[0].write_to_path(str(certfile))
    issued.private_key_pem.write_to_path(str(keyfile))
    return certfile, keyfile


@pytest.fixture
def trusted(ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process trusts ``ca`` (``SSL_CERT_FILE``, read when a TLS context is made)."""
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    monkeypatch.setenv("SSL_CERT_FILE", str(cafile))


def tls_nats_options(server_files: tuple[Path, Path], store: Path) -> list[str]:
    certfile, keyfile = server_files
    tls = ["--tls", "--tlscert", str(certfile), "--tlskey", str(keyfile)]
    return ["-js", "-sd", str(store), *tls, "--user", "relay", "--pass", PASSWORD]


def with_credentials(url: str, scheme: str, credentials: str) -> str:
    return url.replace("nats://", f"{scheme}://{credentials}", 1)


ESCAPED = "relay:pw%2Fthat%40must%3Anot-leak@"


async def nats_tls_delivery(server_url: str) -> tuple[Outcome, int]:
    """One event through a ``tls://`` destination with a password; (outcome, messages the
    stream then holds, read back over TLS)."""
    client = await connect(server_url.replace("nats://", "tls://"), user="relay", password=PASSWORD)
    try:
        js = client.jetstream()
        stream = await create_stream(js)
        config = nats_config(f"{stream}.x", url=with_credentials(server_url, "tls", ESCAPED))
        async with nats_destination(config) as sender:
            outcome = await sender.deliver(outbound(), timeout=5)
        arrived = await read_stream(js, stream, 1, timeout=2) if outcome.ok else []
        return outcome, len(arrived)
    finally:
        await client.close()


# --- NATS ----------------------------------------------------------------------------------------


async def test_a_tls_url_delivers_over_tls_to_a_server_it_trusts(
    server_files: tuple[Path, Path], trusted: None, tmp_path: Path
) -> None:
    with private_server(tmp_path, *tls_nats_options(server_files, tmp_path / "js")) as url:
        outcome, arrived = await nats_tls_delivery(url)
    assert outcome.ok, outcome.error
    assert arrived == 1


async def test_a_tls_url_fails_the_attempt_on_a_certificate_it_does_not_trust(
    server_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stranger = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(stranger))
    monkeypatch.setenv("SSL_CERT_FILE", str(stranger))
    with private_server(tmp_path, *tls_nats_options(server_files, tmp_path / "js")) as url:
        config = nats_config("relay-test.x", url=with_credentials(url, "tls", ESCAPED))
        async with nats_destination(config) as sender:
            outcome = await sender.deliver(outbound(), timeout=3)
    assert not outcome.ok
    assert outcome.error is not None and "CERTIFICATE_VERIFY_FAILED" in outcome.error.upper()
    assert PASSWORD not in outcome.error


@asynccontextmanager
async def plain_text_nats(
    tls: ssl.SSLContext | None = None, **fields: object
) -> AsyncIterator[tuple[str, bytearray]]:
    """A server that answers as NATS does, without asking for TLS (with ``tls``, a server
    context: asking for it, and switching), its INFO holding ``fields`` too, and keeps every
    byte it is sent (after the switch: decrypted): (its URL, those bytes)."""
    received = bytearray()
    port = free_port()
    info = {"server_id": "PLAIN", "version": "2.10.0", "proto": 1, "headers": True}
    info |= {"host": "127.0.0.1", "port": port, "max_payload": 1048576, **fields}
    if tls is not None:
        info["tls_required"] = True

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"INFO " + json.dumps(info).encode() + b"\r\n")
        await writer.drain()
        if tls is not None:
            await writer.start_tls(tls)
        while data := await reader.read(65536):
            received.extend(data)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    try:
        yield f"nats://127.0.0.1:{port}", received
    finally:
        server.close()


async def plain_text_refusal(credentials: str) -> tuple[Outcome, bytes]:
    async with plain_text_nats() as (url, received):
        config = nats_config("relay-test.x", url=with_credentials(url, "tls", credentials))
        async with nats_destination(config) as sender:
            outcome = await sender.deliver(outbound(), timeout=3)
        await asyncio.sleep(0)  # the server reads what is left
        return outcome, bytes(received)


@pytest.mark.parametrize("credentials", [ESCAPED, "tok%2Fen%40that-must-not-leak@", ""])
async def test_a_tls_url_sends_nothing_to_a_server_that_does_not_switch_to_tls(
    credentials: str,
) -> None:
    outcome, received = await plain_text_refusal(credentials)
    assert not outcome.ok
    assert outcome.error is not None and "did not switch to TLS" in outcome.error
    assert received == b""  # no CONNECT (no password, no token), no event


async def test_a_tls_url_sends_nothing_to_a_server_named_by_one_answering_in_plain_text(
    ca: trustme.CA, trusted: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone answering for the server may name another in its INFO (``connect_urls``), which
    comes before TLS: one of theirs, with a certificate valid for its own name."""
    theirs = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(theirs)
    refused = "named another server, 'localhost', which the url does not name"
    async with plain_text_nats(theirs) as (their_url, taken):
        their_port = their_url.rpartition(":")[2]
        async with plain_text_nats(connect_urls=[f"localhost:{their_port}"]) as (url, received):
            secure = with_credentials(url, "tls", ESCAPED)
            async with nats_destination(nats_config("relay-test.x", url=secure)):
                async with asyncio.timeout(15):  # nats-py tries the servers in turn
                    while refused not in caplog.text and not taken:
                        await asyncio.sleep(0.05)
            await asyncio.sleep(0)
    assert received == b"" and taken == b""


@asynccontextmanager
async def unhelpful_nats(mode: str) -> AsyncIterator[str]:
    """A server that accepts connections and then, by ``mode``: says nothing (``mute``), asks
    for TLS in its INFO and ignores the handshake (``stall``) or closes at the handshake's first
    bytes (``reset``): its URL."""
    port = free_port()
    info = {"server_id": "MUTE", "version": "2.10.0", "proto": 1, "tls_required": True}
    held: list[asyncio.StreamWriter] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if mode == "mute":
            return
        writer.write(b"INFO " + json.dumps(info | {"port": port}).encode() + b"\r\n")
        if mode == "reset" and await reader.read(1):
            writer.transport.abort()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.close()
        for writer in held:
            writer.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "timeout", "expected"),
    [
        ("stall", 3, "timeout: the server asked for TLS and did not complete the handshake wit"),
        # the second attempt may end on nats-py's own 2 s connect timeout of its retry in the
        # background (a busy machine) instead of its 1 s: either names the stall
        ("stall", 1, "the server asked for TLS and did not complete the handshake"),
        ("reset", 3, "during the TLS handshake"),
        ("mute", 3, "timeout"),
    ],
)
async def test_a_failed_tls_handshake_is_named_as_such(
    mode: str, timeout: float, expected: str
) -> None:
    async with unhelpful_nats(mode) as url:
        config = nats_config("relay-test.x", url=with_credentials(url, "tls", ESCAPED))
        async with nats_destination(config) as sender:
            first = await sender.deliver(outbound(), timeout=timeout)
            second = await sender.deliver(outbound(), timeout=timeout)
    if timeout < 2:  # the first attempt ends before any timeout of nats-py's
        assert first.error is not None and first.error.startswith("timeout after 1.0s: ")
    for outcome in (first, second):
        assert not outcome.ok and outcome.error is not None
        assert expected in outcome.error
        assert ("TLS" in outcome.error) == (mode != "mute"), outcome.error
        assert PASSWORD not in outcome.error


async def test_a_nats_url_still_talks_plain_text(tmp_path: Path) -> None:
    """``nats://`` asks for nothing: the guard is for ``tls://`` only."""
    with private_server(tmp_path, "-js", "-sd", str(tmp_path / "js")) as url:
        client = await connect(url)
        try:
            stream = await create_stream(client.jetstream())
            async with nats_destination(nats_config(f"{stream}.x", url=url)) as sender:
                outcome = await sender.deliver(outbound(), timeout=3)
        finally:
            await client.close()
    assert outcome.ok, outcome.error


def test_the_guard_holds_on_uvloop(
    server_files: tuple[Path, Path], trusted: None, tmp_path: Path
) -> None:
    """The embedded worker runs in `relay serve`'s loop, uvloop where it is installed."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        with private_server(tmp_path, *tls_nats_options(server_files, tmp_path / "js")) as url:
            outcome, arrived = runner.run(nats_tls_delivery(url))
        assert (outcome.ok, arrived) == (True, 1), outcome.error
        refused, received = runner.run(plain_text_refusal(ESCAPED))
    assert not refused.ok and received == b""


async def test_a_token_in_the_url_is_given_as_the_token(tmp_path: Path) -> None:
    options = ["-js", "-sd", str(tmp_path / "js"), "--auth", TOKEN]
    with private_server(tmp_path, *options) as url:
        good = url.replace("nats://", "nats://tok%2Fen%40that-must-not-leak@", 1)
        client = await connect(url, token=TOKEN)
        try:
            stream = await create_stream(client.jetstream())
            async with nats_destination(nats_config(f"{stream}.x", url=good)) as sender:
                accepted = await sender.deliver(outbound(), timeout=3)
            wrong = url.replace("nats://", "nats://not-the-token@", 1)
            async with nats_destination(nats_config(f"{stream}.x", url=wrong)) as sender:
                refused = await sender.deliver(outbound(), timeout=3)
        finally:
            await client.close()
    assert accepted.ok, accepted.error
    assert not refused.ok and refused.error is not None
    assert "Authorization Violation" in refused.error and "not-the-token" not in refused.error


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://h:4222", ConnectOptions(("nats://h:4222",))),
        ("tls://u:p%40ss%2F@h:4222", ConnectOptions(("tls://h:4222",), "u", "p@ss/")),
        ("nats://t%3Aok@h", ConnectOptions(("nats://h",), token="t:ok")),
        ("nats://u:@h", ConnectOptions(("nats://h",), user="u", password="")),
        ("nats://a,nats://u:p@b", ConnectOptions(("nats://a", "nats://b"), "u", "p")),
    ],
)
def test_credentials_come_out_of_the_url_percent_decoded(
    url: str, expected: ConnectOptions
) -> None:
    assert ConnectOptions.from_url(url) == expected


# --- MQTT ----------------------------------------------------------------------------------------


async def mqtts_delivery(tmp_path: Path, server_files: tuple[Path, Path]) -> tuple[Outcome, int]:
    """One event to a TLS listener of a private Mosquitto; (outcome, messages a subscriber on
    its plain listener got)."""
    certfile, keyfile = server_files
    tls_port = free_port()
    listener = [f"listener {tls_port} 127.0.0.1", f"certfile {certfile}", f"keyfile {keyfile}"]
    with private_broker(tmp_path, *listener) as broker:
        async with subscribed("relay-tls/#", 1, url=broker.url) as subscriber:
            config = mqtt_config("relay-tls/{kind}", url=f"mqtts://127.0.0.1:{tls_port}")
            async with mqtt_destination(config) as sender:
                outcome = await sender.deliver(outbound(), timeout=3)
            arrived = await subscriber.wait_for(1, timeout=2) if outcome.ok else []
    return outcome, len(arrived)


async def test_an_mqtts_url_delivers_over_tls_to_a_broker_it_trusts(
    server_files: tuple[Path, Path], trusted: None, tmp_path: Path
) -> None:
    outcome, arrived = await mqtts_delivery(tmp_path, server_files)
    assert outcome.ok, outcome.error
    assert arrived == 1


async def test_an_mqtts_url_fails_the_attempt_on_a_certificate_it_does_not_trust(
    server_files: tuple[Path, Path], tmp_path: Path
) -> None:
    outcome, arrived = await mqtts_delivery(tmp_path, server_files)
    assert not outcome.ok and arrived == 0
    assert outcome.error is not None and "CERTIFICATE_VERIFY_FAILED" in outcome.error.upper()


async def test_an_mqtts_url_sends_nothing_to_a_plain_listener(tmp_path: Path) -> None:
    with private_broker(tmp_path) as broker:
        async with subscribed("relay-tls/#", 1, url=broker.url) as subscriber:
            tls_url = broker.url.replace("mqtt://", "mqtts://", 1)
            async with mqtt_destination(mqtt_config("relay-tls/x", url=tls_url)) as sender:
                outcome = await sender.deliver(outbound(), timeout=3)
            async with mqtt_client(broker.url) as marker:  # routed after anything sent before
                await marker.publish("relay-tls/marker", b"after", qos=1)
            arrived = await subscriber.wait_for(1)
    assert not outcome.ok and outcome.error
    assert [str(message.topic) for message in arrived] == ["relay-tls/marker"]


# --- TLS files: a private CA and a client certificate ---------------------------------------------


@pytest.fixture
def client_files(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    """A CA of the brokers' own for client certificates, and a client certificate (and key)
    it issued."""
    client_ca = trustme.CA()
    issued = client_ca.issue_cert("relay-client@example.com")
    certfile, keyfile = tmp_path / "client.pem", tmp_path / "client.key"
    issued.cert_chain_pems[0].write_to_path(str(certfile))
    issued.private_key_pem.write_to_path(str(keyfile))
    return client_ca, certfile, keyfile


def ca_file(ca: trustme.CA, path: Path) -> Path:
    ca.cert_pem.write_to_path(str(path))
    return path


async def test_nats_takes_a_cafile_and_presents_the_client_certificate(
    ca: trustme.CA,
    server_files: tuple[Path, Path],
    client_files: tuple[trustme.CA, Path, Path],
    tmp_path: Path,
) -> None:
    client_ca, certfile, keyfile = client_files
    cafile = ca_file(ca, tmp_path / "ca.pem")
    verify = ["--tlsverify", "--tlscacert", str(ca_file(client_ca, tmp_path / "client-ca.pem"))]
    options = [*tls_nats_options(server_files, tmp_path / "js"), *verify]
    with private_server(tmp_path, *options) as url:
        tls = ssl.create_default_context(cafile=str(cafile))
        tls.load_cert_chain(certfile, keyfile)
        client = await connect(url, user="relay", password=PASSWORD, tls=tls)
        try:
            js = client.jetstream()
            stream = await create_stream(js)
            secure = with_credentials(url, "tls", ESCAPED)
            files = {"cafile": str(cafile), "certfile": str(certfile), "keyfile": str(keyfile)}
            async with nats_destination(nats_config(f"{stream}.x", secure, **files)) as sender:
                accepted = await sender.deliver(outbound(), timeout=5)
            no_certificate = nats_config(f"{stream}.x", secure, cafile=str(cafile))
            async with nats_destination(no_certificate) as sender:
                refused = await sender.deliver(outbound(), timeout=3)
            arrived = await read_stream(js, stream, 1, timeout=2)
        finally:
            await client.close()
    assert accepted.ok, accepted.error
    assert len(arrived) == 1
    assert not refused.ok and refused.error


async def test_mqtt_takes_a_cafile_and_presents_the_client_certificate(
    ca: trustme.CA,
    server_files: tuple[Path, Path],
    client_files: tuple[trustme.CA, Path, Path],
    tmp_path: Path,
) -> None:
    client_ca, certfile, keyfile = client_files
    cafile = ca_file(ca, tmp_path / "ca.pem")
    server_cert, server_key = server_files
    tls_port = free_port()
    listener = [
        f"listener {tls_port} 127.0.0.1",
        f"certfile {server_cert}",
        f"keyfile {server_key}",
        f"cafile {ca_file(client_ca, tmp_path / 'client-ca.pem')}",
        "require_certificate true",
    ]
    url = f"mqtts://127.0.0.1:{tls_port}"
    files = {"cafile": str(cafile), "certfile": str(certfile), "keyfile": str(keyfile)}
    with private_broker(tmp_path, *listener) as broker:
        async with subscribed("relay-tls/#", 1, url=broker.url) as subscriber:
            async with mqtt_destination(mqtt_config("relay-tls/a", url, **files)) as sender:
                accepted = await sender.deliver(outbound(), timeout=3)
            arrived = await subscriber.wait_for(1, timeout=2)
            no_certificate = mqtt_config("relay-tls/b", url, cafile=str(cafile))
            async with mqtt_destination(no_certificate) as sender:
                refused = await sender.deliver(outbound(), timeout=3)
    assert accepted.ok, accepted.error
    assert len(arrived) == 1
    assert not refused.ok and refused.error


def unusable_file(kind: str, directory: Path) -> tuple[str, str]:
    """A path that cannot serve as a TLS file, and what the refusal says of it."""
    path = directory / kind
    if kind == "missing":
        return str(path), "FileNotFoundError"
    if kind == "fifo":  # reading it would wait for a writer, holding the worker's start
        os.mkfifo(path)
        return str(path), "is not a regular file"
    if kind == "device":
        return "/dev/zero", "is not a regular file"
    if kind == "directory":
        return str(directory), "is not a regular file"
    with path.open("wb") as huge:  # sparse: nothing is written
        huge.truncate(5 * 1024 * 1024)
    return str(path), "larger than 4 MiB"


@pytest.mark.parametrize("broker", ["nats", "mqtt"])
@pytest.mark.parametrize("key", ["cafile", "certfile"])
@pytest.mark.parametrize("kind", ["missing", "fifo", "device", "directory", "huge"])
async def test_tls_files_that_cannot_be_used_stop_the_start_naming_them(
    broker: str, key: str, kind: str, tmp_path: Path
) -> None:
    missing, reason = unusable_file(kind, tmp_path)
    if broker == "nats":
        sender: Any = NatsDestination(
            "bus", nats_config("a.b", "tls://127.0.0.1:1", **{key: missing})
        )
    else:
        sender = MqttDestination("bus", mqtt_config("a/b", "mqtts://127.0.0.1:1", **{key: missing}))
    with pytest.raises(DestinationRefused, match=f"{key}='{missing}'.*{reason}"):
        async with asyncio.timeout(5):
            await sender.start()
    await sender.aclose()


@pytest.mark.parametrize("broker", ["nats", "mqtt", "amqp"])
async def test_tls_files_not_loaded_at_start_fail_the_attempt_naming_them(
    broker: str, tmp_path: Path
) -> None:
    """A destination whose start was skipped loads its TLS files at its first connection: a
    file that cannot be used fails that attempt, as a broker that cannot be reached would."""
    missing = str(tmp_path / "missing.pem")
    sender: Any
    if broker == "nats":
        sender = NatsDestination("bus", nats_config("a.b", "tls://127.0.0.1:1", cafile=missing))
    elif broker == "mqtt":
        sender = MqttDestination("bus", mqtt_config("a/b", "mqtts://127.0.0.1:1", cafile=missing))
    else:
        url = f"amqps://guest:guest@127.0.0.1:1/?cafile={missing}"
        sender = AmqpDestination("bus", amqp_config(url, exchange="x", timeout="1s"))
    try:
        outcomes = [await sender.deliver(outbound(), timeout=3) for _ in range(2)]
    finally:
        await sender.aclose()
    for outcome in outcomes:
        assert not outcome.ok and outcome.error is not None
        assert f"cannot use cafile='{missing}'" in outcome.error, outcome.error
        assert "guest" not in outcome.error


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cafile": "/ca.pem"}, "need a tls:// url"),
        ({"url": "tls://h", "keyfile": "/k.pem"}, "keyfile needs certfile"),
        ({"url": "tls://h", "cafile": ""}, "the path of a file"),
        ({"url": "tls://h", "certfile": "/c\n.pem"}, "the path of a file"),
        ({"url": "tls://h", "cafile": "/" * 5000}, "the path of a file"),
        ({"url": "tls://h", "cafile": 3}, "valid string"),
    ],
)
def test_tls_files_need_tls_and_a_path(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        nats_config("a.b", **({"url": "nats://h"} | changes))
    mqtt_changes = {
        k: v.replace("tls://", "mqtts://") if k == "url" else v for k, v in changes.items()
    }
    mqtt_message = message.replace("tls://", "mqtts://")
    with pytest.raises(ValidationError, match=mqtt_message):
        mqtt_config("a/b", **({"url": "mqtt://h"} | mqtt_changes))
