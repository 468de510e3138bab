"""Simulator benchmark: how fast `relay simulate` sends, next to ``wrk`` against the same no-op
endpoint in the same run, and how closely ``--rate`` holds its schedule.

One no-op receiver (``scripts/noop_app.py`` under uvicorn, one worker, access log off, in a
subprocess) takes, in turns (``--rounds``; turns keep a shared machine's changing speed on both
sides of the ratio):

a) the baseline: Debian's ``wrk`` (``--wrk``), one thread, ``--concurrency`` connections, for
   ``--seconds``, POSTing one realistic sms.dlr report (the same bytes every time, as wrk can);
b) `relay simulate sms-dlr --count N --concurrency C --no-retry --json` (the command line as a
   user runs it, in a subprocess): every callback a distinct delivery report from the payload
   factories (checked: distinct event ids), N sized from the previous wrk turn to last about
   ``--seconds``. Its speed is callbacks answered per second of its sending (the report's
   ``attempts / elapsed_s``: from the first send to the last answer, payloads built before).

ratio = simulate callbacks/s / wrk requests/s, each summed over its turns; the check wants at
least ``--min-ratio`` (0.25). Then the rate check: for each of ``--rates`` (1000,5000), one
`relay simulate --rate R` run of about ``--seconds`` (``--rate-concurrency``, 100: an open loop
needs rate x answer time callbacks in flight, with room for slow answers); it prints the
achieved rate (the report's ``rate_sent_per_s``) and its error, which must stay within
``--tolerance`` (5 %). p50/p99 are the receiver's answer times as `relay simulate` reports them;
the sender's CPU per callback is the run's user + system time less that of a one-callback run
(start-up: imports), divided by the callbacks sent (payload building included).

Exit status 1 when a check failed, 2 when the run failed (no wrk, the endpoint did not start)::

    python scripts/bench_simulator.py [--json] [--rounds 3] [--seconds 4] [--rates 1000,5000]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import harness
from benchlib import at_least, uvicorn_argv
from harness import HOST, BenchError, Stack, log

PATH = "/hooks/sms/dlr"
CALLBACKS_PER_INSTANCE = 2.8  # sms-dlr: 2 or 3 reports per message (ACCEPTED, BUFFERED, end)
WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = {body}
"""


@dataclass
class Turn:
    """One turn of one side: what it sent and how fast."""

    side: str
    requests: int
    seconds: float
    per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_us: float | None = None
    """The sender's CPU per callback, its start-up left out (relay simulate only)."""


@dataclass
class RateRun:
    """One `relay simulate --rate` run."""

    asked_per_s: float
    sent_per_s: float
    error_pct: float
    callbacks: int
    p50_ms: float | None
    p99_ms: float | None
    cpu_us: float


