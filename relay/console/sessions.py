"""Console sessions, kept in the database so that every replica sees them begin and end.

The session cookie carries a random token (256 bits) and nothing else; the database keeps only
the token's SHA-256 as the session's id, with its user, its times and the fingerprint of the
password it was opened under. Every request looks its session up by that id (one primary-key
read, no cache), so a logout, `relay console logout-all` or a new password ends a session on
every replica at once. The CSRF token of every form is an HMAC of the session's id.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.console.compare import token_matches
from relay.console.tables import ConsoleSession
from relay.console.users import Users

log = logging.getLogger("relay.console")

SESSION_COOKIE = "relay_console"
SESSIONS = ConsoleSession.__table__
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")
"""A session cookie's value: ``secrets.token_urlsafe(32)``."""
LAST_SEEN_EVERY = timedelta(minutes=1)
"""How stale a session's ``last_seen_at`` may get before a request writes it again."""

LOGOUT = "logout"
LOGOUT_ALL = "logout-all"
REPLACED = "replaced by a new login"
PASSWORD_CHANGED = "password changed"
USER_REMOVED = "user removed"


@dataclass(frozen=True)
class Operator:
    """A logged-in user of the console."""

    name: str
    session_id: str


class Sessions:
    """Opens, checks and ends the console's sessions for a fixed set of users."""

    def __init__(
        self,
        engine: AsyncEngine,
        users: Users,
        key: str,
        lifetime: timedelta,
        clock: Callable[[], datetime],
    ) -> None:
        self._engine = engine
        self._users = users
        self._key = key.encode()
        self._lifetime = lifetime
        self._clock = clock

    @property
    def lifetime(self) -> timedelta:
        return self._lifetime

    async def open(self, name: str) -> str:
        """A new session for ``name`` (who must exist): the cookie's value. Sessions expired
        by now are deleted on the way (the table holds no more than a lifetime's logins)."""
        fingerprint = self._users.fingerprint(name)
        assert fingerprint is not None, "a session is opened for a configured user only"
        token = secrets.token_urlsafe(32)
        now = self._clock()
        async with self._engine.begin() as conn:
            await conn.execute(delete(SESSIONS).where(SESSIONS.c.expires_at <= now))
            await conn.execute(
                insert(SESSIONS).values(
                    id=session_id(token),
                    user_name=name,
                    password_fingerprint=fingerprint,
                    created_at=now,
                    last_seen_at=now,
                    expires_at=now + self._lifetime,
                )
            )
        return token

    async def operator(self, cookie: str | None) -> Operator | None:
        """The user of a session cookie: None when it is missing or malformed, or its session
        is unknown, ended, expired, or was opened under a password that has changed since."""
        if not cookie or not TOKEN_SHAPE.fullmatch(cookie):
            return None
        wanted = session_id(cookie)
        now = self._clock()
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(SESSIONS).where(SESSIONS.c.id == wanted))).first()
        if row is None or not hmac.compare_digest(row.id, wanted):
            return None
        if row.ended_at is not None or row.expires_at <= now:
            return None
        fingerprint = self._users.fingerprint(row.user_name)
        if fingerprint is None or not hmac.compare_digest(row.password_fingerprint, fingerprint):
            return None
        if now - row.last_seen_at >= LAST_SEEN_EVERY:
            async with self._engine.begin() as conn:
                await conn.execute(
                    update(SESSIONS).where(SESSIONS.c.id == wanted).values(last_seen_at=now)
                )
        return Operator(row.user_name, row.id)

    async def end(self, operator: Operator, reason: str = LOGOUT) -> None:
        """End one session (a logout)."""
        async with self._engine.begin() as conn:
            await conn.execute(
                update(SESSIONS)
                .where(SESSIONS.c.id == operator.session_id, SESSIONS.c.ended_at.is_(None))
                .values(ended_at=self._clock(), end_reason=reason)
            )

    def csrf_token(self, operator: Operator) -> str:
        """The token every form of this session carries."""
        message = f"csrf:{operator.session_id}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def csrf_matches(self, operator: Operator, token: str | None) -> bool:
        return token_matches(token, self.csrf_token(operator))


def session_id(token: str) -> str:
    """The id a session is kept under: its cookie's token, hashed."""
    return hashlib.sha256(token.encode("ascii")).hexdigest()


async def end_sessions(
    engine: AsyncEngine, now: datetime, reason: str, users: Collection[str] | None = None
) -> int:
    """End every live session (only ``users``' when given): how many were ended."""
    live = [SESSIONS.c.ended_at.is_(None), SESSIONS.c.expires_at > now]
    if users is not None:
        live.append(SESSIONS.c.user_name.in_(sorted(users)))
    async with engine.begin() as conn:
        ended = await conn.execute(
            update(SESSIONS).where(*live).values(ended_at=now, end_reason=reason)
        )
    return ended.rowcount or 0


async def end_outdated_sessions(engine: AsyncEngine, users: Users, now: datetime) -> int:
    """End the live sessions of users no longer configured, or opened under a password other
    than a user's current one; run at every start, so that the first replica started with a
    new password ends the old password's sessions on every replica. How many were ended."""
    live = and_(SESSIONS.c.ended_at.is_(None), SESSIONS.c.expires_at > now)
    ended = 0
    async with engine.begin() as conn:
        removed = await conn.execute(
            update(SESSIONS)
            .where(live, SESSIONS.c.user_name.not_in(sorted(users.names)))
            .values(ended_at=now, end_reason=USER_REMOVED)
        )
        ended += removed.rowcount or 0
        for name in sorted(users.names):
            changed = await conn.execute(
                update(SESSIONS)
                .where(
                    live,
                    SESSIONS.c.user_name == name,
                    SESSIONS.c.password_fingerprint != users.fingerprint(name),
                )
                .values(ended_at=now, end_reason=PASSWORD_CHANGED)
            )
            ended += changed.rowcount or 0
    if ended:
        log.info("console: ended %d sessions of removed users or of changed passwords", ended)
    return ended
