"""What a simulation did: the summary and every attempt."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx

from relay.simulator.platform import Attempt, CallbackResult
from relay.simulator.run import Pacer
from relay.words import counted

NO_ANSWER = "no answer"


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summarize(
    results: Sequence[CallbackResult], elapsed_seconds: float, pacer: Pacer | None = None
) -> dict[str, Any]:
    """Events, attempts, answers by status code, latency p50/p99 (the receiver's answer times),
    given up; with the run's ``pacer``, the rate asked for and the rate achieved (callbacks
    started per second, first to last)."""
    attempts = [a for r in results for a in r.attempts]
    answers = Counter(str(a.status_code) if a.status_code else NO_ANSWER for a in attempts)
    latencies = [a.latency_ms for a in attempts]
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return {
        "events": len(results),
        "attempts": len(attempts),
        "retries": sum(1 for a in attempts if a.number > 1 and not a.duplicate),
        "duplicates_sent": sum(1 for a in attempts if a.duplicate),
        "answers": dict(sorted(answers.items())),
        "latency_p50_ms": round(p50, 2) if p50 is not None else None,
        "latency_p99_ms": round(p99, 2) if p99 is not None else None,
        "given_up": sum(1 for r in results if r.given_up),
        "elapsed_s": round(elapsed_seconds, 3),
        "rate_asked_per_s": pacer.rate if pacer is not None else None,
        "rate_sent_per_s": _rounded(pacer.achieved_rate if pacer is not None else None),
    }


def _rounded(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


def attempts_json(results: Sequence[CallbackResult]) -> list[dict[str, Any]]:
    """Every attempt: event, kind, attempt number, scheduled and sent time, status code, and
    after a failure when the platform tries again."""
    return [
        {
            "event": a.event,
            "kind": a.kind,
            "label": a.label,
            "attempt": a.number,
            "scheduled_at": a.scheduled_at.isoformat(),
            "sent_at": a.sent_at.isoformat(),
            "status_code": a.status_code,
            "error": a.error,
            "latency_ms": round(a.latency_ms, 3),
            "duplicate": a.duplicate,
            "next_attempt_at": a.next_attempt_at.isoformat() if a.next_attempt_at else None,
        }
        for r in results
        for a in r.attempts
    ]


def render(summary: dict[str, Any]) -> str:
    """The summary as text, one figure per line."""
    answers = ", ".join(f"{code}: {count}" for code, count in summary["answers"].items()) or "-"
    lines = [
        f"events      {summary['events']}",
        f"attempts    {summary['attempts']} ({counted(summary['retries'], 'retry')}, "
        f"{counted(summary['duplicates_sent'], 'duplicate')} sent)",
        f"answers     {answers}",
        f"latency     p50 {summary['latency_p50_ms']} ms, p99 {summary['latency_p99_ms']} ms",
        f"given up    {summary['given_up']}",
        f"elapsed     {summary['elapsed_s']} s",
    ]
    if summary.get("rate_sent_per_s") is not None:
        asked = summary.get("rate_asked_per_s")
        target = f" (asked {asked:g}/s)" if asked else ""
        lines.append(f"rate        {summary['rate_sent_per_s']:g} callbacks/s sent{target}")
    return "\n".join(lines)


def failure_line(attempt: Attempt) -> str:
    """One plain line for a failed attempt: the callback, the attempt's number, the receiver's
    answer (with its latency) or the connection error, and what the platform does next."""
    if attempt.status_code is None:
        outcome = attempt.error or NO_ANSWER
    else:
        phrase = httpx.codes.get_reason_phrase(attempt.status_code)
        outcome = f"HTTP {attempt.status_code} {phrase}".rstrip()
        outcome += f" ({attempt.latency_ms:.0f} ms)"
    callback = f"{attempt.kind} {attempt.event}"
    if attempt.duplicate:
        return f"duplicate (attempt {attempt.number}) of {callback} failed: {outcome}; not retried"
    if attempt.next_attempt_at is None:
        then = "given up"
    else:
        then = f"next attempt at {attempt.next_attempt_at.isoformat(timespec='seconds')}"
    return f"attempt {attempt.number} of {callback} failed: {outcome}; {then}"


def given_up_line(result: CallbackResult) -> str | None:
    """The line for a callback given up without a last failed attempt to say so: the sending
    pause it waited in outlasted its give-up time. None for any other callback."""
    if not result.given_up or not result.attempts or result.attempts[-1].next_attempt_at is None:
        return None
    callback = result.callback
    last = result.attempts[-1]
    return (
        f"{callback.kind} {last.event} given up after attempt {last.number}: the sending pause "
        "outlasted its give-up time"
    )
