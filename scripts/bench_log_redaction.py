"""What masking secrets costs a log line: the handler of `relay serve` and `relay worker`
formatting typical lines (httpx's line per delivery, uvicorn's access line, a delivery's line
with its context, an AMQP client's debug line) and a hostile 16 KiB request line, in both
formats. The baseline is the same formatter without any masking, timed the same way in the
same run; each line prints the microseconds per record (best of ``--rounds``) and the ratio to
the baseline's.

    python scripts/bench_log_redaction.py                 # 30 secrets in the settings
    python scripts/bench_log_redaction.py --secrets 100 --json
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import time
from collections.abc import Callable

from relay.observe.known_secrets import KnownSecrets
from relay.observe.logs import CONTEXT_FIELDS, JsonLines, Redaction, TextLines

LINES: dict[str, tuple[str, str, tuple[object, ...], dict[str, object]]] = {
    "httpx delivery": (
        "httpx",
        'HTTP Request: %s %s "%s %d %s"',
        ("POST", "http://svc:pw-123456@crm.internal:8080/in?token=abc&id=7", "HTTP/1.1", 200, "OK"),
        {},
    ),
    "uvicorn access": (
        "uvicorn.access",
        '%s - "%s %s HTTP/%s" %d',
        ("10.0.0.7:51234", "POST", "/hooks/sms/inbound?token=abcdefghijklmnop", "1.1", 200),
        {},
    ),
    "delivery context": (
        "relay.delivery",
        "attempt %d of delivery %s to %s failed: %s; next attempt at %s",
        (2, "01a216f1-3fac-7a1c", "crm", "HTTP 503 Service Unavailable", "2026-11-26T08:25:37Z"),
        {"event_id": "01a216f1-3ead", "delivery_id": "01a216f1-3fac", "destination": "crm"},
    ),
    "amqp debug": (
        "aiormq.connection",
        "Received frame %s in channel #%d weight=%d on %s",
        (
            "<Basic.Ack object at 0x7f487c4e3f20>",
            1,
            21,
            '<Connection: "amqp://relay:******@127.0.0.1:5672/vhost?name=relay" at 0x7f487f028dc0>',
        ),
        {},
    ),
    "hostile 16 KiB": (
        "uvicorn.access",
        '%s - "%s %s HTTP/%s" %d',
        ("10.0.0.7:51234", "GET", "/hooks/sms/dlr?" + "&sig=1" * 2730, "1.1", 401),
        {},
    ),
}


def records() -> dict[str, logging.LogRecord]:
    made = {}
    for name, (logger, message, args, extra) in LINES.items():
        record = logging.LogRecord(logger, logging.INFO, __file__, 1, message, args, None)
        for key in CONTEXT_FIELDS:
            if key in extra:
                setattr(record, key, extra[key])
        made[name] = record
    return made


def per_record_us(
    format_: Callable[[logging.LogRecord], str], record: logging.LogRecord, count: int, rounds: int
) -> float:
    """The best of ``rounds`` averages over ``count`` formattings, in microseconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            format_(record)
        best = min(best, (time.perf_counter() - start) / count)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secrets", type=int, default=30, help="secrets the settings hold")
    parser.add_argument("--count", type=int, default=2000, help="records per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    options = parser.parse_args(argv)
    known = KnownSecrets(secrets.token_urlsafe(18) for _ in range(options.secrets))
    masked = Redaction(known)
    results = []
    for log_format, formatter in (("text", TextLines), ("json", JsonLines)):
        baseline, redacting = formatter(lambda text: text), formatter(masked)
        for name, record in records().items():
            count = max(options.count // 50, 20) if name.startswith("hostile") else options.count
            plain = per_record_us(baseline.format, record, count, options.rounds)
            cost = per_record_us(redacting.format, record, count, options.rounds)
            results.append(
                {
                    "format": log_format,
                    "line": name,
                    "baseline_us": round(plain, 2),
                    "masked_us": round(cost, 2),
                    "ratio": round(cost / plain, 2),
                }
            )
    if options.json:
        print(json.dumps({"secrets": options.secrets, "results": results}))
        return 0
    print(f"{options.secrets} secrets in the settings; microseconds per record (best of rounds)")
    print(f"{'format':<6}  {'line':<18}  {'baseline':>9}  {'masked':>9}  ratio")
    for row in results:
        print(
            f"{row['format']:<6}  {row['line']:<18}  {row['baseline_us']:>9}  "
            f"{row['masked_us']:>9}  {row['ratio']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
