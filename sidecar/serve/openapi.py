"""The OpenAPI 3.1 document of the native API (`GET /v1/openapi.json`). Imports `sidecar.stores`,
`sidecar.formats`, `managed_store` and `sidecar.serve.api_bodies`; exports `openapi_document`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel

from managed_store import MAX_PATTERN_CHARS
from sidecar.formats import FORMATS
from sidecar.serve.api_bodies import CallBody, ReplyBody, SnapshotBody, error_schema
from sidecar.stores.event_log import EVENT_NAMES

_REF = "#/components/schemas/{model}"
_OBJECT: dict[str, Any] = {"type": "object"}


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": _REF.format(model=model.__name__)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _html(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"text/html": {"schema": {"type": "string"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    names = {400: "Bad request", 401: "Missing or wrong bearer token",
             403: "Host or Origin refused, or the token does not reach the profile",
             404: "Not found", 409: "Conflict", 502: "The upstream server answered an error",
             504: "The upstream server did not answer in time",
             405: "Method not allowed", 413: "Body too large", 422: "Invalid body",
             503: "The fleet database is unavailable (`unavailable`): the message names it "
                  "and what could not be done; retry once it is back (a call: with the same "
                  "call id)"}
    ref = {"$ref": "#/components/schemas/Error"}
    return {str(c): _json(ref, names[c]) for c in (401, 403, *codes)}


def _param(name: str, where: str, schema: dict[str, Any], required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path", "schema": schema}


_USER_GRANT = {**_param("user", "query", {"type": "string"}), "description": (
    "a server with oauth.per_user: this user's own grant (a signed-in user of the role user "
    "always gets their own)")}

# Each event of /v1/events (OpenAPI 3.1: a text/event-stream `schema` describes one event).
_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": [*EVENT_NAMES, "stream.reset"]},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
    },
}


@cache
def openapi_document() -> dict[str, Any]:
    components: dict[str, Any] = {"Error": dict(error_schema())}
    snapshot = _schema(SnapshotBody, components)
    call = _schema(CallBody, components)
    reply = _schema(ReplyBody, components)
    fmt = _param("format", "query", {"type": "string", "enum": list(FORMATS)})
    outcome = {"type": "object", "required": ["call_id", "tool", "status"]}
    paths: dict[str, Any] = {
        "/v1/tools": {"get": {
            "summary": "Effective tool definitions in a provider format",
            "parameters": [fmt, _param("profile", "query", {"type": "string"})],
            "responses": {"200": _json(_OBJECT, "Definitions"), **_errors(400, 404)},
        }},
        "/v1/tools/{name}/approve": {"post": {
            "summary": "Accept a tool's changed upstream definition (pinning): the new "
                       "definition becomes the pin and the tool is served as it is now",
            "parameters": [_param("name", "path", {"type": "string"})],
            "responses": {"200": _json(_OBJECT, "The approved change"), **_errors(404, 503)},
        }},
        "/v1/snapshots": {"post": {
            "summary": "Capture the tools for one model request (through a profile: "
                       "`profile`, default the default profile)",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": snapshot}}},
            "responses": {"201": _json(_OBJECT, "Snapshot id, profile, definitions, "
                                                "tool_choice"),
                          **_errors(400, 404, 413, 422, 503)},
        }},
        "/v1/snapshots/{snapshot_id}/calls": {"post": {
            "summary": "Execute one call against a snapshot (idempotent per call_id); "
                       "`Prefer: respond-async` returns 202 at once",
            "parameters": [_param("snapshot_id", "path", {"type": "string"}),
                           _param("prefer", "header", {"type": "string"})],
            "requestBody": {"required": True, "content": {"application/json": {"schema": call}}},
            "responses": {"200": _json(outcome, "The outcome"),
                          "202": _json(_OBJECT, "Started"),
                          **_errors(400, 404, 409, 413, 422, 503)},
        }},
        "/v1/calls": {"get": {
            "summary": "The call history, newest first: every settled or replayed call",
            "parameters": [
                *(_param(name, "query", {"type": "string", "maxLength": 512})
                  for name in ("tool", "server", "status", "session", "agent", "profile",
                               "user")),
                *(_param(name, "query", {"type": "number", "minimum": 0, "maximum": 1e11,
                                         "description": "epoch seconds; an ISO 8601 date or "
                                         "time (UTC unless it has an offset) is read too"})
                  for name in ("since", "until")),
                _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000}),
                _param("cursor", "query", {"type": "string", "pattern": "^c[0-9]{1,18}$"}),
                _param("format", "query", {"type": "string", "enum": ["json", "jsonl"]}),
            ],
            "responses": {"200": {"description": "`{calls, next_cursor}`, or JSON Lines",
                                  "content": {"application/json": {"schema": _OBJECT},
                                              "application/x-ndjson": {"schema": {
                                                  "type": "string"}}}},
                          **_errors(400, 503)},
        }},
        "/v1/calls/{call_id}": {
            "get": {
                "summary": "A call's durable outcome, or its in-flight state",
                "parameters": [_param("call_id", "path", {"type": "string"}), fmt],
                "responses": {"200": _json(_OBJECT, "Outcome or running state"),
                              **_errors(400, 404, 503)},
            },
            "delete": {
                "summary": "Cancel an in-flight call (in a fleet, on whichever replica runs "
                           "it; 409 `running_elsewhere` when that replica cannot be reached)",
                "parameters": [_param("call_id", "path", {"type": "string"})],
                "responses": {"202": _json(_OBJECT, "Cancelling (`replica`: the replica that "
                                                    "ran it, when another one)"),
                              **_errors(404, 409, 503)},
            },
        },
        "/v1/managed/{ref}": {"get": {
            "summary": "Read retained text by lines, inside one line by characters "
                       "(offset = the line, start/length), or grep it",
            "parameters": [
                _param("ref", "path", {"type": "string", "pattern": "^m_[0-9a-z]{26}$"}),
                _param("offset", "query",
                       {"type": "integer", "minimum": 1, "maximum": 2**62}),
                _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 10_000}),
                _param("pattern", "query", {"type": "string", "format": "regex",
                                            "maxLength": MAX_PATTERN_CHARS,
                                            "description": "RE2 syntax, matched per line"}),
                _param("context", "query", {"type": "integer", "minimum": 0, "maximum": 50}),
                _param("start", "query", {"type": "integer", "minimum": 0, "maximum": 2**62,
                                          "description": "0-based character in line offset"}),
                _param("length", "query",
                       {"type": "integer", "minimum": 1, "maximum": 1_000_000,
                        "description": "characters to read from start (default 20000)"}),
            ],
            "responses": {"200": _json(_OBJECT, "Text or matches"),
                          **_errors(400, 404, 422, 503)},
        }},
        "/v1/events": {"get": {
            "summary": "Server-Sent Events: registry changes, progress, permission asks, "
                       "server health; resume with Last-Event-ID",
            "parameters": [
                _param("last-event-id", "header", {"type": "string", "pattern": "^[0-9]{1,18}$"})
            ],
            "responses": {"200": {"description": "text/event-stream; the schema describes each "
                                                 "event",
                                  "content": {"text/event-stream": {"schema": _SSE_EVENT}}},
                          **_errors(400)},
        }},
        "/v1/permissions": {"get": {
            "summary": "Pending permission requests",
            "parameters": [_param("session_id", "query", {"type": "string"})],
            "responses": {"200": _json(_OBJECT, "Pending requests"), **_errors(503)},
        }},
        "/v1/permissions/{ask_id}/reply": {"post": {
            "summary": "Answer a permission request: once, always or reject (with feedback)",
            "parameters": [_param("ask_id", "path", {"type": "string"})],
            "requestBody": {"required": True, "content": {"application/json": {"schema": reply}}},
            "responses": {"200": _json(_OBJECT, "Answered"), **_errors(400, 404, 413, 422, 503)},
        }},
        "/v1/health": {"get": {
            "summary": "Per-server health, plugins, manifest problems, store usage; 503 when "
                       "the fleet database does not answer (readiness), unless "
                       "probe=liveness",
            "parameters": [_param("probe", "query", {
                "type": "string", "enum": ["readiness", "liveness"],
                "description": "liveness: 200 whenever the process answers"})],
            "responses": {"200": _json(_OBJECT, "Health report"),
                          "503": _json(_OBJECT, "Health report: `status` unavailable (the "
                                                "fleet database does not answer)"),
                          **_errors(400)},
        }},
        "/v1/auth/{server}": {"get": {
            "summary": "A server's OAuth authorization (authorized, expiry, scopes, needs "
                       "login, the command to run) and the state of its newest login "
                       "(`login`; with a public URL, also one another replica started)",
            "parameters": [_param("server", "path", {"type": "string"}, required=True),
                           _USER_GRANT],
            "responses": {"200": _json(_OBJECT, "Authorization state"),
                          **_errors(400, 403, 404, 503)},
        }},
        "/v1/auth/{server}/login": {"post": {
            "summary": "Start an OAuth login in the daemon: 202 with `authorization_url` to "
                       "open in a browser (the redirect comes back to the daemon's loopback "
                       "callback, so a browser on its machine; with `SIDECAR_PUBLIC_URL` to "
                       "`/v1/auth/{server}/callback` on any replica), or 200 with the result "
                       "when the grant needs no browser",
            "parameters": [_param("server", "path", {"type": "string"}, required=True),
                           _USER_GRANT],
            "responses": {"200": _json(_OBJECT, "Login finished"),
                          "202": _json(_OBJECT, "Login waiting for the browser"),
                          **_errors(400, 403, 404, 503)},
        }},
        "/v1/auth/{server}/callback": {"get": {
            "summary": "The browser's OAuth redirect when the daemon has a public URL "
                       "(`SIDECAR_PUBLIC_URL`): finishes a login started on any replica. No "
                       "bearer token: the login's single-use `state` authorizes it. Answers a "
                       "small HTML page; the `Sidecar-Login` header names the result "
                       "(`authorized`, `missing_state`, `unknown_state`, `expired_state`, "
                       "`used_state`, `authorization_refused`, `missing_code`, "
                       "`exchange_failed`, `not_configured`, ...)",
            "security": [],
            "parameters": [_param("server", "path", {"type": "string"}, required=True),
                           *(_param(name, "query", {"type": "string"}) for name in (
                               "state", "code", "iss", "error", "error_description"))],
            "responses": {str(status): _html(text) for status, text in (
                (200, "Authorized: the tokens are stored"),
                (400, "The state is missing, unknown, expired or already used, or the "
                      "authorization server answered `error`"),
                (404, "No public URL configured, or no such server"),
                (502, "The token endpoint refused the code or did not answer"),
                (503, "The grant store cannot be used (SIDECAR_GRANT_KEY)"))},
        }},
        **_upstream_paths(),
        "/v1/openapi.json": {"get": {
            "summary": "This document",
            "responses": {"200": _json(_OBJECT, "OpenAPI 3.1"), **_errors()},
        }},
        "/metrics": {"get": {
            "summary": "Prometheus metrics",
            "responses": {"200": {"description": "Prometheus text format", "content": {
                "text/plain": {"schema": {"type": "string"}}}}, **_errors()},
        }},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "mcp-sidecar native API", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _upstream_paths() -> dict[str, Any]:
    """The upstream servers' restarts, stderr, resources and prompts
    (`sidecar.serve.upstream_api`)."""
    server = _param("name", "path", {"type": "string"}, required=True)
    profile = _param("profile", "query", {"type": "string"})
    text_event = {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"type": "string", "enum": ["stderr", "gone"]},
        "data": {"type": "string", "contentMediaType": "application/json"}}}
    return {
        "/v1/servers/{name}/restart": {"post": {
            "summary": "Restart an MCP server (its process or connection, keeping its place "
                       "in the registry); answers its health once the new attempt settled "
                       "(or after its timeouts.startup). All-access token only",
            "parameters": [server],
            "responses": {"200": _json(_OBJECT, "`{server, health}`"), **_errors(404)},
        }},
        "/v1/servers/{name}/stderr": {"get": {
            "summary": "What a stdio server wrote to stderr (the last 64 KiB, secrets "
                       "redacted) after the mark `after`: `{server, mark, text}`; with "
                       "follow=true an event stream of `stderr` events (`{mark, text}`), "
                       "the kept text first. All-access token only",
            "parameters": [server, _param("after", "query", {
                "type": "integer", "minimum": 0, "maximum": 10**18 - 1}),
                           _param("follow", "query", {"type": "boolean"})],
            "responses": {"200": {"description": "`{server, mark, text}`, or the stream",
                                  "content": {"application/json": {"schema": _OBJECT},
                                              "text/event-stream": {"schema": text_event}}},
                          **_errors(400, 404)},
        }},
        "/v1/resources": {"get": {
            "summary": "The resources and URI templates of every ready server a profile "
                       "passes, each with its `server`; URIs as /mcp clients see them",
            "parameters": [profile],
            "responses": {"200": _json(_OBJECT, "`{resources, templates}`"),
                          **_errors(404, 502, 504)},
        }},
        "/v1/resources/read": {"get": {
            "summary": "Read one resource: `{server, uri, contents}`, each content with "
                       "`text` or `blob` (base64) and `mime_type`",
            "parameters": [_param("uri", "query", {"type": "string", "minLength": 1},
                                  required=True), profile],
            "responses": {"200": _json(_OBJECT, "The resource"), **_errors(400, 404, 502, 504)},
        }},
        "/v1/prompts": {"get": {
            "summary": "The prompts of every ready server a profile passes, with their "
                       "arguments and `server`",
            "parameters": [profile],
            "responses": {"200": _json(_OBJECT, "`{prompts}`"), **_errors(404, 502, 504)},
        }},
        "/v1/prompts/get": {"post": {
            "summary": "Get one prompt with its arguments: `{server, name, description, "
                       "messages}`",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1}, "profile": {"type": "string"},
                    "arguments": {"type": "object",
                                  "additionalProperties": {"type": "string"}}}}}}},
            "responses": {"200": _json(_OBJECT, "The prompt's messages"),
                          **_errors(400, 404, 413, 422, 502, 504)},
        }},
    }
