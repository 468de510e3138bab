"""URL secrets never reach a log line: a URL's password (or a userinfo token) and the values
of secret-looking query parameters, however the caller spells the parameter's name."""

from __future__ import annotations

import io
import logging

import pytest

from relay.observe.log_redaction import SECRET_ENDINGS, SECRET_NAMES, redact
from relay.observe.logs import TextLines

SECRET = "tok-AAAAAAAAAAAAAAAA-0123"


@pytest.mark.parametrize(
    "query",
    [
        f"token={SECRET}",
        f"%74oken={SECRET}",
        f"tok%65n={SECRET}",
        f"%74%6F%6B%65%6E={SECRET}",
        f"TOKEN={SECRET}",
        f"a=1&token={SECRET}&b=2",
        f"token=x&token={SECRET}",
    ],
)
def test_a_token_is_masked_in_an_access_log_line(query: str) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextLines())
    logger = logging.getLogger("test.redaction.access")
    logger.addHandler(handler)
    try:
        # uvicorn's access log: the path with its query is one of the arguments
        logger.warning(
            '%s - "%s %s HTTP/%s" %d',
            "127.0.0.1:5000",
            "POST",
            f"/hooks/sms/inbound?{query}",
            "1.1",
            200,
        )
    finally:
        logger.removeHandler(handler)
    assert SECRET not in stream.getvalue()
    assert "***" in stream.getvalue()


def test_other_parameters_are_left_alone() -> None:
    assert redact("/x?tokens=1&requestId=abc") == "/x?tokens=1&requestId=abc"


@pytest.mark.parametrize(
    ("query", "masked"),
    [
        (f"token%3D{SECRET}", "***"),
        (f"TOKEN%3d{SECRET}", "***"),
        (f"tok%2565n={SECRET}", "tok%2565n=***"),
        (f"%2574oken={SECRET}", "%2574oken=***"),
        (f"token[]={SECRET}", "token[]=***"),
        (f"token%5B%5D={SECRET}", "token%5B%5D=***"),
        (f"+token+={SECRET}", "+token+=***"),
        (f"token%3D{SECRET}=x", "***"),
        (f"token={SECRET}#top", "token=***#top"),
    ],
)
def test_a_malformed_token_key_is_masked(query: str, masked: str) -> None:
    line = f'127.0.0.1:5000 - "POST /hooks/sms/inbound?{query} HTTP/1.1" 401'
    assert redact(line) == f'127.0.0.1:5000 - "POST /hooks/sms/inbound?{masked} HTTP/1.1" 401'


def test_a_masked_part_leaves_the_next_parameters_alone() -> None:
    assert redact(f"/x?token%3D{SECRET}&msgid=1") == "/x?***&msgid=1"
    assert redact(f"/x?a=1&tok%2565n={SECRET}&b=2") == "/x?a=1&tok%2565n=***&b=2"


def test_parts_separated_by_semicolons_are_masked() -> None:
    assert redact(f"/x?a=1;token={SECRET};b=2") == "/x?a=1;token=***;b=2"
    assert redact(f"/x?a=1;token%3D{SECRET};b=2") == "/x?a=1;***;b=2"


@pytest.mark.parametrize(
    "query",
    [
        "msgid=1",
        "tokens=1",
        "token_id=1",
        "tok%3Den=1",
        "x=token",
        "a=b?token",
        "token",
        "api_key&password",
        "keyword=1",
        "monkey=1",
        "passenger=1",
        "signal=1",
        "author=1",
        "routing_key=1",
        "pk=1",
    ],
)
def test_keys_that_do_not_name_a_secret_are_left_alone(query: str) -> None:
    assert redact(f"/x?{query}&msgid=2") == f"/x?{query}&msgid=2"


@pytest.mark.parametrize(
    "line",
    [
        "/x?" + "a" * 1_000_000,
        "?" * 1_000_000,
        "/x?" + "&a=1" * 250_000,
        "/x?" + ";%25%2" * 166_000,
        "/x?" + "t" * 1_000_000,
        "/x?" + "%" * 1_000_000,
        "/x?" + "&[[[[[[[[[[" * 90_000,
    ],
)
def test_a_hostile_megabyte_line_is_redacted(line: str) -> None:
    # no timing assertion: a backtracking regex would hang here, a linear one takes milliseconds
    assert redact(line) == line


def test_a_megabyte_of_tokens_is_masked() -> None:
    assert redact("/x?" + f"&token%3D{SECRET}" * 30_000) == "/x?" + "&***" * 30_000
    assert redact("/x?token%3D" + "%2525" * 200_000) == "/x?***"


