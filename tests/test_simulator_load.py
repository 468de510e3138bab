"""`relay simulate` at load-test speed: the open-loop pacer (an injected clock, no waiting), the
fixed pool of workers, the lean HTTP/1.1 client (keep-alive, answers of every shape, errors),
the choice of client, the achieved rate and answer percentiles in the report, the progress
line on a terminal only, and hostile values of the new options."""

from __future__ import annotations

import asyncio
import json
import math
import os
import pty
import random
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from relay.simulator.cli import simulate
from relay.simulator.clocks import VirtualClock
from relay.simulator.http1 import Http1Sender
from relay.simulator.platform import Platform
from relay.simulator.report import render, summarize
from relay.simulator.run import Pacer, RunOptions, plan, run_units
from relay.simulator.scenarios import SCENARIOS
from relay.simulator.senders import HttpxSender, NoAnswer, SendFailed, sender_for
from relay.simulator.wire import Endpoint, Prepared
from tests.store_support import eventually
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[1]

# --- the pacer: a schedule, tested on an injected clock --------------------------------------


class FakeTime:
    """A monotonic clock that only moves when slept on (or when a test moves it)."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def let_go(pacer: Pacer, clock: FakeTime) -> float:
    await pacer.wait()
    return clock.now


async def test_with_a_rate_callback_i_goes_at_start_plus_i_over_rate() -> None:
    clock = FakeTime()
    pacer = Pacer(4, now=clock, sleep=clock.sleep)

    times = [await let_go(pacer, clock) for _ in range(5)]

    assert times == [100.0, 100.25, 100.5, 100.75, 101.0]
    assert pacer.sent == 5 and pacer.achieved_rate == 4.0


async def test_a_slow_answer_does_not_push_the_schedule_back() -> None:
    clock = FakeTime()
    pacer = Pacer(4, now=clock, sleep=clock.sleep)
    await pacer.wait()  # callback 0 at 100.0
    clock.now += 1.0  # its answer took a second: callbacks 1 to 4 are due by now

    late = [await let_go(pacer, clock) for _ in range(4)]
    on_time = [await let_go(pacer, clock) for _ in range(2)]

    assert late == [101.0] * 4  # sent at once, to catch up
    assert on_time == [101.25, 101.5]  # back on the original grid: no drift
    assert pacer.achieved_rate == pytest.approx(6 / 1.5)


async def test_without_a_rate_nothing_waits_and_the_rate_is_still_measured() -> None:
    clock = FakeTime()
    pacer = Pacer(None, now=clock, sleep=clock.sleep)
    assert pacer.achieved_rate is None
    for _ in range(3):
        await pacer.wait()
        clock.now += 0.5

    assert clock.slept == []
    assert pacer.sent == 3 and pacer.achieved_rate == 2.0


def test_the_due_time_of_any_callback() -> None:
    clock = FakeTime()
    assert Pacer(1000, now=clock).due(5000) == pytest.approx(105.0)


@pytest.mark.parametrize("rate", [0, -1, math.inf, math.nan])
def test_a_rate_that_is_no_positive_finite_number_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="positive, finite"):
        Pacer(rate)


# --- the pool of workers ---------------------------------------------------------------------


class Counting:
    """A sender that answers 200 after letting the other workers run, counting requests and
    how many were in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.bodies: list[bytes | None] = []

    async def send(self, prepared: Prepared, headers: Mapping[str, str], timeout: float) -> int:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.bodies.append(prepared.body)
        for _ in range(3):
            await asyncio.sleep(0)  # a yield, not a wait: let every worker reach its send
        self.in_flight -= 1
        return 200

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("concurrency", [1, 7, 500])
async def test_the_workers_send_every_callback_once_at_most_concurrency_at_a_time(
    concurrency: int,
) -> None:
    rng = random.Random(9)
    options = RunOptions(count=60, concurrency=concurrency)
    units = plan(SCENARIOS["tts-call"], options, rng)
    sender = Counting()
    platform = Platform(
        sender, Endpoint.parse("http://receiver.test/hooks"), clock=VirtualClock(), rng=rng
    )

    results = await run_units(platform, units, options)

    assert [r.callback for r in results] == [c for unit in units for c in unit]  # unit order
    assert len(sender.bodies) == len(set(sender.bodies)) == len(results)
    assert sender.most == min(concurrency, len(units))