@dataclass
class Report:
    args: argparse.Namespace
    turns: list[Turn]
    rates: list[RateRun]
    seconds: float
    startup_cpu_s: float
    problems: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        wrk = sum(t.per_s for t in self.turns if t.side == "wrk")
        simulate = sum(t.per_s for t in self.turns if t.side == "simulate")
        return simulate / wrk if wrk else math.nan

    def as_json(self) -> dict[str, Any]:
        return {
            "turns": [asdict(t) for t in self.turns],
            "ratio": round(self.ratio, 3),
            "rates": [asdict(r) for r in self.rates],
            "concurrency": self.args.concurrency,
            "duration_s": round(self.seconds, 1),
            "startup_cpu_s": round(self.startup_cpu_s, 2),
            "problems": self.problems,
        }

    def as_text(self) -> str:
        lines = [
            f"simulator benchmark: no-op endpoint (uvicorn, 1 worker), {self.args.rounds} turns "
            f"each, concurrency {self.args.concurrency}; {self.seconds:.0f} s in all"
        ]
        for side in ("wrk", "simulate"):
            turns = [t for t in self.turns if t.side == side]
            rates = ", ".join(f"{t.per_s:,.0f}" for t in turns)
            mean = sum(t.per_s for t in turns) / len(turns) if turns else math.nan
            answers = ""
            if side == "simulate" and turns:
                last = turns[-1]
                answers = (
                    f"; answers p50 {last.p50_ms} ms, p99 {last.p99_ms} ms; "
                    f"sender CPU {last.cpu_us:.0f} us/callback"
                )
            lines.append(f"{side:<9} {mean:>9,.0f}/s  (turns: {rates}){answers}")
        lines.append(
            f"ratio     simulate / wrk = {self.ratio:.3f} (wanted >= {self.args.min_ratio})"
        )
        for run in self.rates:
            lines.append(
                f"--rate {run.asked_per_s:g}: sent {run.sent_per_s:,.1f}/s ({run.error_pct:+.2f} %)"
                f", {run.callbacks} callbacks, answers p50 {run.p50_ms} ms, p99 {run.p99_ms} ms, "
                f"sender CPU {run.cpu_us:.0f} us/callback"
            )
        lines.append(
            "result: " + ("FAILED: " + "; ".join(self.problems) if self.problems else "ok")
        )
        return "\n".join(lines)


