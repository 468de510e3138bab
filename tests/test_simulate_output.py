"""What `relay simulate` prints: one plain line per failed attempt (its status code or connection
error, and when the platform tries again) and the summary when its output is not a terminal;
a progress bar above which those lines appear when it is. And the progress helper itself."""

from __future__ import annotations

import dataclasses
import io
import json
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from relay.delivery.policies import BUILTIN_POLICIES
from relay.observe import progress
from relay.observe.progress import BEFORE_LINE, Bar, is_terminal
from relay.simulator.cli import simulate
from relay.simulator.clocks import VirtualClock
from relay.simulator.platform import Attempt, Platform
from relay.simulator.report import failure_line, given_up_line, render
from relay.simulator.scenarios import SCENARIOS, Callback
from relay.simulator.wire import Endpoint
from tests.support import free_port

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CONTROL = ("\r", "\x1b")
# sms-inbound: one callback per instance, retried every 10 s; 0.0001 makes that 1 ms
FAST = ("--time-scale", "0.0001", "--seed", "3")


class Scripted(ThreadingHTTPServer):
    """A receiver on 127.0.0.1 that answers the scripted status codes in order, then 200."""

    def __init__(self, statuses: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.statuses = statuses
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks?token=t"

    def next_status(self) -> int:
        with self.lock:
            return self.statuses.pop(0) if self.statuses else 200


class _Answer(BaseHTTPRequestHandler):
    server: Scripted

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(self.server.next_status())
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Scripted]:
    """A real receiver on 127.0.0.1 that answers 503, then 500, then 200 to everything."""
    server = Scripted([503, 500])
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def simulate_run(*args: str) -> Result:
    return CliRunner().invoke(simulate, list(args), catch_exceptions=False)


def test_piped_output_is_a_line_per_failed_attempt_then_the_summary(receiver: Scripted) -> None:
    ran = simulate_run("sms-inbound", "--url", receiver.url, *FAST)

    assert ran.exit_code == 0, ran.output
    assert ran.stderr == ""  # no bar, not even its label
    assert not any(c in ran.stdout for c in CONTROL)
    first, second, *summary = ran.stdout.splitlines()
    assert first.startswith("attempt 1 of sms.inbound ")
    assert "failed: HTTP 503 Service Unavailable (" in first
    assert "; next attempt at 20" in first
    assert second.startswith("attempt 2 of sms.inbound ")
    assert "failed: HTTP 500 Internal Server Error (" in second
    assert summary[0] == "events      1"
    assert summary[1] == "attempts    3 (2 retries, 0 duplicates sent)"
    assert summary[2] == "answers     200: 1, 500: 1, 503: 1"
    assert summary[4] == "given up    0"


def test_the_next_attempt_time_is_when_the_platform_sends_again(receiver: Scripted) -> None:
    ran = simulate_run("sms-inbound", "--url", receiver.url, "--json", *FAST)

    assert ran.exit_code == 0, ran.output
    first, second, third = json.loads(ran.stdout)["attempts"]  # stdout is the JSON alone
    assert [a["status_code"] for a in (first, second, third)] == [503, 500, 200]
    assert first["next_attempt_at"] == second["scheduled_at"]
    assert second["next_attempt_at"] == third["scheduled_at"]
    assert third["next_attempt_at"] is None
    when = datetime.fromisoformat(second["scheduled_at"]).isoformat(timespec="seconds")
    lines = ran.stderr.splitlines()  # with --json, the lines go to stderr
    assert len(lines) == 2 and lines[0].endswith(f"; next attempt at {when}")
    assert f" {first['event']} failed: HTTP 503" in lines[0]


def test_a_connection_error_is_named_and_the_callback_given_up() -> None:
    url = f"http://127.0.0.1:{free_port()}/hooks"
    ran = simulate_run("numinfo-gnp", "--url", url, "--no-retry", *FAST)

    assert ran.exit_code == 1
    line, *summary = ran.stdout.splitlines()
    assert line.startswith("attempt 1 of numinfo.gnp ")
    assert line.endswith("failed: connection refused; given up")
    assert "given up    1" in summary


def test_on_a_terminal_the_lines_appear_above_a_progress_bar(
    receiver: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)

    ran = simulate_run("sms-inbound", "--url", receiver.url, "--count", "2", *FAST)

    assert ran.exit_code == 0, ran.output
    failed = [line for line in ran.stdout.splitlines() if line.startswith("attempt ")]
    assert sorted(line.split("HTTP ")[1][:3] for line in failed) == ["500", "503"]
    assert "sms-inbound" in ran.stderr and "2/2" in ran.stderr  # the bar, on stderr
    assert ran.stderr.count(BEFORE_LINE) == 2  # erased before each line printed above it


