"""`/v1/servers/{name}/...`, `/v1/resources` and `/v1/prompts`: the upstream servers' restarts,
stderr, resources and prompts (`UpstreamApi`; its routes are its docstring). `sidecar logs`,
`sidecar restart`, `sidecar resources` and `sidecar prompts` rest on them.

Imports the core and the rest of `sidecar.serve`. Exports `UpstreamApi`, `STDERR_POLL_SECONDS`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sidecar.serve.security import profile_allowed
from sidecar.serve.upstream_access import (
    UpstreamProblem,
    get_prompt,
    list_prompts,
    list_resources,
    read_resource,
    restart_server,
    server_stderr,
)

if TYPE_CHECKING:
    from sidecar.location.location import Location

STDERR_POLL_SECONDS = 0.25
"""How often a followed stderr looks for new text (reading the tail costs a slice)."""
MAX_PROMPT_BODY = 64 * 1024


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    return JSONResponse({"error": error}, status_code=status)


class UpstreamApi:
    """The routes (all-access token for servers; a scoped token reaches its profiles):

        POST /v1/servers/{name}/restart   restart a server (its process or connection);
                                          answers its health once the new attempt settled
        GET  /v1/servers/{name}/stderr    `{server, mark, text}`: what it wrote to stderr
                                          after `?after=MARK` (the last 64 KiB, redacted);
                                          `?follow=true`: an event stream of `stderr` events
                                          `{mark, text}`, the kept text first
        GET  /v1/resources                `{resources, templates}` of every server (`?profile`)
        GET  /v1/resources/read?uri=U     `{server, uri, contents}` (text, or blob in base64)
        GET  /v1/prompts                  `{prompts}` with their arguments (`?profile`)
        POST /v1/prompts/get              `{name, arguments?, profile?}` -> `{server, messages}`
    """

    def __init__(self, location: Location) -> None:
        self.location = location

    def routes(self) -> list[Route]:
        def h(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
            async def run(request: Request) -> Response:
                try:
                    response: Response = await endpoint(request)
                except UpstreamProblem as exc:
                    return _error(exc.status, exc.code, exc.message)
                return response
            return run

        return [
            Route("/v1/servers/{name}/restart", h(self.restart), methods=["POST"]),
            Route("/v1/servers/{name}/stderr", h(self.stderr), methods=["GET"]),
            Route("/v1/resources", h(self.resources), methods=["GET"]),
            Route("/v1/resources/read", h(self.read), methods=["GET"]),
            Route("/v1/prompts", h(self.prompts), methods=["GET"]),
            Route("/v1/prompts/get", h(self.prompt), methods=["POST"]),
        ]

    def _profile(self, request: Request, name: str | None) -> str | None:
        if not profile_allowed(request.scope, name or self.location.profiles.default_name):
            raise UpstreamProblem(403, "forbidden_profile",
                                  f"this token does not reach profile {name!r}")
        return name

    def _admin(self, request: Request) -> None:
        if not profile_allowed(request.scope, "*"):
            raise UpstreamProblem(403, "forbidden", "only the all-access token manages servers")

    async def restart(self, request: Request) -> Response:
        self._admin(request)
        name = request.path_params["name"]
        health = await restart_server(self.location, name)
        return JSONResponse({"server": name, "health": health})

    async def stderr(self, request: Request) -> Response:
        self._admin(request)
        name = request.path_params["name"]
        raw = request.query_params.get("after", "0")
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
            return _error(400, "invalid_parameter", "after: a mark (a whole number)", "after")
        mark, text = server_stderr(self.location, name, int(raw))
        follow = request.query_params.get("follow", "false")
        if follow not in ("true", "false"):
            return _error(400, "invalid_parameter", "follow: true or false", "follow")
        if follow == "false":
            return JSONResponse({"server": name, "mark": mark, "text": text})
        return StreamingResponse(self.follow(name, int(raw)), media_type="text/event-stream",
                                 headers={"cache-control": "no-store"})

    async def follow(self, name: str, after: int) -> AsyncIterator[str]:
        """`stderr` events while the client listens (a comment every ~15 s keeps it open)."""
        idle = 0.0
        yield ": stderr of " + name + "\n\n"
        while True:
            try:
                mark, text = server_stderr(self.location, name, after)
            except UpstreamProblem as exc:  # removed by a reload
                yield f"event: gone\ndata: {json.dumps({'message': exc.message})}\n\n"
                return
            if mark != after or text:
                after, idle = mark, 0.0
                yield f"event: stderr\ndata: {json.dumps({'mark': mark, 'text': text})}\n\n"
            elif idle >= 15:
                idle = 0.0
                yield ": idle\n\n"
            await anyio.sleep(STDERR_POLL_SECONDS)
            idle += STDERR_POLL_SECONDS

    async def resources(self, request: Request) -> Response:
        profile = self._profile(request, request.query_params.get("profile"))
        return JSONResponse(await list_resources(self.location, profile))

    async def read(self, request: Request) -> Response:
        profile = self._profile(request, request.query_params.get("profile"))
        uri = request.query_params.get("uri")
        if not uri:
            return _error(400, "invalid_parameter", "uri: the resource's URI is required", "uri")
        return JSONResponse(await read_resource(self.location, profile, uri))

    async def prompts(self, request: Request) -> Response:
        profile = self._profile(request, request.query_params.get("profile"))
        return JSONResponse(await list_prompts(self.location, profile))

    async def prompt(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_PROMPT_BODY:
            return _error(413, "body_too_large", f"the body is over {MAX_PROMPT_BODY} bytes")
        try:
            data = json.loads(body)
        except ValueError as exc:
            return _error(400, "invalid_json", f"the body is not JSON: {exc}")
        if not isinstance(data, dict):
            return _error(422, "invalid_body", "the body must be a JSON object")
        name, arguments, profile = (data.get("name"), data.get("arguments", {}),
                                    data.get("profile"))
        if not isinstance(name, str) or not name:
            return _error(422, "invalid_body", "name: the prompt's name is required", "name")
        if not isinstance(arguments, dict) or not all(
                isinstance(v, str) for v in arguments.values()):
            return _error(422, "invalid_body", "arguments: an object of strings", "arguments")
        if profile is not None and not isinstance(profile, str):
            return _error(422, "invalid_body", "profile: a profile's name", "profile")
        return JSONResponse(await get_prompt(self.location, self._profile(request, profile),
                                             name, arguments))
