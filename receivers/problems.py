"""RFC 7807 ``application/problem+json`` answers."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "urn:callback-relay:problem:"


class Problem(Exception):
    """An error answered as problem+json; raise it anywhere under a receiver route."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The problem document."""
        return {
            "type": PROBLEM_TYPE_BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }

    def response(self, instance: str | None = None) -> Response:
        """The HTTP answer for this problem."""
        document = self.body()
        if instance is not None:
            document["instance"] = instance
        return Response(
            json.dumps(document, ensure_ascii=False).encode(),
            status_code=self.status,
            media_type=PROBLEM_MEDIA_TYPE,
            headers=self.headers,
        )


def not_found(path: str) -> Problem:
    """The answer at a path where nothing is served."""
    return Problem(404, "not-found", "Not Found", f"No receiver at {path}.")