async def test_a_pause_of_the_platform_is_in_the_next_attempt_time() -> None:
    pausing = dataclasses.replace(
        BUILTIN_POLICIES["platform-sms"],
        pause_after=2,
        pause_for=timedelta(minutes=10),
        max_attempts=4,
    )
    failures: list[Attempt] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_always(500))) as client:
        platform = Platform(
            client,
            Endpoint.parse("http://receiver.test/hooks"),
            clock=VirtualClock(START),
            policies={"platform-sms": pausing},
            on_failure=failures.append,
        )
        result = await platform.deliver(SCENARIOS["sms-inbound"].build(random.Random(1), {})[0])

    assert failures == result.attempts and result.given_up and len(failures) == 4
    times = [a.scheduled_at for a in result.attempts]
    assert times[1] - times[0] == timedelta(seconds=10)
    assert times[2] - times[1] == timedelta(minutes=10)  # paused after 2 failures
    assert [a.next_attempt_at for a in result.attempts[:-1]] == times[1:]
    assert result.attempts[-1].next_attempt_at is None
    assert failure_line(result.attempts[-1]).endswith("; given up")


async def test_a_pause_past_the_give_up_time_is_said_once_the_callback_is_given_up() -> None:
    pausing = dataclasses.replace(
        BUILTIN_POLICIES["platform-sms"],
        pause_after=2,
        pause_for=timedelta(hours=1),
        give_up_after=timedelta(minutes=15),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_always(500))) as client:
        platform = Platform(
            client,
            Endpoint.parse("http://receiver.test/hooks"),
            clock=VirtualClock(START),
            policies={"platform-sms": pausing},
        )
        result = await platform.deliver(SCENARIOS["sms-inbound"].build(random.Random(1), {})[0])

    assert result.given_up and len(result.attempts) == 2
    assert result.attempts[-1].next_attempt_at == START + timedelta(hours=1, seconds=10)
    line = given_up_line(result)
    assert line is not None and "given up after attempt 2" in line


async def test_a_failed_duplicate_is_reported_and_not_retried() -> None:
    answers = iter([200, 500])
    failures: list[Attempt] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_answers(answers))) as client:
        platform = Platform(
            client,
            Endpoint.parse("http://receiver.test/hooks"),
            clock=VirtualClock(START),
            duplicate_rate=1.0,
            on_failure=failures.append,
        )
        result = await platform.deliver(Callback("tts.event", {"callId": "c1"}, "completed"))

    assert result.answers == [200, 500] and not result.given_up
    [duplicate] = failures
    line = failure_line(duplicate)
    assert line.startswith("duplicate (attempt 2) of tts.event c1:completed failed: HTTP 500")
    assert line.endswith("; not retried") and given_up_line(result) is None


def _always(status: int) -> Any:
    return _answers(iter(lambda: status, None))


def _answers(statuses: Iterator[int]) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": next(statuses), "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


# --- the progress helper ---------------------------------------------------------------------


def test_a_bar_is_drawn_on_a_terminal() -> None:
    screen, out = io.StringIO(), io.StringIO()
    with Bar("sending", 3, stream=screen, terminal=True) as bar:
        bar.advance()
        bar.echo("a line above", file=out)
        bar.advance(2)

    drawn = screen.getvalue()
    assert drawn.startswith("\r") and drawn.endswith("\n")
    assert "sending" in drawn and "0/3" in drawn and "1/3" in drawn and "3/3" in drawn
    erased = drawn.index(BEFORE_LINE)
    assert "1/3" in drawn[erased:]  # drawn again below the line
    assert out.getvalue() == "a line above\n"


def test_nothing_is_drawn_when_the_stream_is_not_a_terminal() -> None:
    screen, out = io.StringIO(), io.StringIO()
    with Bar("sending", 3, stream=screen, terminal=False) as bar:
        bar.advance(3)
        bar.echo("a line", file=out)

    assert screen.getvalue() == ""
    assert out.getvalue() == "a line\n"
    assert not bar.shown


def test_the_bar_appears_once_its_total_is_known() -> None:
    screen = io.StringIO()
    with Bar("replaying", stream=screen, terminal=True) as bar:
        assert screen.getvalue() == ""
        bar.update(0, 4)
        bar.update(4)
    assert "0/4" in screen.getvalue() and "4/4" in screen.getvalue()


def test_by_default_the_stream_decides() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert Bar("x", 1, stream=Tty()).shown
    assert not Bar("x", 1, stream=io.StringIO()).shown
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)
    assert not is_terminal(_NoIsatty())  # type: ignore[arg-type]


class _NoIsatty:
    def write(self, text: str) -> int:
        return len(text)


def test_the_summary_counts_read_right_in_the_singular() -> None:
    summary = {
        "events": 1,
        "attempts": 2,
        "retries": 1,
        "duplicates_sent": 1,
        "answers": {200: 2},
        "latency_p50_ms": 1,
        "latency_p99_ms": 1,
        "given_up": 0,
        "elapsed_s": 0.1,
    }
    assert "attempts    2 (1 retry, 1 duplicate sent)" in render(summary).splitlines()