def spellings(name: str) -> list[str]:
    """How a caller may spell a parameter's name that a server still reads as ``name``."""
    escaped = f"%{ord(name[0]):02X}{name[1:]}"
    kelvin = [name.replace("k", "\u212a")] if "k" in name else []
    return [name, name.upper(), escaped, f"%25{escaped[1:]}", f"{name}[]", *kelvin]


SECRET_PARAMETERS = [
    *sorted(SECRET_NAMES),
    *(f"x_{ending}" for ending in SECRET_ENDINGS),
    "access_token",
    "client_secret",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "db_password",
    "x-api-key",
]


@pytest.mark.parametrize("name", SECRET_PARAMETERS)
def test_every_secret_parameter_is_masked_however_spelled(name: str) -> None:
    for key in spellings(name):
        line = f"POST http://crm.internal/in?a=1&{key}={SECRET}&b=2 HTTP/1.1"
        assert redact(line) == f"POST http://crm.internal/in?a=1&{key}=***&b=2 HTTP/1.1", key


def test_the_issues_delivery_line_shows_neither_password_nor_token() -> None:
    line = 'HTTP Request: POST http://svc:Pa55word@host/in?token=abcdef "HTTP/1.1 200 OK"'
    assert redact(line) == 'HTTP Request: POST http://svc:***@host/in?token=*** "HTTP/1.1 200 OK"'


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"http://svc:{SECRET}@host/in", "http://svc:***@host/in"),
        (f"https://svc:{SECRET}@host:8443", "https://svc:***@host:8443"),
        (f"nats://{SECRET}@host:4222", "nats://***@host:4222"),
        (f"redis://:{SECRET}@host:6379/0", "redis://:***@host:6379/0"),
        (f"redis://user:{SECRET}:more@host/0", "redis://user:***@host/0"),
        (f"amqp://user:{SECRET}@at@host/vhost", "amqp://user:***@host/vhost"),
        (f"mqtt://user:{SECRET}%2F%3F%23%40@host", "mqtt://user:***@host"),
        (
            f"postgresql+asyncpg://u:{SECRET}@h/db?password={SECRET}",
            "postgresql+asyncpg://u:***@h/db?password=***",
        ),
        (
            f"nats://a:{SECRET}@h1:4222,nats://a:{SECRET}@h2:4222",
            "nats://a:***@h1:4222,nats://a:***@h2:4222",
        ),
        (f'<Connection: "amqp://u:{SECRET}@h/v">', '<Connection: "amqp://u:***@h/v">'),
    ],
)
def test_a_urls_password_or_token_is_masked_and_its_user_kept(url: str, shown: str) -> None:
    assert redact(f"connecting to {url} now") == f"connecting to {shown} now"


@pytest.mark.parametrize(
    "text",
    [
        "http://host/path?email=a@b.example",
        "http://host:8080/x@y",
        "write to bob@example.com",
        "://@host",
        "ssh user@host",
        "sqlite:////var/lib/relay@2/relay.db",
    ],
)
def test_text_without_credentials_is_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    ("line", "masked"),
    [
        ("@" * 1_000_000, "@" * 1_000_000),
        ("://" + "@" * 1_000_000, "://***@"),
        ("://" * 300_000 + "@", "://" * 300_000 + "@"),
        ("://a@" * 200_000, "://***@" * 200_000),
        ("http://" + "a" * 1_000_000, "http://" + "a" * 1_000_000),
        ("x://" + ":" * 1_000_000 + "@h", "x://:***@h"),
        ("x://u:" + "p" * 1_000_000 + "@h", "x://u:***@h"),
        ("/x?" + "&sig=1" * 200_000, "/x?" + "&sig=***" * 200_000),
        ("/x?" + "&pwd%3Dx" * 125_000, "/x?" + "&***" * 125_000),
        ("/x?" + "&pwd" * 250_000, "/x?" + "&pwd" * 250_000),
        ("?" * 1_000_000, "?" * 1_000_000),
        ("?tok" * 250_000, "?tok" * 250_000),
        ("/x?k%" + "%" * 1_000_000 + "=1", "/x?k%" + "%" * 1_000_000 + "=1"),
    ],
)
def test_a_hostile_megabyte_of_urls_is_redacted(line: str, masked: str) -> None:
    # no timing assertion: a backtracking regex would hang here, a linear one takes milliseconds
    assert redact(line) == masked


def test_text_that_was_not_utf8_is_redacted() -> None:
    # bytes that were not UTF-8, decoded with surrogateescape or backslashreplace
    undecodable = b"\xff\xfe".decode("utf-8", "surrogateescape")
    line = f"http://u:{undecodable}{SECRET}@h/x?key={undecodable}1 \\xff"
    assert redact(line) == "http://u:***@h/x?key=*** \\xff"
