"""URL tokens never reach a log line, however the caller spells the parameter's name."""

from __future__ import annotations

import logging

import pytest

from relay.log_redaction import RedactTokens, redact

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
def test_a_token_is_masked_in_an_access_log_line(
    query: str, caplog: pytest.LogCaptureFixture
) -> None:
    logger = logging.getLogger("test.redaction.access")
    logger.addFilter(RedactTokens())
    with caplog.at_level(logging.INFO, logger=logger.name):
        # uvicorn's access log: the path with its query is one of the arguments
        logger.info(
            '%s - "%s %s HTTP/%s" %d',
            "127.0.0.1:5000",
            "POST",
            f"/hooks/sms/inbound?{query}",
            "1.1",
            200,
        )
    assert SECRET not in caplog.text
    assert "***" in caplog.text


def test_other_parameters_are_left_alone() -> None:
    assert redact("/x?tokens=1&requestId=abc") == "/x?tokens=1&requestId=abc"
