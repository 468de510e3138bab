"""The OpenAPI 3.1 document of the receivers, generated from the kind registry and the models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic.json_schema import models_json_schema

from receivers.config import ReceiverConfig, source_prefix
from receivers.kinds import KINDS, KINDS_BY_NAME, Kind, kinds_by_path
from receivers.sources import SourceConfig

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
ERROR_ANSWERS = {
    "400": "The body is not JSON (or not UTF-8); it was quarantined.",
    "401": "Missing or wrong credentials, bad or stale signature.",
    "403": "The caller's address is not allowed.",
    "413": "The body is over the size limit.",
    "422": "The JSON does not fit the kind's model; it was quarantined.",
    "503": "The store is unavailable or full; retry after Retry-After seconds.",
}


def openapi_document(config: ReceiverConfig, version: str = "0.1.0") -> dict[str, Any]:
    """Every receiver of every source, with its payload schemas and problem answers."""
    _, schemas = models_json_schema(
        [(kind.model, "validation") for kind in KINDS],
        ref_template="#/components/schemas/{model}",
    )
    components: dict[str, Any] = dict(schemas.get("$defs", {}))
    components["Problem"] = _problem_schema()
    components["Accepted"] = {
        "type": "object",
        "required": ["id", "kind", "status"],
        "properties": {
            "id": {"type": "string", "description": "The stored event's id (same for duplicates)"},
            "kind": {"type": "string", "enum": list(KINDS_BY_NAME)},
            "status": {"type": "string", "const": "accepted"},
        },
    }
    paths: dict[str, Any] = {}
    for source_name, source in config.sources.items():
        for path, kinds in kinds_by_path().items():
            paths[source_prefix(source_name) + path] = _path_item(
                source_name, source, path, kinds, components
            )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "callback-relay receivers",
            "version": version,
            "description": "Where the platform sends its callbacks. Every answer other than "
            "200 is RFC 7807 application/problem+json.",
        },
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": _security_schemes()},
    }


def _path_item(
    source_name: str,
    source: SourceConfig,
    path: str,
    kinds: list[Kind],
    components: Mapping[str, Any],
) -> dict[str, Any]:
    body_schema = _body_schema(kinds)
    item: dict[str, Any] = {}
    methods = sorted({method for kind in kinds for method in kind.methods})
    for method in methods:
        slug = path.strip("/").replace("/", "_").replace("-", "_")
        operation: dict[str, Any] = {
            "operationId": f"{source_name}_{slug}_{method.lower()}",
            "summary": ", ".join(dict.fromkeys(kind.name for kind in kinds)) + f" ({source_name})",
            "parameters": _auth_parameters(source),
            "responses": _responses(),
        }
        if source.basic_auth:
            operation["security"] = [{"basic": []}]
        if method == "GET":
            get_kinds = [kind for kind in kinds if "GET" in kind.methods]
            operation["parameters"] = operation["parameters"] + _query_parameters(
                get_kinds, components
            )
        else:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body_schema}},
            }
        item[method.lower()] = operation
    return item


def _body_schema(kinds: list[Kind]) -> dict[str, Any]:
    refs = [{"$ref": f"#/components/schemas/{kind.model.__name__}"} for kind in kinds]
    return refs[0] if len(refs) == 1 else {"oneOf": refs}


def _auth_parameters(source: SourceConfig) -> list[dict[str, Any]]:
    parameters: list[dict[str, Any]] = []
    if source.token:
        parameters.append(
            {"name": "token", "in": "query", "required": True, "schema": {"type": "string"}}
        )
    if source.header is not None:
        parameters.append(
            {
                "name": source.header.name,
                "in": "header",
                "required": True,
                "schema": {"type": "string"},
            }
        )
    if source.signature_secret:
        for name in ("x-signature", "x-request-timestamp"):
            parameters.append(
                {"name": name, "in": "header", "required": True, "schema": {"type": "string"}}
            )
        parameters.append(
            {
                "name": "x-signature-version",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "const": "V1.0"},
            }
        )
    return parameters


def _query_parameters(kinds: list[Kind], components: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The query parameters of the GET shapes at one path (of each shape, when there are more:
    a parameter is required only when every shape requires it)."""
    schemas = [components.get(kind.model.__name__, {}) for kind in kinds]
    required = set.intersection(*(set(schema.get("required", [])) for schema in schemas))
    properties: dict[str, Any] = {}
    for schema in reversed(schemas):  # the canonical shape (the last row) first
        for name, prop in schema.get("properties", {}).items():
            properties.setdefault(name, prop)
    parameters = []
    for name, prop in properties.items():
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": name in required,
                "schema": {"type": "string"},
                "description": "JSON-encoded list" if _is_list(prop) else prop.get("title", name),
            }
        )
    return parameters


def _is_list(prop: Mapping[str, Any]) -> bool:
    options = prop.get("anyOf", [prop])
    return any(option.get("type") == "array" for option in options)


def _responses() -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {
            "description": "Stored (or a duplicate of a stored event: the same answer).",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Accepted"}}},
        }
    }
    for status, description in ERROR_ANSWERS.items():
        responses[status] = {
            "description": description,
            "content": {"application/problem+json": {"schema": PROBLEM_REF}},
        }
    return responses


def _problem_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string", "format": "uri"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                },
            },
        },
    }


def _security_schemes() -> dict[str, Any]:
    return {
        "token": {"type": "apiKey", "in": "query", "name": "token"},
        "basic": {"type": "http", "scheme": "basic"},
    }