# --- the lean client -------------------------------------------------------------------------


class RawServer:
    """An asyncio server answering each request with the next scripted bytes (``None``: no
    answer at all); it keeps the request heads and counts connections."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = answers
        self.heads: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self.hang_up = False
        """Close each connection after its first answer (an idle time-out, say)."""
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")), 0,
                )  # fmt: skip
                await reader.readexactly(length)
                self.heads.append(head)
                answer = self.answers.pop(0) if self.answers else OK
                if answer is None:
                    await asyncio.Event().wait()  # never answers
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer or b"HTTP/1.0" in answer[:8] or self.hang_up:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed += 1


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture
async def raw() -> AsyncIterator[RawServer]:
    server = RawServer([])
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listening.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listening.close()


def request(port: int, path: str = "/hooks/sms/dlr", body: bytes | None = b"{}") -> Prepared:
    query = (("token", "a b&c"),)
    method = "POST" if body is not None else "GET"
    return Prepared(method, f"http://127.0.0.1:{port}{path}", query, body, {})


async def test_requests_share_keep_alive_connections_and_carry_the_endpoint_s_parts(
    raw: RawServer,
) -> None:
    endpoint = Endpoint.parse(f"http://user:s3cret@127.0.0.1:{raw.port}/hooks?token=t")
    sender = Http1Sender(endpoint, 2)
    raw.answers = [b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", OK, OK, OK]

    statuses = [await sender.send(request(raw.port), {"x-custom": "v"}, 5) for _ in range(4)]
    await sender.aclose()

    assert statuses == [503, 200, 200, 200]
    assert raw.connections == 1  # one after the other: the same connection each time
    first = raw.heads[0].decode()
    assert first.startswith("POST /hooks/sms/dlr?token=a+b%26c HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{raw.port}\r\n" in first
    assert "Authorization: Basic dXNlcjpzM2NyZXQ=\r\n" in first
    assert "x-custom: v\r\n" in first and "Content-Length: 2\r\n" in first


async def test_a_connection_the_receiver_closed_while_idle_is_not_reused(raw: RawServer) -> None:
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{raw.port}"), 1)
    raw.hang_up = True

    assert await sender.send(request(raw.port), {}, 5) == 200
    await eventually(lambda: raw.closed == 1)
    assert await sender.send(request(raw.port), {}, 5) == 200
    await sender.aclose()
    assert raw.connections == 2


async def test_no_more_connections_than_asked_for(raw: RawServer) -> None:
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{raw.port}"), 3)

    statuses = await asyncio.gather(*(sender.send(request(raw.port), {}, 5) for _ in range(30)))
    await sender.aclose()

    assert statuses == [200] * 30 and raw.connections == 3


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.0 202 Accepted\r\n\r\nread until the connection closes",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ],
)
async def test_answers_of_every_shape_give_their_status_and_the_next_request_goes_through(
    raw: RawServer, answer: bytes
) -> None:
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{raw.port}"), 1)
    raw.answers = [answer]

    first = await sender.send(request(raw.port, body=None), {}, 5)
    second = await sender.send(request(raw.port), {}, 5)
    await sender.aclose()

    assert first == int(answer.rsplit(b"HTTP/1.", 1)[1][2:5])
    assert second == 200


async def test_a_garbage_answer_fails_the_attempt_and_its_connection_is_not_reused(
    raw: RawServer,
) -> None:
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{raw.port}"), 1)
    raw.answers = [b"SMTP ready\r\n\r\n"]

    with pytest.raises(SendFailed, match="bad answer"):
        await sender.send(request(raw.port), {}, 5)
    assert await sender.send(request(raw.port), {}, 5) == 200
    await sender.aclose()
    assert raw.connections == 2


async def test_no_answer_within_the_time_out(raw: RawServer) -> None:
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{raw.port}"), 1)
    raw.answers = [None]

    with pytest.raises(NoAnswer):
        await sender.send(request(raw.port), {}, 0.05)
    assert await sender.send(request(raw.port), {}, 5) == 200  # on a new connection
    await sender.aclose()


async def test_a_refused_connection_is_named() -> None:
    port = free_port()
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{port}"), 1)
    with pytest.raises(SendFailed, match=r"^connection refused$"):
        await sender.send(request(port), {}, 5)


@pytest.mark.parametrize(
    "headers", [{"x-a": "v\r\nx-injected: 1"}, {"x-a\nb": "v"}, {"x-a": "v\rw"}]
)
async def test_a_line_break_in_a_header_is_never_sent(raw: RawServer, headers: dict) -> None:
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{raw.port}"), 1)
    with pytest.raises(SendFailed, match="line break"):
        await sender.send(request(raw.port), headers, 5)
    assert raw.heads == []


async def test_a_header_that_is_no_latin_1_text_fails_the_attempt(raw: RawServer) -> None:
    sender = Http1Sender(Endpoint.parse(f"http://127.0.0.1:{raw.port}"), 1)
    with pytest.raises(SendFailed, match="Latin-1"):
        await sender.send(request(raw.port), {"x-a": "\u20ac"}, 5)


# --- which client --------------------------------------------------------------------------


def test_the_lean_client_for_http_and_httpx_for_https_or_when_asked() -> None:
    plain = Endpoint.parse("http://127.0.0.1:8000/hooks")
    secure = Endpoint.parse("https://example.test/hooks")
    assert isinstance(sender_for(plain, 5), Http1Sender)
    assert isinstance(sender_for(plain, 5, "lean"), Http1Sender)
    assert isinstance(sender_for(plain, 5, "httpx"), HttpxSender)
    assert isinstance(sender_for(secure, 5), HttpxSender)
    with pytest.raises(ValueError, match="plain http"):
        sender_for(secure, 5, "lean")
    with pytest.raises(ValueError, match="unknown client"):
        sender_for(plain, 5, "curl")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        sender_for(plain, 0)
    with pytest.raises(ValueError, match="plain http"):
        Http1Sender(secure, 1)


# --- the command ---------------------------------------------------------------------------


class Recording(ThreadingHTTPServer):
    """A keep-alive receiver on 127.0.0.1 that keeps every body and answers the scripted
    status codes in order, then 200."""

    def __init__(self, statuses: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), _Keep)
        self.statuses = statuses
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks?token=t"


class _Keep(BaseHTTPRequestHandler):
    server: Recording
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with self.server.lock:
            self.server.bodies.append(body or self.path.encode())
            status = self.server.statuses.pop(0) if self.server.statuses else 200
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Recording]:
    server = Recording([503, 500])
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run(*args: str) -> Result:
    return CliRunner().invoke(simulate, list(args), catch_exceptions=False)


def test_every_callback_sent_is_a_distinct_one(receiver: Recording) -> None:
    receiver.statuses.clear()
    ran = run("sms-dlr", "--url", receiver.url, "--count", "40", "--concurrency", "8", "--json")

    assert ran.exit_code == 0, ran.output
    summary = json.loads(ran.stdout)["summary"]
    reports = [json.loads(body) for body in receiver.bodies]
    assert len(reports) == summary["attempts"] == summary["events"] >= 80
    assert len({(r["requestId"], r["status"]) for r in reports}) == len(reports)
    assert len({r["requestId"] for r in reports}) == 40


@pytest.mark.parametrize("client", ["lean", "httpx"])
def test_both_clients_play_the_same_retries(receiver: Recording, client: str) -> None:
    ran = run("sms-inbound", "--url", receiver.url, "--client", client, "--json",
              "--time-scale", "0.0001", "--seed", "3")  # fmt: skip

    assert ran.exit_code == 0, ran.output
    attempts = json.loads(ran.stdout)["attempts"]
    assert [a["status_code"] for a in attempts] == [503, 500, 200]
    assert len(set(receiver.bodies)) == 1  # a retry resends the identical bytes


def test_the_report_gives_answer_percentiles_and_the_rate_sent(receiver: Recording) -> None:
    receiver.statuses.clear()
    ran = run("tts-call", "--url", receiver.url, "--count", "20", "--rate", "1000000", "--json")
    text = run("numinfo-gnp", "--url", receiver.url, "--count", "3", "--rate", "5000")

    summary = json.loads(ran.stdout)["summary"]
    assert summary["latency_p50_ms"] <= summary["latency_p99_ms"]
    assert summary["rate_asked_per_s"] == 1_000_000 and summary["rate_sent_per_s"] > 0
    assert "latency     p50 " in text.stdout
    assert "callbacks/s sent (asked 5000/s)" in text.stdout.splitlines()[-1]


def test_the_rate_line_says_nothing_asked_without_a_rate() -> None:
    class Paced(Pacer):
        achieved_rate = 12.5

    summary = summarize([], 1.0, Paced(None))
    assert summary["rate_asked_per_s"] is None
    assert render(summary).splitlines()[-1] == "rate        12.5 callbacks/s sent"
    assert "rate " not in render(summarize([], 1.0))


@pytest.mark.parametrize(
    ("option", "value"),
    [
        *[("--rate", v) for v in ("0", "-1", "abc", "", "1e300", "inf", "nan", "-inf")],
        *[("--concurrency", v) for v in ("0", "-1", "abc", "", "99999999999", "1.5")],
        *[("--client", v) for v in ("", "curl", "LEAN ")],
        *[("--loop", v) for v in ("", "trio")],
        ("--header", "x-a: v\r\nx-injected: 1"),
    ],
)
def test_hostile_values_of_the_options_are_usage_errors(option: str, value: str) -> None:
    url = f"http://127.0.0.1:{free_port()}/hooks"
    ran = CliRunner().invoke(simulate, ["numinfo-gnp", "--url", url, option, value])

    assert ran.exit_code == 2, ran.output
    assert "Invalid value" in ran.output and option in ran.output
    assert ran.exception is None or isinstance(ran.exception, SystemExit)


def test_the_lean_client_on_an_https_url_is_a_usage_error() -> None:
    ran = CliRunner().invoke(
        simulate, ["numinfo-gnp", "--url", "https://example.test/hooks", "--client", "lean"]
    )
    assert ran.exit_code == 2 and "--client" in ran.output and "plain http" in ran.output


# --- the progress line: on a terminal only ---------------------------------------------------


def _simulate_argv(url: str) -> list[str]:
    return [sys.executable, "-m", "relay", "simulate", "numinfo-gnp", "--url", url,
            "--count", "3", "--no-retry"]  # fmt: skip


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side is closed and all was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.slow
def test_the_progress_line_is_drawn_on_a_terminal_and_not_in_a_pipe(receiver: Recording) -> None:
    receiver.statuses.clear()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    primary, secondary = pty.openpty()
    try:
        on_tty = subprocess.run(_simulate_argv(receiver.url), stdout=subprocess.PIPE,
                                stderr=secondary, env=env, timeout=120, check=False)  # fmt: skip
        os.close(secondary)
        screen = _read_all(primary).decode()
    finally:
        os.close(primary)
    piped = subprocess.run(_simulate_argv(receiver.url), capture_output=True, env=env,
                           timeout=120, check=False)  # fmt: skip

    assert on_tty.returncode == piped.returncode == 0
    assert "numinfo-gnp" in screen and "3/3" in screen  # the bar, on the terminal
    assert piped.stderr == b""  # no bar, no control character in a pipe
    assert on_tty.stdout.decode().startswith("events      3")
    assert b"\r" not in on_tty.stdout and b"\x1b" not in on_tty.stdout
