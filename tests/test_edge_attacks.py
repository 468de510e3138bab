"""Attacks on the HTTP edge, over real sockets against a real `relay serve` (small limits):
endless or numerous headers, heads and bodies that never finish, more connections than the
server has file descriptors; and the requests that must keep working behind the guard."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from relay.server.connection_guard import ConnectionGuard, EdgeLimits
from relay.server.serve import SHUTDOWN_SECONDS, server_config
from relay.settings import Settings, SettingsError, load_settings
from relay.simulator import factories
from tests.conftest import TOKEN
from tests.support import free_port

LIMITS = 'max_header_bytes = 4096\nmax_headers = 20\nheader_timeout = "1s"\nbody_timeout = "1s"\n'
READ_TIMEOUT = 5.0
"""How long a test waits for an answer (the server's timeouts above are 1 s)."""
DLR = f"/hooks/sms/dlr?token={TOKEN}"


def start_server(
    tmp: Path, settings: str, *, open_files: int | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """`relay serve` on a free port with ``settings``, optionally under a lower RLIMIT_NOFILE."""
    config = tmp / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp / "relay.db"}"\n{settings}'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
    )
    port = free_port()

    def lower_limit() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    log = tmp / "server.log"
    argv = [sys.executable, "-m", "relay", "serve", "--config", str(config), "--port", str(port)]
    process = subprocess.Popen(
        [*argv, "--log-level", "warning"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=tmp,
        env={**os.environ, "RELAY_CONFIG": ""},
        preexec_fn=lower_limit,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process, port
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"server did not start: {log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """(port, pid) of a server with 4 KiB heads, 20 header fields, 1 s head and body times."""
    process, port = start_server(tmp_path_factory.mktemp("edge"), LIMITS)
    yield port, process.pid
    stop(process)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset after its answer included)."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """``count`` answers with a Content-Length body: (status, body) each."""
    buffer = b""
    answers = []
    while len(answers) < count:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            head = buffer[:end].decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(": ", 1) for line in head[1:])
            total = end + 4 + int(fields["content-length"])
            if len(buffer) >= total:
                answers.append((int(head[0].split()[1]), buffer[end + 4 : total]))
                buffer = buffer[total:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(answers)} answers"
        buffer += chunk
    return answers


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer.split()[1])


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: relay.test", "Content-Type: application/json"]
    lines += [*headers, f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def callback() -> bytes:
    return json.dumps(factories.sms_dlr()).encode()


def valid_callback(port: int) -> int:
    """A callback from a well-behaved client; its status, which must come within 2 s."""
    answer = httpx.post(f"http://127.0.0.1:{port}{DLR}", json=factories.sms_dlr(), timeout=2.0)
    return answer.status_code


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def endless_header(port: int, total: int, answers: list[bytes]) -> None:
    """Send a head whose one field grows to ``total`` bytes, in 64 KiB pieces."""
    with connect(port) as sock:
        piece = b"a" * 65536
        with contextlib.suppress(OSError):  # the server stops reading and resets
            sock.sendall(b"POST " + DLR.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Filler: ")
            for _ in range(total // len(piece)):
                sock.sendall(piece)
        answers.append(read_until_closed(sock))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_endless_header_gets_431_and_costs_no_memory(server: tuple[int, int]) -> None:
    port, pid = server
    before = rss_bytes(pid)
    answers: list[bytes] = []
    attackers = [
        threading.Thread(target=endless_header, args=(port, 8 << 20, answers)) for _ in range(4)
    ]
    for attacker in attackers:
        attacker.start()
    try:
        assert valid_callback(port) == 200  # answered meanwhile
    finally:
        for attacker in attackers:
            attacker.join(timeout=30)
    assert [status_of(answer) for answer in answers] == [431] * 4
    assert b"Connection: close" in answers[0]
    assert rss_bytes(pid) - before < 16 << 20  # the 32 MiB sent were never held
    assert valid_callback(port) == 200


@pytest.mark.slow
def test_too_many_header_fields_get_431(server: tuple[int, int]) -> None:
    port, _ = server
    with connect(port) as sock:
        fields = [f"X-Field-{n}: {n}" for n in range(30)]
        sock.sendall(post(DLR, callback(), *fields))
        answer = read_until_closed(sock)
    assert status_of(answer) == 431
    assert b"header fields" in answer
    assert valid_callback(port) == 200


@pytest.mark.slow
def test_a_head_that_stalls_gets_408_and_is_closed(server: tuple[int, int]) -> None:
    port, _ = server
    with connect(port) as sock:
        sock.sendall(f"POST {DLR} HTTP/1.1\r\nHost: relay.test\r\nContent-".encode())
        answer = read_until_closed(sock)  # returns only once the server has closed
    assert status_of(answer) == 408
    assert b"Connection: close" in answer


@pytest.mark.slow
def test_a_body_that_stalls_gets_408_and_is_closed(server: tuple[int, int]) -> None:
    port, _ = server
    body = callback()
    with connect(port) as sock:
        sock.sendall(post(DLR, body)[: -len(body) // 2])
        answer = read_until_closed(sock)
    assert status_of(answer) == 408
    assert valid_callback(port) == 200


@pytest.mark.slow
def test_stalled_connections_beyond_the_fd_limit_leave_room_for_callbacks(
    tmp_path: Path,
) -> None:
    process, port = start_server(tmp_path, "", open_files=256)  # default (10 s) timeouts
    stalled: list[socket.socket] = []
    try:
        for _ in range(300):
            sock = connect(port)
            stalled.append(sock)
            with contextlib.suppress(OSError):
                sock.sendall(b"POST /hooks/sms/dlr HTTP/1.1\r\nHost: relay.test\r\n")
        assert [valid_callback(port) for _ in range(5)] == [200] * 5
        oldest = stalled[0]
        oldest.settimeout(READ_TIMEOUT)
        assert status_of(read_until_closed(oldest)) == 408  # closed to make room
    finally:
        for sock in stalled:
            sock.close()
        stop(process)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_pipelined_requests_whose_answers_are_never_read_are_cut_off(tmp_path: Path) -> None:
    """uvicorn reads and queues every pipelined request: 15 MB of them, sent by a client that
    reads no answer, took 850 MB. The guard closes a connection past 16 unhandled requests."""
    process, port = start_server(tmp_path, LIMITS)
    try:
        before = rss_bytes(process.pid)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(READ_TIMEOUT)
        sock.connect(("127.0.0.1", port))
        block = b"GET /healthz HTTP/1.1\r\nHost: relay.test\r\n\r\n" * 1900
        sent, limit, deadline = 0, 8 << 20, time.monotonic() + 10
        with contextlib.suppress(OSError):  # the server closes: a broken pipe or a reset
            while sent < limit and time.monotonic() < deadline:
                sent += sock.send(block)
        sock.close()
        assert sent < limit
        assert rss_bytes(process.pid) - before < 32 << 20
        assert valid_callback(port) == 200
    finally:
        stop(process)
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log
    assert "ERROR" not in log


@pytest.mark.slow
def test_upgrade_requests_are_answered_without_a_log_line_each(tmp_path: Path) -> None:
    """No receiver speaks WebSocket or h2c: such requests are plain HTTP/1.1 to us, and a
    stranger sending thousands must not write two warnings for each."""
    process, port = start_server(tmp_path, LIMITS)
    try:
        for upgrade in ("websocket", "h2c") * 10:
            with connect(port) as sock:
                sock.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close, Upgrade\r\n"
                    + f"Upgrade: {upgrade}\r\n\r\n".encode()
                )
                assert status_of(read_until_closed(sock)) == 200
        assert valid_callback(port) == 200
    finally:
        stop(process)
    assert "upgrade" not in (tmp_path / "server.log").read_text().lower()


@pytest.mark.slow
def test_a_request_the_parser_cannot_read_gets_a_400_problem(server: tuple[int, int]) -> None:
    port, _ = server
    for head in (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\x00y\r\n\r\n",
    ):
        with connect(port) as sock:
            sock.sendall(head)
            answer = read_until_closed(sock)
        assert status_of(answer) == 400, head
        assert b"application/problem+json" in answer
    assert valid_callback(port) == 200


@pytest.mark.slow
def test_a_stop_waits_for_a_strangers_slow_body_no_longer_than_the_shutdown_cap(
    tmp_path: Path,
) -> None:
    """A body that would take a minute (body_timeout) does not hold SIGTERM up that long."""
    process, port = start_server(tmp_path, 'body_timeout = "60s"\n')
    with connect(port) as sock:
        body = callback()
        sock.sendall(post(DLR, body)[: -len(body) // 2])
        time.sleep(0.2)  # let the server start reading it
        started = time.monotonic()
        process.terminate()
        process.wait(timeout=30)
    assert time.monotonic() - started < SHUTDOWN_SECONDS + 5


@pytest.mark.slow
def test_keep_alive_and_pipelined_requests_then_a_stalled_head(server: tuple[int, int]) -> None:
    port, _ = server
    with connect(port) as sock:
        for _ in range(3):
            sock.sendall(post(DLR, callback()))
            [(status, _)] = read_answers(sock, 1)
            assert status == 200
        bodies = [callback() for _ in range(3)]
        sock.sendall(b"".join(post(DLR, body) for body in bodies))  # pipelined, one write
        answers = read_answers(sock, 3)
        assert [status for status, _ in answers] == [200] * 3
        assert len({json.loads(body)["id"] for _, body in answers}) == 3
        sock.sendall(b"POST /hooks/sms/dlr HTTP/1.1\r\n")  # the next head never ends
        assert status_of(read_until_closed(sock)) == 408


def chunked(body: bytes, size: int = 50) -> bytes:
    pieces = [body[start : start + size] for start in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


@pytest.mark.slow
def test_chunked_callback_then_a_chunked_body_that_stalls(server: tuple[int, int]) -> None:
    port, _ = server
    head = (
        f"POST {DLR} HTTP/1.1\r\nHost: relay.test\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    with connect(port) as sock:
        body = callback()
        sock.sendall(head + chunked(body))
        [(status, answer)] = read_answers(sock, 1)
        assert status == 200
        assert json.loads(answer)["id"]
        sock.sendall(head + chunked(callback())[:60])  # a chunk, then nothing
        assert status_of(read_until_closed(sock)) == 408


async def test_at_the_cap_with_every_request_in_flight_a_new_connection_gets_503() -> None:
    """In process: an app that holds every request until released; 16 connections at most."""
    release = asyncio.Event()

    async def held(request: Request) -> Response:
        await release.wait()
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", held)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings(max_connections=16)
    config = server_config(app, settings, "127.0.0.1", port, "warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        request = b"GET / HTTP/1.1\r\nHost: relay.test\r\n\r\n"
        held_connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(16)]
        for _, writer in held_connections:
            writer.write(request)
            await writer.drain()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        refused = await asyncio.wait_for(reader.read(), READ_TIMEOUT)
        writer.close()
        assert status_of(refused) == 503
        assert b"Connection: close" in refused
        release.set()
        for reader, writer in held_connections:
            assert status_of(await asyncio.wait_for(reader.readline(), READ_TIMEOUT)) == 200
            writer.close()
    finally:
        release.set()
        server.should_exit = True
        await task
        sock.close()


class Recorder(asyncio.Protocol):
    """Stands in for uvicorn's protocol: keeps what it is handed."""

    def __init__(self, **options: object) -> None:
        self.data = bytearray()

    def data_received(self, data: bytes) -> None:
        self.data += data


class Socketless(asyncio.Transport):
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


GUARD_LIMITS = EdgeLimits(
    max_header_bytes=512, max_headers=8, header_timeout=5, body_timeout=5, max_connections=16
)


def head_of(size: int, method: str = "GET") -> bytes:
    """A head of exactly ``size`` bytes (blank line included), filled by one field."""
    start = f"{method} / HTTP/1.1\r\nHost: t\r\nX-Fill: ".encode()
    return start + b"f" * (size - len(start) - 4) + b"\r\n\r\n"


def play(stream: bytes, cuts: list[int]) -> tuple[bytes, bytes, bool]:
    """Send ``stream`` through a guarded connection in reads cut at ``cuts``:
    (what uvicorn's protocol got, what the guard answered, whether it closed)."""
    guard = ConnectionGuard(GUARD_LIMITS)
    connection = guard.protocol_factory(Recorder)()
    transport = Socketless()
    connection.connection_made(transport)
    inner = connection.inner
    assert isinstance(inner, Recorder)
    for start, end in itertools.pairwise([0, *cuts, len(stream)]):
        connection.data_received(stream[start:end])
    connection.connection_lost(None)
    return bytes(inner.data), bytes(transport.written), transport.closed


def random_cuts(rng: random.Random, size: int) -> list[int]:
    return sorted(rng.sample(range(1, size), rng.randint(0, min(12, size - 1))))


async def test_pipelined_requests_pass_whole_however_they_are_cut() -> None:
    blank_lines = b"\r\n\r\n" * 10  # more than the guard tries as a chunked body's end
    stream = b"".join(
        [
            head_of(GUARD_LIMITS.max_header_bytes),
            post("/a", b'{"text": "two\r\n\r\nparagraphs"}'),
            b"POST /b HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
            chunked(b"x" * 70 + blank_lines + b"y", size=40),
            head_of(100),
        ]
    )
    rng = random.Random(20260101)
    for _ in range(300):
        assert play(stream, random_cuts(rng, len(stream))) == (stream, b"", False)


async def test_head_and_field_limits_are_exact_however_the_reads_are_cut() -> None:
    over = head_of(GUARD_LIMITS.max_header_bytes + 1)
    fields = "".join(f"X-{n}: {n}\r\n" for n in range(GUARD_LIMITS.max_headers))
    many = f"GET / HTTP/1.1\r\n{fields}X-One-More: 1\r\n\r\n".encode()
    first = post("/a", b"{}")  # read in full, and not answered yet
    rng = random.Random(7)
    for stream, answer in ((over, 431), (many, 431), (first + over, 0), (first + many, 0)):
        for _ in range(100):
            passed, answered, closed = play(stream, random_cuts(rng, len(stream)))
            assert closed
            assert len(passed) < len(stream)
            # with a request unanswered, an answer of the guard would take its place: none
            assert (status_of(answered) if answered else 0) == answer


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_header_bytes = 0", "max_header_bytes: Input should be greater than or equal to 1024"),
        ("max_header_bytes = 1073741824", "max_header_bytes: Input should be less than or equal"),
        ("max_headers = -1", "max_headers: Input should be greater than or equal to 8"),
        ('header_timeout = "0s"', "header_timeout: Value error, must be between 100ms and 1h"),
        ('body_timeout = "2d"', "body_timeout: Value error, must be between 100ms and 1h"),
        ("max_connections = 0", "max_connections: Input should be greater than or equal to 16"),
    ],
)
def test_absurd_limits_are_refused(tmp_path: Path, line: str, message: str) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(line + "\n")
    with pytest.raises(SettingsError) as refused:
        load_settings(config)
    assert message in str(refused.value)


def test_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_HEADER_TIMEOUT", "500ms")
    monkeypatch.setenv("RELAY_MAX_CONNECTIONS", "")
    settings = Settings()
    assert settings.header_timeout.total_seconds() == 0.5
    assert settings.max_connections is None
