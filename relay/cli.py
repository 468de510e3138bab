"""The `relay` command line: one group, its subcommands live in :mod:`relay.commands`."""

from __future__ import annotations

import io
import sys

import click

from relay.commands.config_place import ConfigAfterCommand
from relay.commands.console import console_commands
from relay.commands.give_up import give_up_command
from relay.commands.outbox import deliveries, destinations
from relay.commands.process import db, serve, worker
from relay.commands.retention import store
from relay.commands.sources import sources
from relay.commands.store import events, rejected
from relay.sandbox.cli import sandbox
from relay.simulator.cli import simulate


@click.group(cls=ConfigAfterCommand)
@click.version_option(package_name="callback-relay")
def main() -> None:
    """callback-relay: receive the platform's callbacks, store them, relay them."""
    print_lone_surrogates_escaped()


def print_lone_surrogates_escaped() -> None:
    """A stored payload may hold a lone surrogate (valid JSON, not UTF-8): the commands that
    print it (and the logs) show its escape, ``\\ud800``, instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


for command in (
    serve,
    worker,
    db,
    events,
    rejected,
    deliveries,
    destinations,
    sources,
    console_commands,
    store,
    simulate,
    sandbox,
):
    main.add_command(command)
deliveries.add_command(give_up_command)