def wrk_turn(args: argparse.Namespace, script: str, port: int) -> Turn:
    """One wrk run; its Requests/sec."""
    argv = [args.wrk, "-t1", f"-c{args.concurrency}", f"-d{args.seconds}s", "-s", script,
            f"http://{HOST}:{port}{PATH}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.seconds + 60)
    found = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    total = re.search(r"(\d+) requests in ([\d.]+)s", done.stdout)
    if done.returncode or not found or not total:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    if "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        raise BenchError(f"wrk saw errors: {done.stdout}")
    return Turn("wrk", int(total.group(1)), float(total.group(2)), float(found.group(1)))


def simulate(
    args: argparse.Namespace, port: int, count: int, seed: int, concurrency: int, *extra: str
) -> dict:
    """One `relay simulate sms-dlr ... --json` run; its report (BenchError when it failed)."""
    argv = [*harness.relay_command(), "simulate", "sms-dlr", "--url", f"http://{HOST}:{port}/hooks",
            "--count", str(count), "--concurrency", str(concurrency), "--no-retry",
            "--seed", str(seed), "--json", *extra]  # fmt: skip
    before = _children_cpu()
    done = subprocess.run(argv, capture_output=True, text=True, env=harness.relay_env(),
                          timeout=args.seconds * 20 + 120, check=False)  # fmt: skip
    if done.returncode:
        raise BenchError(f"relay simulate failed ({done.returncode}): {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    report["cpu_s"] = _children_cpu() - before
    events = [a["event"] for a in report["attempts"]]
    if len(set(events)) != len(events):
        raise BenchError("relay simulate sent the same callback twice")
    return report


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def per_callback_us(report: dict[str, Any], startup_cpu_s: float) -> float:
    """The sender's CPU per callback, in microseconds, its start-up (imports) left out."""
    return (report["cpu_s"] - startup_cpu_s) / max(report["summary"]["attempts"], 1) * 1e6


def simulate_turn(
    args: argparse.Namespace, port: int, count: int, seed: int, startup_cpu_s: float = 0.0
) -> Turn:
    report = simulate(args, port, count, seed, args.concurrency)
    summary = report["summary"]
    if summary["answers"] != {"200": summary["attempts"]}:
        raise BenchError(f"the no-op endpoint did not answer 200 to all: {summary['answers']}")
    return Turn(
        "simulate",
        summary["attempts"],
        summary["elapsed_s"],
        summary["attempts"] / summary["elapsed_s"],
        summary["latency_p50_ms"],
        summary["latency_p99_ms"],
        per_callback_us(report, startup_cpu_s),
    )


def rate_run(
    args: argparse.Namespace, port: int, rate: float, seed: int, startup_cpu_s: float
) -> RateRun:
    count = max(10, round(rate * args.seconds / CALLBACKS_PER_INSTANCE))
    extra = ("--rate", f"{rate:g}")
    report = simulate(args, port, count, seed, args.rate_concurrency, *extra)
    summary = report["summary"]
    sent = summary["rate_sent_per_s"] or 0.0
    return RateRun(rate, sent, (sent - rate) / rate * 100, summary["attempts"],
                   summary["latency_p50_ms"], summary["latency_p99_ms"],
                   per_callback_us(report, startup_cpu_s))  # fmt: skip


def run_bench(args: argparse.Namespace) -> Report:
    started = time.monotonic()
    if shutil.which(args.wrk) is None:
        raise BenchError(f"{args.wrk} not found (Debian: apt-get install wrk)")
    from relay.simulator import factories  # the body wrk sends: a realistic one

    body = json.dumps(factories.sms_dlr(), separators=(",", ":"))
    turns: list[Turn] = []
    rates: list[RateRun] = []
    with Stack("simulator") as stack:
        script = stack.workdir / "post.lua"
        script.write_text(WRK_SCRIPT.format(body=json.dumps(body)))
        port = harness.free_port()
        proc = stack.start("noop", uvicorn_argv("noop_app:app", port), harness.relay_env())
        harness.wait_http(proc, port, "/healthz")
        log(f"no-op endpoint on {port}")
        simulate(args, port, 1, 0, 1)  # warm-up: file caches
        startup = simulate(args, port, 1, 0, 1)["cpu_s"]  # start-up CPU (imports, one callback)
        log(f"relay simulate start-up: {startup:.2f} s of CPU")
        for round_ in range(args.rounds):
            baseline = wrk_turn(args, str(script), port)
            count = max(100, round(baseline.per_s * args.seconds / CALLBACKS_PER_INSTANCE))
            ours = simulate_turn(args, port, count, round_ + 1, startup)
            log(f"turn {round_ + 1}: wrk {baseline.per_s:,.0f}/s, simulate {ours.per_s:,.0f}/s")
            turns += [baseline, ours]
        for i, rate in enumerate(args.rates):
            rates.append(rate_run(args, port, rate, 100 + i, startup))
            log(f"--rate {rate:g}: {rates[-1].sent_per_s:,.1f}/s")
    report = Report(args, turns, rates, time.monotonic() - started, startup)
    if not report.ratio >= args.min_ratio:
        report.problems.append(f"ratio {report.ratio:.3f} below {args.min_ratio}")
    for run in rates:
        if abs(run.error_pct) > args.tolerance:
            report.problems.append(
                f"--rate {run.asked_per_s:g} sent {run.sent_per_s:.1f}/s ({run.error_pct:+.2f} %)"
            )
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--rounds", type=at_least(1), default=3, help="turns of wrk and of relay simulate")
    add("--seconds", type=at_least(1), default=4, help="seconds per turn (about)")
    add("--concurrency", type=at_least(1), default=50, help="connections of both")
    add("--rates", default="1000,5000", help="--rate values to check, comma-separated")
    add("--rate-concurrency", type=at_least(1), default=100,
        help="--concurrency of the rate runs (an open loop needs rate x latency)")  # fmt: skip
    add("--tolerance", type=float, default=5.0, help="rate error allowed, per cent")
    add("--min-ratio", type=float, default=0.25, help="simulate / wrk wanted at least")
    add("--wrk", default="wrk", help="the wrk command")
    add("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        args.rates = [float(part) for part in args.rates.split(",") if part]
    except ValueError:
        parser.error("--rates: a comma-separated list of numbers")
    if any(not 0 < rate < math.inf for rate in args.rates):
        parser.error("--rates: positive numbers")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main("bench_simulator", lambda: run_bench(args), args.json)


if __name__ == "__main__":
    sys.exit(main())
