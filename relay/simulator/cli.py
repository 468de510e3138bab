"""`relay simulate`: play the platform's callbacks against any receiver."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import click

from receivers.event_loop import LOOP_NAMES, LoopUnavailable, loop_factory
from relay.observe.progress import Bar
from relay.simulator.clocks import ScaledClock
from relay.simulator.platform import Attempt, CallbackResult, Platform
from relay.simulator.report import (
    attempts_json,
    failure_line,
    given_up_line,
    render,
    summarize,
)
from relay.simulator.run import Pacer, RunOptions, plan, run_units
from relay.simulator.scenarios import SCENARIOS, Scenario
from relay.simulator.senders import CLIENT_CHOICES, Sender, sender_for
from relay.simulator.wire import Credentials, Endpoint

MAX_CONCURRENCY = 10_000
"""More connections than this to one receiver would run out of file descriptors first."""
MAX_RATE = 1_000_000.0


class ScenarioGroup(click.Group):
    """`relay simulate list`, then one command per scenario, in the table's order."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return ["list", *SCENARIOS]


@click.group(cls=ScenarioGroup)
def simulate() -> None:
    """Play the platform: its payloads, sequences, duplicates and retry schedules.

    Example: relay simulate sms-dlr --url 'http://127.0.0.1:8000/hooks?token=...' --count 100
    """


@simulate.command("list")
def list_scenarios() -> None:
    """Show the scenarios, one line each."""
    width = max(len(name) for name in SCENARIOS)
    for scenario in SCENARIOS.values():
        click.echo(f"{scenario.name:<{width}}  {scenario.summary}")


