"""The parts the OpenAPI document of ``kapok.server.routes.openapi`` is made of.

The schemas that recur (an error, KapokMQ's envelope, a list of message codes, a name),
a route's parameters and request bodies, and an operation of each kind of route: a
WebSocket's upgrade, a call of KapokMQ's console, a page of the console, its JSON and its
actions.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CODES",
    "COMPAT_ANSWER",
    "OBJ",
    "answer",
    "compat_console",
    "console_action",
    "console_api",
    "console_page",
    "errors",
    "form_body",
    "in_path",
    "json_body",
    "op",
    "query",
    "upgrade",
]

OBJ: dict[str, Any] = {"type": "object"}
_ERROR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
}
COMPAT_ANSWER = {
    "type": "object",
    "required": ["code", "msg"],
    "properties": {"code": {"type": "integer"}, "msg": {}},
}
CODES = {"type": "array", "items": {"type": "string"}, "maxItems": 10_000}
_NAME = {"type": "string", "minLength": 1, "maxLength": 255}


def answer(schema: dict[str, Any], text: str = "OK") -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


def errors(*statuses: int) -> dict[str, Any]:
    return {str(s): answer(_ERROR, "An error: its machine code and a readable message") for s in statuses}


def form_body(*names: str, required: bool = True) -> dict[str, Any]:
    """A urlencoded form of string fields (KapokMQ's routes, the console's login)."""
    schema = {"type": "object", "properties": {name: {"type": "string"} for name in names}}
    return {"required": required, "content": {"application/x-www-form-urlencoded": {"schema": schema}}}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def in_path(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema or _NAME}


def query(name: str, schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": text}


def op(summary: str, tag: str, responses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"summary": summary, "tags": [tag], "responses": responses, **extra}


def upgrade(summary: str, tag: str, params: list[dict[str, Any]], security: list[Any]) -> dict[str, Any]:
    return op(
        summary + " (WebSocket: this GET upgrades; frames in docs/protocol.md)",
        tag,
        {"101": {"description": "Switching Protocols"}, **errors(400, 401, 429, 503)},
        parameters=params,
        security=security,
    )


def compat_console(summary: str, *fields: str) -> dict[str, Any]:
    return op(
        summary,
        "kapokmq-console",
        {"200": answer(COMPAT_ANSWER, "KapokMQ's envelope")},
        security=[{"secretKey": []}],
        requestBody=form_body(*fields, required=False),
    )


def console_page(summary: str, params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return op(
        summary,
        "console",
        {"200": {"description": "The page (HTML)"}, "302": {"description": "To the login page"}},
        security=[{"console": []}],
        parameters=params or [],
    )


def console_api(summary: str, params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return op(
        summary,
        "console",
        {"200": answer(OBJ), **errors(400, 401, 404)},
        security=[{"console": []}],
        parameters=params or [],
    )


def console_action(summary: str) -> dict[str, Any]:
    return op(
        summary,
        "console",
        {"303": {"description": "Done; to the page that shows it"}, **errors(401, 403, 404)},
        security=[{"console": []}],
        parameters=[in_path("code")],
    )
