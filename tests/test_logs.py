"""What `relay serve` and `relay worker` print: text or JSON lines, the level chosen, a delivery's
context on its records, secrets masked in every part of a line whatever logger wrote it."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from relay.cli import main
from relay.dispatch.worker import queue_line, started_line
from relay.observe.known_secrets import KnownSecrets
from relay.observe.logs import configure_logging
from relay.server.runtime import relay_queue
from relay.settings import Settings
from tests.conftest import REDIS_URL, TOKEN
from tests.store_support import child_environment
from tests.support import free_port


@pytest.fixture
def root_logger() -> Iterator[None]:
    """Put the root logger back as it was after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def captured(log_format: str, level: str = "info") -> io.StringIO:
    stream = io.StringIO()
    handler = configure_logging(level, log_format)  # type: ignore[arg-type]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    return stream


CONTEXT = {"event_id": "e1", "delivery_id": "d1", "destination": "crm", "attempt": 2}


def test_json_lines_carry_the_context_and_mask_tokens(root_logger: None) -> None:
    stream = captured("json")
    logging.getLogger("relay.delivery").info("attempt %d failed", 2, extra=CONTEXT)
    logging.getLogger("anything.else").warning("GET /hooks/sms/dlr?token=%s", "s3cret-value")
    logging.getLogger("relay.delivery").debug("not shown at info")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("relay").exception("with a traceback")

    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["message"] == "attempt 2 failed" and first["level"] == "info"
    assert first["logger"] == "relay.delivery" and first["time"].endswith("+00:00")
    assert {key: first[key] for key in CONTEXT} == CONTEXT
    assert second["message"] == "GET /hooks/sms/dlr?token=***"
    assert "s3cret-value" not in stream.getvalue()
    assert "ValueError: boom" in third["exception"]


def test_text_lines_append_the_context(root_logger: None) -> None:
    stream = captured("text", "warning")
    logging.getLogger("relay.delivery").info("below the level")
    logging.getLogger("relay.delivery").warning("dead", extra=CONTEXT)
    [line] = stream.getvalue().splitlines()
    assert line.endswith(
        " WARNING relay.delivery: dead event_id=e1 delivery_id=d1 destination=crm attempt=2"
    )


def test_an_unknown_level_is_refused(root_logger: None) -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("loud")


@pytest.mark.parametrize(
    ("option", "value"), [("--log-format", "xml"), ("--log-level", "loud"), ("--log-format", "")]
)
@pytest.mark.parametrize("command", ["serve", "worker"])
def test_bad_log_options_are_refused_before_start(command: str, option: str, value: str) -> None:
    result = CliRunner().invoke(main, [command, option, value])
    assert result.exit_code == 2 and "Invalid value" in result.output


def test_serve_prints_json_lines_with_the_worker_started_line(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "relay.db"}"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        '[destinations.crm]\ntype = "http"\nurl = "http://127.0.0.1:9/hook"\n'
    )
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "relay", "serve", "--port", str(port), "--log-format", "json"],
        cwd=tmp_path,  # finds ./relay.toml
        env={k: v for k, v in child_environment().items() if not k.startswith("RELAY_")},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[dict[str, object]] = []
    try:
        assert process.stderr is not None
        for raw in process.stderr:
            lines.append(json.loads(raw))
            if "Uvicorn running" in str(lines[-1]["message"]):
                break
        refused = httpx.post(  # a malformed token key: refused, and masked in the access line
            f"http://127.0.0.1:{port}/hooks/sms/inbound?token%3D{TOKEN}", content=b"{}", timeout=10
        )
        assert refused.status_code == 401
        for raw in process.stderr:
            lines.append(json.loads(raw))
            if lines[-1]["logger"] == "uvicorn.access":
                break
    finally:
        process.terminate()
        process.wait(timeout=30)
    messages = [str(line["message"]) for line in lines]
    [started] = [m for m in messages if m.startswith("relay worker started")]
    assert started == (
        "relay worker started: destinations crm (http); queue in this process (embedded); "
        f"database sqlite:///{tmp_path / 'relay.db'}; concurrency 50; event loop uvloop"
    )
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert str(lines[-1]["message"]).endswith(' - "POST /hooks/sms/inbound?*** HTTP/1.1" 401')
    assert TOKEN not in json.dumps(lines)


