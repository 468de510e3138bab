"""``amqps://`` destinations: through a TLS proxy in front of the machine's RabbitMQ, the
broker's certificate is verified (against the system's CAs, or ``cafile``), ``no_verify_ssl=1``
skips that, and a client certificate is presented; TLS files that cannot be used are refused
when the destination starts, naming them."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from relay.destinations.amqp import AmqpDestination, tls_files
from relay.destinations.errors import DestinationRefused
from tests.amqp_support import Rabbit, amqp_config, outbound

BROKER = ("127.0.0.1", 5672)


@dataclass
class TlsProxy:
    """A TLS server on 127.0.0.1 that pipes each connection to the broker."""

    port: int
    accepted: int = 0


@contextlib.asynccontextmanager
async def tls_proxy(
    ca: trustme.CA, *, client_ca: trustme.CA | None = None
) -> AsyncIterator[TlsProxy]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    if client_ca is not None:
        client_ca.configure_trust(server)
        server.verify_mode = ssl.CERT_REQUIRED
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proxy.accepted += 1
        broker_reader, broker_writer = await asyncio.open_connection(*BROKER)
        for task in (pipe(reader, broker_writer), pipe(broker_reader, writer)):
            pipes.add(asyncio.create_task(task))

    listening = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server)
    proxy = TlsProxy(listening.sockets[0].getsockname()[1])
    try:
        yield proxy
    finally:
        listening.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


def amqps_url(rabbit: Rabbit, proxy: TlsProxy, query: str = "") -> str:
    url = rabbit.url.replace("amqp://", "amqps://", 1).replace(":5672/", f":{proxy.port}/", 1)
    return f"{url}?{query}" if query else url


async def deliver_once(rabbit: Rabbit, url: str) -> tuple[bool, str | None, int]:
    """One delivery through a fresh destination: (ok, error, messages in the queue)."""
    exchange, queue = rabbit.name("tls-x"), rabbit.name("tls-q")
    await rabbit.exchange(exchange)
    await rabbit.queue(queue, exchange)
    destination = AmqpDestination("tls", amqp_config(url, exchange=exchange, timeout="3s"))
    try:
        await destination.start()
        outcome = await destination.deliver(outbound(1), timeout=3)
    finally:
        await destination.aclose()
    arrived = len(await rabbit.messages(queue, 1)) if outcome.ok else 0
    return outcome.ok, outcome.error, arrived


async def test_amqps_trusts_a_private_ca_given_as_cafile(
    rabbit: Rabbit, ca: trustme.CA, tmp_path: Path
) -> None:
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    async with tls_proxy(ca) as proxy:
        assert await deliver_once(rabbit, amqps_url(rabbit, proxy, f"cafile={cafile}")) == (
            True,
            None,
            1,
        )
        assert proxy.accepted >= 1


async def test_amqps_verifies_the_broker_certificate(rabbit: Rabbit, ca: trustme.CA) -> None:
    async with tls_proxy(ca) as proxy:
        ok, error, _ = await deliver_once(rabbit, amqps_url(rabbit, proxy))
        assert not ok and error is not None and "CERTIFICATE_VERIFY_FAILED" in error.upper()
        assert await deliver_once(rabbit, amqps_url(rabbit, proxy, "no_verify_ssl=1")) == (
            True,
            None,
            1,
        )


async def test_amqps_presents_the_client_certificate(
    rabbit: Rabbit, ca: trustme.CA, tmp_path: Path
) -> None:
    client_ca = trustme.CA()
    client = client_ca.issue_cert("relay-client@example.com")
    cafile, certfile, keyfile = tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem"
    ca.cert_pem.write_to_path(str(cafile))
    client.cert_chain_pems[0].write_to_path(str(certfile))
    client.private_key_pem.write_to_path(str(keyfile))
    async with tls_proxy(ca, client_ca=client_ca) as proxy:
        with_cert = f"cafile={cafile}&certfile={certfile}&keyfile={keyfile}"
        assert await deliver_once(rabbit, amqps_url(rabbit, proxy, with_cert)) == (True, None, 1)
        ok, error, _ = await deliver_once(rabbit, amqps_url(rabbit, proxy, f"cafile={cafile}"))
        assert not ok and error


def encrypted_key(ca: trustme.CA, path: Path) -> None:
    key = serialization.load_pem_private_key(ca.issue_cert("x").private_key_pem.bytes(), None)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret-pass"),
        )
    )


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("cafile={missing}", "cannot use cafile='{missing}': FileNotFoundError"),
        ("cafile={not_pem}", "cannot load the CA certificates of cafile='{not_pem}'"),
        ("capath={missing}&cafile={not_pem}", "capath='{missing}' is not a directory"),
        ("capath={not_pem}", "capath='{not_pem}' is not a directory"),
        ("certfile={missing}", "cannot use certfile='{missing}'"),
        ("certfile={not_pem}", "certificate of certfile='{not_pem}': the certfile holds no PEM c"),
        ("certfile={key}", "certfile='{key}': the certfile holds no PEM certificate"),
        ("certfile={cert}", "of certfile='{cert}': the certfile holds no PEM private key (or give"),
        (
            "certfile={cert}&keyfile={not_pem}",
            "certfile='{cert}' and keyfile='{not_pem}': the keyfile holds no PEM private key",
        ),
        ("certfile={cert}&keyfile={cert}", "keyfile='{cert}': the keyfile holds no PEM private"),
        (
            "certfile={cert}&keyfile={other_key}",
            "certfile='{cert}' and keyfile='{other_key}': the key is not the certificate's",
        ),
        (
            "certfile={cert_and_other_key}",
            "certfile='{cert_and_other_key}': the key is not the certificate's",
        ),
        ("certfile={cert}&keyfile={missing}", "cannot use keyfile='{missing}'"),
        ("certfile={cert}&keyfile={encrypted}", "key in keyfile='{encrypted}' is encrypted"),
    ],
)
async def test_tls_files_that_cannot_be_used_are_refused_at_start(
    ca: trustme.CA, tmp_path: Path, query: str, message: str
) -> None:
    cert = ca.issue_cert("relay-client")
    files = {
        "missing": tmp_path / "missing.pem",
        "not_pem": tmp_path / "not.pem",
        "cert": tmp_path / "cert.pem",
        "encrypted": tmp_path / "encrypted.pem",
        "key": tmp_path / "key.pem",
        "other_key": tmp_path / "other-key.pem",
        "cert_and_other_key": tmp_path / "cert-and-other-key.pem",
    }
    files["not_pem"].write_text("not a certificate\n")
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    other_key = ca.issue_cert("someone-else").private_key_pem
    other_key.write_to_path(str(files["other_key"]))
    files["cert_and_other_key"].write_bytes(cert.cert_chain_pems[0].bytes() + other_key.bytes())
    encrypted_key(ca, files["encrypted"])
    url = f"amqps://guest:guest@127.0.0.1:1/?{query.format(**files)}"
    destination = AmqpDestination("tls", amqp_config(url, exchange="x", timeout="1s"))
    with pytest.raises(DestinationRefused) as refused:
        await destination.start()  # before any connection: port 1 is never tried
    assert message.format(**files) in str(refused.value)
    assert "guest" not in str(refused.value)


def test_plain_amqp_has_no_tls_context_and_amqps_verifies_by_default() -> None:
    from yarl import URL

    assert tls_files(URL("amqp://127.0.0.1/")) is None
    files = tls_files(URL("amqps://127.0.0.1/"))
    assert files is not None
    context = files.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
