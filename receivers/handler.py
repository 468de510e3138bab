"""The receiving endpoint: authenticate, decode, validate, store, answer."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import URL, Headers, QueryParams
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from receivers.auth import (
    TOKEN_PARAM,
    AuthFailure,
    IPAddress,
    check_address,
    check_credentials,
    check_method,
    check_signature,
    client_address,
)
from receivers.body import Undecodable, decode_json, query_as_payload, query_without, read_body
from receivers.config import ReceiverConfig
from receivers.dedup import dedup_key, platform_refs
from receivers.kinds import Kind
from receivers.metrics import ReceiverCounters
from receivers.problems import Problem
from receivers.sources import Network, SourceConfig
from receivers.store.records import Arrival, Rejection, StoreFull, StoreUnavailable
from receivers.store.writer import EventWriter

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "5"
STRUCTURED_QUERY_FIELDS = frozenset({"contentList", "parts"})
CACHE_SIZE = 256
ANSWER_TAIL = '", "kind": "{kind}", "status": "accepted"}}'
"""The 200 body after the event id, as ``json.dumps`` renders it (kinds are dotted names)."""
ANSWER_CONTENT_TYPE = (b"content-type", b"application/json")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
"""Status, raw headers and body of an answer."""
CALLER_GONE = Problem(
    400, "client-disconnected", "Bad Request", "The caller disconnected before the end of its body."
)
"""What a request whose caller left mid-body is answered (it never reaches anyone)."""


class HookEndpoint:
    """One receiver URL of one source; kinds sharing the URL are told apart by their body."""

    def __init__(
        self,
        *,
        source_name: str,
        source: SourceConfig,
        kinds: Sequence[Kind],
        config: ReceiverConfig,
        writer: Callable[[], EventWriter],
        counters: ReceiverCounters,
        clock: Callable[[], datetime],
    ) -> None:
        self.source_name = source_name
        self.source = source
        self.kinds = kinds
        self.config = config
        self.writer = writer
        self.counters = counters
        self.clock = clock
        self._callbacks_total = {  # resolved once: an accepted callback costs one inc()
            (kind.name, duplicate): counters.callbacks.labels(
                source=source_name, kind=kind.name, outcome="duplicate" if duplicate else "stored"
            )
            for kind in kinds
            for duplicate in (False, True)
        }
        self._disconnects = counters.client_disconnects.labels(source=source_name)
        self._store_unavailable = counters.store_unavailable.labels(source=source_name)
        self._answer_tails = {
            kind.name: ANSWER_TAIL.format(kind=kind.name).encode() for kind in kinds
        }
        self.methods = frozenset(method for kind in kinds for method in kind.methods)
        """The methods this URL accepts; any other (HEAD too) is answered 405."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app of this URL (methods are checked by whoever routed the request here)."""
        await send_answer(send, await self.answer(scope, receive))

    async def answer(self, scope: Scope, receive: Receive) -> Answer:
        """Handle one callback; its answer, not sent yet."""
        try:
            if scope["method"] not in self.methods:
                raise self._wrong_method(scope)
            return await self._handle(scope, receive)
        except ClientDisconnect:
            # the caller left before its body was in: nothing to answer, and nothing went wrong
            self._disconnects.inc()
            log.debug("caller disconnected before the end of its body on %s", scope["path"])
            return _answer_of(CALLER_GONE.response())
        except AuthFailure as failure:
            self.counters.auth_failures.labels(source=self.source_name, reason=failure.reason).inc()
            log.debug("refused callback on %s: %s", URL(scope=scope).path, failure.reason)
            return _answer_of(failure.response())
        except StoreUnavailable as refused:
            self._store_unavailable.inc()
            return _answer_of(store_problem(refused).response())
        except Problem as problem:
            return _answer_of(problem.response())

    async def _handle(self, scope: Scope, receive: Receive) -> Answer:
        raw_headers = scope["headers"]
        if not isinstance(raw_headers, list):
            raw_headers = list(raw_headers)  # as Starlette's Headers would
        first = dict(reversed(raw_headers))  # the first of repeated headers wins, as in Headers
        headers = Headers(raw=raw_headers)
        client = scope.get("client")
        address, remote_addr = _caller(
            client[0] if client else None,
            _forwarded_for(raw_headers) if self.config.trusted_proxies else None,
            self.config.trusted_proxies,
        )
        check_address(self.source, address)
        method = scope["method"]
        check_method(self.source, method)
        query_string = scope.get("query_string", b"")
        is_get = method == "GET"
        query = QueryParams(query_string) if is_get else _post_query(query_string)
        check_credentials(self.source, headers, query)

        if is_get:
            raw = query_without(query_string, TOKEN_PARAM)
            content_type = None
            try:
                data: Any = query_as_payload(
                    query_string, STRUCTURED_QUERY_FIELDS, leave_out=TOKEN_PARAM
                )
            except Undecodable as problem:
                await self._quarantine(scope, None, problem, [], raw, content_type, remote_addr)
                return _answer_of(problem.response())
        else:
            raw = await read_body(receive, first.get(b"content-length"), self.config.max_body_bytes)
            if self.source.signature_secret:
                check_signature(self.source, headers, raw, self.clock())
            declared_type = first.get(b"content-type")
            content_type = declared_type.decode("latin-1") if declared_type is not None else None
            try:
                data = decode_json(raw)
            except Undecodable as problem:
                await self._quarantine(scope, None, problem, [], raw, content_type, remote_addr)
                return _answer_of(problem.response())

        kind = self._dispatch(data)
        if not isinstance(data, dict):
            problem = Problem(
                422,
                "invalid-payload",
                "Unprocessable Content",
                f"A JSON object was expected for {kind.name}.",
                kind=kind.name,
                errors=[],
            )
            await self._quarantine(scope, kind, problem, [], raw, content_type, remote_addr)
            return _answer_of(problem.response())
        try:
            model = kind.model.__pydantic_validator__.validate_python(data)  # model_validate
        except ValidationError as exc:
            errors = _field_errors(exc)
            fields = ", ".join(sorted({e["field"] for e in errors}))
            problem = Problem(
                422,
                "invalid-payload",
                "Unprocessable Content",
                f"The body does not fit {kind.name}: check {fields}.",
                kind=kind.name,
                errors=errors,
            )
            await self._quarantine(scope, kind, problem, errors, raw, content_type, remote_addr)
            return _answer_of(problem.response())

        payload = model.to_stored()  # type: ignore[attr-defined]
        platform_id, event_name = platform_refs(kind, payload)
        receipt = await self.writer().store(
            Arrival(
                source=self.source_name,
                kind=kind.name,
                dedup_key=dedup_key(kind, payload, raw),
                payload=payload,
                raw_body=raw,
                content_type=content_type,
                method=method,
                remote_addr=remote_addr,
                platform_id=platform_id,
                event_name=event_name,
            )
        )
        self._callbacks_total[kind.name, receipt.duplicate].inc()
        body = b'{"id": "' + receipt.event_id.encode() + self._answer_tails[kind.name]
        return 200, [(b"content-length", b"%d" % len(body)), ANSWER_CONTENT_TYPE], body

    def _wrong_method(self, scope: Scope) -> Problem:
        allowed = ", ".join(sorted(self.methods))
        return Problem(
            405,
            "method-not-allowed",
            "Method Not Allowed",
            f"{scope['method']} is not accepted at {scope['path']} (only {allowed}).",
            headers={"Allow": allowed},
        )

    def _dispatch(self, data: Any) -> Kind:
        if isinstance(data, dict):
            for kind in self.kinds:
                if kind.matches(data):
                    return kind
        return self.kinds[-1]

    async def _quarantine(
        self,
        scope: Scope,
        kind: Kind | None,
        problem: Problem,
        errors: list[dict[str, Any]],
        raw: bytes,
        content_type: str | None,
        remote_addr: str | None,
    ) -> None:
        self.counters.rejected.labels(source=self.source_name, status=str(problem.status)).inc()
        await self.writer().quarantine(
            Rejection(
                source=self.source_name,
                path=URL(scope=scope).path,
                kind=kind.name if kind else None,
                status=problem.status,
                reason=problem.detail,
                errors=errors,
                raw_body=raw,
                content_type=content_type,
                remote_addr=remote_addr,
            )
        )