SECRET = 'Pa55-"quoted"\\back-é-0123456789'
"""A secret the settings hold, with what JSON and repr escape and what UTF-8 encodes."""


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize(
    "logger_name",
    ["relay.delivery", "httpx", "httpcore.http11", "uvicorn.access", "aiormq.connection", "nats"],
)
def test_every_part_of_a_printed_line_is_masked(
    root_logger: None, log_format: str, logger_name: str
) -> None:
    """Message, arguments, context, traceback and stack: masked whatever logger wrote them,
    the secrets the settings hold wherever they are, URL passwords and secret parameters
    wherever they appear, and every JSON line stays JSON."""
    stream = io.StringIO()
    handler = configure_logging("debug", log_format, KnownSecrets([SECRET]))  # type: ignore[arg-type]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    try:
        raise ValueError(f"cannot reach amqp://relay:other-pw@broker/?auth_token=t0k {SECRET!r}")
    except ValueError:
        record = logging.getLogger(logger_name).makeRecord(
            logger_name,
            logging.WARNING,
            __file__,
            1,
            "POST http://svc:%s@host/in?api_key=%s",
            (SECRET, "k3y-value"),
            sys.exc_info(),
            extra={"destination": f"crm {SECRET}", "user": SECRET, "attempt": 2},
            sinfo=f"Stack (most recent call last):\n  secret = {SECRET!r}",
        )
    handler.handle(record)
    printed = stream.getvalue()
    for secret in (SECRET, "other-pw", "t0k", "k3y-value", json.dumps(SECRET)[1:-1]):
        assert secret not in printed
    assert "http://svc:***@host/in?api_key=***" in printed
    assert "amqp://relay:***@broker/?auth_token=***" in printed
    if log_format == "json":
        [line] = printed.splitlines()
        entry = json.loads(line)
        assert entry["destination"] == "crm ***" and entry["user"] == "***"
        assert entry["attempt"] == 2 and entry["logger"] == logger_name
        assert "ValueError" in entry["exception"] and "***" in entry["exception"]
        assert entry["stack"].endswith("secret = '***'")
    else:
        assert "ValueError: cannot reach" in printed and "secret = '***'" in printed
        assert printed.rstrip().endswith("destination=crm *** attempt=2 user=***")


def test_a_secret_too_short_to_mask_is_named_once_at_start_without_its_value(
    root_logger: None, capsys: pytest.CaptureFixture[str]
) -> None:
    known = KnownSecrets(["guest"], too_short=["destinations.rabbit.url"])
    configure_logging("info", "text", known)
    warned = capsys.readouterr().err.splitlines()
    assert (
        len(warned) == 1
        and "WARNING relay.logs: the secret in destinations.rabbit.url" in (warned[0])
    )
    assert "guest" not in warned[0]


def test_the_worker_start_line_shows_the_database_without_any_of_its_password() -> None:
    settings = Settings(
        database_url="postgresql://relay:pa55/word?x#y@db.internal:5432/relay?sslmode=require",
        redis_url="redis://:redis-pa55word@redis.internal:6379/0",
    )
    line = started_line(settings, "asyncio")
    assert "database postgresql://db.internal:5432/relay;" in line
    assert "queue Redis at redis://redis.internal:6379/0;" in line
    assert "pa55" not in line and "word" not in line


def test_the_scaled_queue_line_names_redis_without_its_password_and_the_worker() -> None:
    line = queue_line("redis://:redis-pa55word@redis.internal:6379/0")
    assert "Redis at redis://redis.internal:6379/0:" in line
    assert "until a `relay worker` process" in line
    assert "pa55" not in line and "word" not in line


async def test_a_scaled_serve_logs_where_its_deliveries_wait(
    redis: object, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(redis_url=REDIS_URL)
    caplog.set_level(logging.INFO, logger="relay.serve")
    async with relay_queue(settings, None, lambda: None):  # type: ignore[arg-type]
        pass
    said = [r.getMessage() for r in caplog.records if r.name == "relay.serve"]
    assert said == [queue_line(REDIS_URL)]


def test_the_worker_start_line_names_twenty_destinations_and_counts_the_rest() -> None:
    http = {"type": "http", "url": "http://127.0.0.1:9/"}
    settings = Settings(destinations={f"d{n:04d}": http for n in range(2500)})
    line = started_line(settings, "asyncio")
    assert "destinations d0000 (http), d0001 (http)," in line
    assert "d0019 (http) and 2480 more;" in line and "d0020" not in line
    assert len(line) < 1000


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_record_that_cannot_be_printed_is_one_masked_line_without_its_arguments(
    root_logger: None, log_format: str
) -> None:
    stream = captured(log_format)
    logging.getLogger("some.library").warning(
        f"connect to http://u:{SECRET}@host as %s and %s", f"token={SECRET}"
    )
    [line] = stream.getvalue().splitlines()
    assert line.startswith("a record of some.library could not be printed (TypeError): ")
    assert "http://u:***@host" in line and SECRET not in line and "token=" not in line
