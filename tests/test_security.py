"""Security against a real `relay serve` over raw sockets: lying Content-Length, chunked bodies
over the limit, replayed signatures, and a server that keeps serving afterwards."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from receivers.auth import sign
from relay.simulator import factories
from tests.conftest import TOKEN
from tests.metrics_support import sample
from tests.support import free_port
from tests.test_restart import start_server

pytestmark = pytest.mark.slow

SECRET = "hmac-secret-for-the-tests"


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the module's server: its config, database and log (server.log)."""
    return tmp_path_factory.mktemp("security")


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[int]:
    """A real server: default source by token, `signed` by HMAC; 4 KiB body limit."""
    tmp = server_dir
    config = tmp / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp / "relay.db"}"\nmax_body_bytes = 4096\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        f'[sources.signed]\nsignature_secret = "{SECRET}"\n'
    )
    port = free_port()
    process = start_server(config, port, tmp / "server.log")
    yield port
    process.terminate()
    process.wait(timeout=30)


def raw_request(port: int, data: bytes, read_timeout: float = 5.0) -> bytes:
    """Send bytes as they are and read until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def status_lines(answer: bytes) -> list[int]:
    return [int(line.split()[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1")]


def head(path: str, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: relay.test",
        *[f"{k}: {v}" for k, v in headers.items()],
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def still_serving(port: int) -> None:
    answer = httpx.post(
        f"http://127.0.0.1:{port}/hooks/sms/dlr?token={TOKEN}", json=factories.sms_dlr(), timeout=5
    )
    assert answer.status_code == 200


def test_declared_length_over_the_limit_is_refused_before_reading(server: int) -> None:
    request = (
        head(
            f"/hooks/sms/inbound?token={TOKEN}",
            {
                "Content-Length": "10000000",
                "Content-Type": "application/json",
                "Connection": "close",
            },
        )
        + b'{"a": 1}'
    )
    answer = raw_request(server, request)
    assert status_lines(answer)[0] == 413
    assert b"application/problem+json" in answer
    still_serving(server)


def test_content_length_shorter_than_the_body(server: int) -> None:
    body = json.dumps(factories.sms_inbound()).encode()
    request = (
        head(
            f"/hooks/sms/inbound?token={TOKEN}",
            {"Content-Length": "12", "Content-Type": "application/json", "Connection": "close"},
        )
        + body
    )
    answer = raw_request(server, request)
    statuses = status_lines(answer)
    assert statuses[0] == 400  # the first 12 bytes are not JSON: quarantined, not a 500
    assert all(status < 500 for status in statuses)
    still_serving(server)


def test_content_length_longer_than_the_body_times_out_without_harm(server: int) -> None:
    request = (
        head(
            f"/hooks/sms/inbound?token={TOKEN}",
            {"Content-Length": "2000", "Content-Type": "application/json"},
        )
        + b'{"a":'
    )
    answer = raw_request(server, request, read_timeout=2.0)
    assert all(status < 500 for status in status_lines(answer))
    still_serving(server)


def test_chunked_body_over_the_limit(server: int) -> None:
    chunk = b"x" * 1024
    body = (
        b"".join(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(8)) + b"0\r\n\r\n"
    )
    request = (
        head(
            f"/hooks/sms/inbound?token={TOKEN}",
            {
                "Transfer-Encoding": "chunked",
                "Content-Type": "application/json",
                "Connection": "close",
            },
        )
        + body
    )
    answer = raw_request(server, request)
    assert status_lines(answer)[0] == 413
    still_serving(server)


def test_replayed_signature_is_stored_once_and_refused_when_stale(server: int) -> None:
    body = json.dumps(factories.conversations_status()).encode()
    stamp = str(int(time.time()))
    headers = {
        "x-request-timestamp": stamp,
        "x-signature": sign(SECRET, stamp, body),
        "content-type": "application/json",
    }
    url = f"http://127.0.0.1:{server}/hooks/signed/conversations"
    first = httpx.post(url, content=body, headers=headers)
    replayed = httpx.post(url, content=body, headers=headers)
    assert first.status_code == replayed.status_code == 200
    assert first.json() == replayed.json()  # a replay is a duplicate, never a second event

    old = str(int(time.time()) - 3600)
    stale = {**headers, "x-request-timestamp": old, "x-signature": sign(SECRET, old, body)}
    assert httpx.post(url, content=body, headers=stale).status_code == 401
    resigned = json.dumps(json.loads(body), indent=2).encode()  # re-serialized: bytes differ
    assert httpx.post(url, content=resigned, headers=headers).status_code == 401


def test_slow_client_does_not_block_others(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as slow:
        slow.sendall(
            head(
                f"/hooks/sms/inbound?token={TOKEN}",
                {"Content-Length": "1000", "Content-Type": "application/json"},
            )
        )
        slow.sendall(b'{"from": ')
        still_serving(server)  # another caller is answered while this one dawdles


def test_forwarded_for_from_an_untrusted_peer_is_ignored(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "relay.db"}"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\nallow_ips = ["203.0.113.0/24"]\n'
    )
    port = free_port()
    process = start_server(config, port, tmp_path / "server.log")
    try:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/hooks/sms/dlr?token={TOKEN}",
            json=factories.sms_dlr(),
            headers={"x-forwarded-for": "203.0.113.7"},
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert answer.status_code == 403


def disconnects_counted(port: int) -> int:
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return int(sample(metrics, "relay_client_disconnects_total", source="signed") or 0)


def test_callers_that_leave_mid_body_are_counted_not_traced(server: int, server_dir: Path) -> None:
    """No credentials are needed to send a body to a signature-only source: a caller that
    leaves before the end of it is counted (and an INFO line), never a traceback."""
    log = server_dir / "server.log"
    before, counted = log.read_text(), disconnects_counted(server)
    callers = 20
    for _ in range(callers):
        with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
            sock.sendall(
                head(
                    "/hooks/signed/conversations",
                    {"Content-Length": "1000", "Content-Type": "application/json"},
                )
                + b'{"event": '
            )
    deadline = time.monotonic() + 10
    while disconnects_counted(server) < counted + callers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert disconnects_counted(server) == counted + callers
    written = log.read_text()[len(before) :]
    assert "Traceback" not in written
    assert "Exception in ASGI application" not in written
    still_serving(server)