def store_problem(refused: StoreUnavailable) -> Problem:
    """The 503 of a callback (or readiness check) that the store cannot take now."""
    if isinstance(refused, StoreFull):
        slug, detail = "store-full", "The event store is full; retry later."
    else:
        slug, detail = "store-unavailable", "The event store is unavailable; retry later."
    return Problem(
        503, slug, "Service Unavailable", detail, headers={"Retry-After": RETRY_AFTER_SECONDS}
    )


def _forwarded_for(raw_headers: list[tuple[bytes, bytes]]) -> str | None:
    """Every X-Forwarded-For line, joined in order into one list (RFC 9110 5.3): a proxy may
    append a line of its own rather than extend the caller's."""
    lines = [value for name, value in raw_headers if name == b"x-forwarded-for"]
    if not lines:
        return None
    return b",".join(lines).decode("latin-1")


@functools.lru_cache(maxsize=CACHE_SIZE)
def _caller(
    peer: str | None, forwarded_for: str | None, trusted_proxies: Sequence[Network]
) -> tuple[IPAddress | None, str | None]:
    """The caller's address and its text (callers are few, so this is cached)."""
    address = client_address(peer, forwarded_for, trusted_proxies)
    return address, str(address) if address is not None else None


@functools.lru_cache(maxsize=CACHE_SIZE)
def _post_query(query_string: bytes) -> QueryParams:
    """The parsed query of a POST: the callbacks of one source all carry the same (the token),
    so it is cached. A GET's query is its payload, never cached."""
    return QueryParams(query_string)


async def send_answer(send: Send, answer: Answer) -> None:
    """Send an answer as one ASGI response."""
    status, headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _answer_of(response: Response) -> Answer:
    return response.status_code, response.raw_headers, bytes(response.body)


def _field_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {
            "field": ".".join(str(part) for part in error["loc"]) or "(body)",
            "message": error["msg"],
        }
        for error in exc.errors(include_url=False, include_input=False)
    ]
