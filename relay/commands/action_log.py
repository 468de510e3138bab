"""The log of an operator's action from the command line (a replay, a give-up, an enable): one
INFO line, worded as the console's (:mod:`relay.observe.operator_actions`), printed on standard
error as `relay serve` prints its log: at ``$RELAY_LOG_LEVEL`` (info), in ``$RELAY_LOG_FORMAT``
(text), masking the settings' secrets."""

from __future__ import annotations

import getpass
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import click

from relay.commands.escape import shown
from relay.observe.known_secrets import KnownSecrets, secrets_in
from relay.observe.logs import LOG_FORMATS, LOG_LEVELS, LogFormat, configure_logging
from relay.settings import Settings

log = logging.getLogger("relay.cli")  # stable: users filter on it

LEVEL_VARIABLE = "RELAY_LOG_LEVEL"
FORMAT_VARIABLE = "RELAY_LOG_FORMAT"


def os_user() -> str:
    """The name of the user running the command (its uid when the system has no name)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid {os.getuid()}"


@dataclass(frozen=True)
class ActionLog:
    """Where a command logs its action; read before the action, so that a bad variable stops
    the command before it changes anything."""

    level: str
    log_format: LogFormat
    secrets: KnownSecrets

    @classmethod
    def of(cls, settings: Settings, environ: Mapping[str, str] = os.environ) -> ActionLog:
        """From the environment; a variable that names no level or format is a usage error."""
        level = _chosen(environ, LEVEL_VARIABLE, "info", LOG_LEVELS)
        log_format = cast(LogFormat, _chosen(environ, FORMAT_VARIABLE, "text", LOG_FORMATS))
        # the settings' secrets too short to mask everywhere are `relay serve`'s to warn of
        return cls(level, log_format, KnownSecrets(s for _, s in secrets_in(settings, "")))

    def write(self, line: str, user: str, **context: str | None) -> None:
        """Log ``line`` at INFO on logger ``relay.cli``, with ``user`` and ``context`` as the
        record's fields (``destination``, ``delivery_id``)."""
        configure_logging(self.level, self.log_format, self.secrets)
        log.info(line, extra={"user": user, **context})


def _chosen(environ: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = environ.get(name) or default
    if value not in choices:
        raise click.UsageError(f"${name} is none of {', '.join(choices)}: {shown(value)}")
    return value