def parse_setting(text: str) -> tuple[str, Any]:
    """``field=value`` (dots for nested fields); the value is JSON when it parses, else text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected field=value, got {text!r}", param_hint="--set")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def parse_header(text: str) -> tuple[str, str]:
    """``Name: value`` or ``Name=value`` (no line break: it would end the header)."""
    if "\r" in text or "\n" in text:
        raise click.BadParameter("a header holds no line break", param_hint="--header")
    for separator in (":", "="):
        name, sep, value = text.partition(separator)
        if sep and name.strip():
            return name.strip(), value.strip()
    raise click.BadParameter(f"expected Name: value, got {text!r}", param_hint="--header")


def _scenario_command(scenario: Scenario) -> click.Command:
    @click.command(scenario.name, help=f"{scenario.summary[0].upper()}{scenario.summary[1:]}.")
    @click.option(
        "--url",
        required=True,
        help="The receiver's base URL as given to the platform (userinfo = basic "
        "auth, query kept, e.g. ?token=...); the kind's path is appended.",
    )
    @click.option("--exact-url", is_flag=True, help="Send to --url as is (no path appended).")
    @click.option(
        "--count",
        default=1,
        show_default=True,
        type=click.IntRange(1),
        help="How many instances of the scenario.",
    )
    @click.option(
        "--concurrency",
        default=10,
        show_default=True,
        type=click.IntRange(1, MAX_CONCURRENCY),
        help="Scenario instances in flight at once (one connection each).",
    )
    @click.option(
        "--rate",
        type=click.FloatRange(min=0, max=MAX_RATE, min_open=True),
        help="Start callbacks on a fixed schedule, this many per second (open loop: "
        "whatever the answers' latency, given enough --concurrency).",
    )
    @click.option(
        "--client",
        type=click.Choice(CLIENT_CHOICES),
        default="auto",
        show_default=True,
        help="auto: the lean HTTP/1.1 client for http://, httpx for https://; "
        "httpx: every request through httpx.",
    )
    @click.option(
        "--time-scale",
        default=1.0,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Run the retry schedules this many times faster than real (0.001: 48 h in ~3 min).",
    )
    @click.option(
        "--method",
        type=click.Choice(["POST", "GET"]),
        default="POST",
        show_default=True,
        help="GET sends sms.* callbacks as query parameters.",
    )
    @click.option("--secret", help="Sign with the Conversations HMAC (x-signature).")
    @click.option(
        "--signature-method",
        type=click.Choice(["HS256", "HS512"]),
        default="HS256",
        show_default=True,
    )
    @click.option("--header", "header", help="A custom header sent with every callback.")
    @click.option(
        "--set",
        "settings",
        multiple=True,
        metavar="FIELD=VALUE",
        help="Override a payload field (dots for nested fields); repeatable.",
    )
    @click.option("--no-retry", is_flag=True, help="One attempt per callback.")
    @click.option(
        "--duplicate-rate",
        default=0.0,
        show_default=True,
        type=click.FloatRange(0, 1),
        help="Resend this share of accepted callbacks.",
    )
    @click.option("--shuffle", is_flag=True, help="Deliver callbacks out of order.")
    @click.option("--seed", type=int, help="Seed for payloads and choices (reproducible runs).")
    @click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print the summary and every attempt as JSON (failed attempts on stderr).",
    )
    @click.option(
        "--loop",
        default="auto",
        show_default=True,
        envvar="RELAY_LOOP",
        type=click.Choice(LOOP_NAMES),
        help="Event loop: uvloop where it is installed (auto), asyncio's own, or uvloop "
        "($RELAY_LOOP).",
    )
    def command(**options: Any) -> None:
        """Print a line per failed attempt as it happens, then the summary; a progress bar
        on stderr when it is a terminal."""
        try:
            endpoint = Endpoint.parse(options["url"], exact=options["exact_url"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--url") from None
        header = parse_header(options["header"]) if options["header"] else None
        credentials = Credentials(options["secret"], options["signature_method"], header)
        run_options = RunOptions(
            count=options["count"],
            concurrency=options["concurrency"],
            rate=options["rate"],
            shuffle=options["shuffle"],
            overrides=dict(parse_setting(s) for s in options["settings"]),
        )
        try:
            sender = sender_for(endpoint, run_options.concurrency, options["client"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--client") from None
        try:
            new_loop = loop_factory(options["loop"])
        except LoopUnavailable as exc:
            raise click.BadParameter(str(exc), param_hint="--loop") from None
        try:
            pacer = Pacer(run_options.rate)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--rate") from None
        with asyncio.Runner(loop_factory=new_loop) as runner:
            results, elapsed = runner.run(
                _play(scenario, endpoint, credentials, run_options, options, sender, pacer)
            )
        summary = summarize(results, elapsed, pacer)
        if options["as_json"]:
            click.echo(
                json.dumps(
                    {
                        "scenario": scenario.name,
                        "summary": summary,
                        "attempts": attempts_json(results),
                    },
                    indent=2,
                )
            )
        else:
            click.echo(render(summary))
        if summary["given_up"]:
            sys.exit(1)

    return command


async def _play(
    scenario: Scenario,
    endpoint: Endpoint,
    credentials: Credentials,
    run_options: RunOptions,
    options: dict[str, Any],
    sender: Sender,
    pacer: Pacer,
) -> tuple[list[CallbackResult], float]:
    rng = random.Random(options["seed"])
    try:
        platform = Platform(
            sender,
            endpoint,
            clock=ScaledClock(options["time_scale"]),
            credentials=credentials,
            method=options["method"],
            retry=not options["no_retry"],
            duplicate_rate=options["duplicate_rate"],
            rng=rng,
        )
        units = plan(scenario, run_options, rng)
        started = time.monotonic()
        with Bar(scenario.name, sum(map(len, units))) as bar:
            # with --json, stdout is the JSON document alone
            err = options["as_json"]

            def failed(attempt: Attempt) -> None:
                bar.echo(failure_line(attempt), err=err)

            def done(result: CallbackResult) -> None:
                line = given_up_line(result)
                if line is not None:
                    bar.echo(line, err=err)
                bar.advance()

            platform.on_failure = failed
            results = await run_units(platform, units, run_options, on_result=done, pacer=pacer)
    finally:
        await sender.aclose()
    return results, time.monotonic() - started


for _scenario in SCENARIOS.values():
    simulate.add_command(_scenario_command(_scenario))
