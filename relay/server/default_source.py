"""Which sources `relay serve` serves, and what becomes of the default source's generated token.

The first start without any source generates a token for the default source and prints its URLs
for the platform. Those URLs must keep working when other sources are configured later: the
platform would retry a 404 for up to 48 hours and then drop the callback. So the generated
token, kept in the database, serves the default source until ``[sources.default]`` is
configured (which then wins) or `relay sources forget-default` deletes it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import DEFAULT_SOURCE
from receivers.sources import SourceConfig
from relay.server.bootstrap import generated_token, kept_token, token_source
from relay.settings import SettingsError


class TokenUse(enum.Enum):
    """What the generated token of the default source does."""

    ALONE = "alone"
    """No source is configured: the default source is served with it."""
    BESIDE_CONFIGURED = "beside-configured"
    """Other sources are configured, ``[sources.default]`` is not: the default source is still
    served with it, since the platform may have been given its URLs."""
    RETIRED = "retired"
    """``[sources.default]`` is configured and alone decides what the default source accepts;
    the token stays in the database until `relay sources forget-default`."""


@dataclass(frozen=True)
class GeneratedToken:
    """The default source's generated token and what it does."""

    token: str
    use: TokenUse

    @property
    def served(self) -> bool:
        """Whether it serves the default source."""
        return self.use is not TokenUse.RETIRED


@dataclass(frozen=True)
class ServedSources:
    """The sources `relay serve` serves: the configured ones, and the default source on its
    generated token where that token serves it (first)."""

    sources: dict[str, SourceConfig]
    generated: GeneratedToken | None


async def served_sources(
    configured: Mapping[str, SourceConfig], engine: AsyncEngine, *, generate: bool = True
) -> ServedSources:
    """The sources to serve for ``configured`` on this database. With no source configured, the
    default source's token is generated on first use (unless ``generate`` is false: then the
    answer may have no source at all); with sources configured it is never generated, only
    read."""
    if not configured:
        token = await generated_token(engine) if generate else await kept_token(engine)
        if token is None:
            return ServedSources({}, None)
        return ServedSources(
            {DEFAULT_SOURCE: _source_of(token)}, GeneratedToken(token, TokenUse.ALONE)
        )
    token = await kept_token(engine)
    if token is None:
        return ServedSources(dict(configured), None)
    if DEFAULT_SOURCE in configured:
        return ServedSources(dict(configured), GeneratedToken(token, TokenUse.RETIRED))
    return ServedSources(
        {DEFAULT_SOURCE: _source_of(token), **configured},
        GeneratedToken(token, TokenUse.BESIDE_CONFIGURED),
    )


def _source_of(token: str) -> SourceConfig:
    """The default source on the kept token; a :class:`SettingsError` (never naming the value)
    when the database holds one that is no usable token (written there by hand)."""
    try:
        return token_source(token)
    except ValidationError as exc:
        reasons = "; ".join(str(error["msg"]) for error in exc.errors(include_input=False))
        raise SettingsError(
            f"the default source's generated token kept in the database is unusable ({reasons}): "
            "`relay sources forget-default` deletes it"
        ) from None
