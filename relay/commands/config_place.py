"""Where ``--config`` goes: after the command (`relay destinations list --config F`). Given
before it (`relay --config F destinations list`), the error says so and shows the command
written the right way, instead of click's bare "No such option"."""

from __future__ import annotations

import shlex

import click

from relay.commands.escape import shown

CONFIG = "--config"


class ConfigAfterCommand(click.Group):
    """The `relay` group: a ``--config`` given to it is a usage error that says where it goes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if exc.option_name != CONFIG:
                raise
            raise click.UsageError(
                f"{CONFIG} goes after the command: {written_right(self, given)}", ctx
            ) from None


def written_right(group: click.Group, args: list[str]) -> str:
    """``relay`` and the (sub)command words of ``args``, then ``--config`` and its file (as
    given, escaped, cut and quoted for a shell; ``FILE`` when there is none), e.g. ``relay
    destinations list --config F``. Other arguments are left out: only the command is named."""
    given, rest = "FILE", []
    at = 0
    while at < len(args):
        arg = args[at]
        if arg == CONFIG and at + 1 < len(args):
            given, at = args[at + 1], at + 2
            continue
        if arg.startswith(f"{CONFIG}="):
            given = arg.partition("=")[2] or "FILE"
        else:
            rest.append(arg)
        at += 1
    words: list[str] = []
    command: click.Command = group
    for arg in rest:
        if not isinstance(command, click.Group) or arg not in command.commands:
            break
        words.append(arg)
        command = command.commands[arg]
    return " ".join(["relay", *(words or ["COMMAND"]), CONFIG, shlex.quote(shown(given))])
